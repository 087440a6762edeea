"""SDK edge cases against a stub daemon (httpx.MockTransport): a non-JSON 2xx, and a download
whose local write fails leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rollbox.client.transport import Client
from rollbox.config import Paths
from rollbox.errors import ApiError
from rollbox.sdk.sandbox import SandboxInstance


def _client(tmp_path: Path, handler) -> Client:  # type: ignore[no-untyped-def]
    c = Client(paths=Paths(tmp_path), autostart=False, transport=httpx.MockTransport(handler))
    c.aio._checked = True  # the stub is "up": no health probe, no autostart
    return c


def test_a_2xx_that_is_not_json_is_an_api_error(tmp_path: Path) -> None:
    c = _client(tmp_path, lambda req: httpx.Response(200, text="<html>proxy page</html>"))
    with pytest.raises(ApiError, match="not JSON"):
        c.request("GET", "/sandboxes")


def test_download_file_leaves_no_partial_file_when_the_write_fails(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(req: httpx.Request) -> httpx.Response:  # the streamed route answers raw bytes
        if req.url.path == "/health":
            return httpx.Response(200, json={"ok": True})
        assert req.url.path.endswith("/files/content")
        return httpx.Response(200, content=b"x" * 1000, headers={"x-rollbox-size": "1000"})
    c = _client(tmp_path, handler)
    sb = SandboxInstance("sb-" + "0" * 24, c)
    out = tmp_path / "dl" / "file.bin"
    out.parent.mkdir()
    assert sb.fs.download_file("/work/f", out) == 1000 and out.read_bytes() == b"x" * 1000

    def full_disk(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", full_disk)
    target = tmp_path / "dl" / "second.bin"
    with pytest.raises(OSError, match="No space"):
        sb.fs.download_file("/work/f", target)
    assert sorted(p.name for p in out.parent.iterdir()) == ["file.bin"]  # no .rollbox-partial, no target


def test_a_422_reads_as_one_line_per_field(tmp_path: Path) -> None:
    from rollbox.errors import InvalidArgument
    detail = [{"type": "float_parsing", "loc": ["body", "keep_warm_seconds"],
               "msg": "Input should be a valid number, unable to parse string as a number", "input": "ten"}]
    c = _client(tmp_path, lambda req: httpx.Response(422, json={"detail": detail}))
    with pytest.raises(InvalidArgument) as e:
        c.request("POST", "/sandboxes", json={})
    assert str(e.value) == ("invalid request to /sandboxes: keep_warm_seconds: Input should be a valid number, "
                            "unable to parse string as a number (got 'ten')")


def test_a_download_cut_short_of_its_size_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    # The file shrank or vanished while it was read: the daemon ends the answer early.
    from rollbox.errors import InvalidState

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/health":
            return httpx.Response(200, json={"ok": True})
        return httpx.Response(200, content=b"x" * 100, headers={"x-rollbox-size": "5000"})
    sb = SandboxInstance("sb-" + "0" * 24, _client(tmp_path, handler))
    with pytest.raises(InvalidState, match="changed while it was read"):
        sb.fs.download_file("/work/f", tmp_path / "out")
    with pytest.raises(InvalidState):
        sb.fs.read_file("/work/f")
    assert not list(tmp_path.glob("out*"))
