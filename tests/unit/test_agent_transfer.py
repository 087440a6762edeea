"""The agent side of streamed file transfer (server/file_routes.py), on both agents: an upload
in parts appears whole or not at all, a download reads ranges with no size limit."""

from __future__ import annotations

import base64
import os

import pytest


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def test_upload_parts_appear_only_when_the_last_lands(agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "sub" / "big.bin"
    parts = [os.urandom(1000), os.urandom(5), b""]
    for i, data in enumerate(parts[:2]):
        agent.request("write_file", path=str(path), upload="ab12", part=i, data=_b64(data), mode=0o640)
        assert not path.exists()  # not before the last part
    agent.request("write_file", path=str(path), upload="ab12", part=2, data=_b64(parts[2]), last=True, mode=0o640)
    assert path.read_bytes() == b"".join(parts)
    assert (path.stat().st_mode & 0o777) == 0o640
    assert not list(tmp_path.glob("sub/*.rollbox-upload-*"))


def test_aborted_upload_leaves_nothing(agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "f"
    path.write_bytes(b"old")
    agent.request("write_file", path=str(path), upload="cd34", part=0, data=_b64(b"new part"))
    agent.request("write_file", path=str(path), upload="cd34", abort=True)
    assert path.read_bytes() == b"old" and list(tmp_path.iterdir()) == [path]


def test_ranged_reads_have_no_size_limit(agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r"
    data = os.urandom(3000)
    path.write_bytes(data)
    got, offset = b"", 0
    while True:
        r = agent.request("read_file", path=str(path), offset=offset, length=1024, max_bytes=10)
        assert r["size"] == 3000
        chunk = base64.b64decode(r["data"])
        if not chunk:
            break
        got += chunk
        offset += len(chunk)
    assert got == data


def test_upload_token_must_be_plain(agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if agent.kind == "python":
        pytest.skip("agent.py takes the daemon's hex token as given; the native agent checks it")
    r = agent.request("write_file", path=str(tmp_path / "x"), upload="../../etc", part=0, data=_b64(b"x"))
    assert r["error"] == "invalid_argument" and "alphanumeric" in r["message"] and list(tmp_path.iterdir()) == []
