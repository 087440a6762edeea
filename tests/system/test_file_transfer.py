"""Streamed file transfer (gh-18): raw bodies, no base64 in JSON, no 64 MiB cap from buffering.
Real gVisor sandbox; the daemon's memory stays bounded while a large file passes through it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import psutil
import pytest

import rollbox
from rollbox.sdk.sandbox import default_client

BIG = 96 << 20  # over the old 64 MiB limit


def _daemon() -> psutil.Process:
    return psutil.Process(int(default_client().request("GET", "/health")["pid"]))


def test_upload_and_download_past_64_mib_stream_through(make_sandbox, tmp_path: Path) -> None:
    sb = make_sandbox(memory=512, disk=1024)
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(BIG >> 20):
            f.write(os.urandom(1 << 20))
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    rss0 = _daemon().memory_info().rss
    sb.fs.upload_file(src, "/work/big.bin", mode=0o600)
    r = sb.exec("sh", "-c", "sha256sum /work/big.bin | cut -d' ' -f1; stat -c %a /work/big.bin; ls -A /work")
    assert r.stdout.decode().split() == [digest, "600", "big.bin"]
    out = tmp_path / "back.bin"
    assert sb.fs.download_file("/work/big.bin", out) == BIG
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
    assert not list(tmp_path.glob("*.rollbox-partial"))
    # One 4 MiB part at a time (and its base64) in the daemon, not the whole file.
    assert _daemon().memory_info().rss - rss0 < 64 << 20


def test_streamed_errors_are_typed_and_leave_nothing(make_sandbox, tmp_path: Path) -> None:
    sb = make_sandbox(memory=256, disk=64)
    with pytest.raises(rollbox.FileNotFoundInSandbox):
        sb.fs.read_file("/no/such/file")
    with pytest.raises(rollbox.FileNotFoundInSandbox):
        sb.fs.download_file("/no/such/file", tmp_path / "x")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(rollbox.InvalidArgument, match="absolute"):
        sb.fs.write_file("relative/path", b"x")
    # A disk-full upload fails and leaves neither the file nor its temporary part.
    with pytest.raises(rollbox.RollboxError, match="(?i)no space"):
        sb.fs.write_file("/work/huge.bin", os.urandom(80 << 20))
    assert sb.exec("sh", "-c", "ls -A /work").stdout == b""
    sb.fs.write_file("/work/small", "ok")  # the sandbox is fine afterwards
    assert sb.fs.read_file("/work/small") == b"ok"


def test_non_utf8_names_still_round_trip(sandbox) -> None:
    name = "/tmp/caf\udce9"  # a Latin-1 byte: not valid UTF-8, travels as a surrogate escape
    sandbox.fs.write_file(name, b"bytes")
    assert sandbox.fs.read_file(name) == b"bytes"


def test_non_utf8_bytes_round_trip_through_every_agent_field(sandbox) -> None:
    # Bytes that are not UTF-8 travel as lone surrogates (os.fsdecode's surrogateescape) in
    # names, argv, env and cwd, both ways; the native agent's wire.rs must give them back exact.
    d = "/tmp/d\udcff"  # b"/tmp/d\xff"
    sandbox.fs.write_file(d + "/caf\udce9", b"x")
    entries = sandbox.fs.list_files(d)
    assert [(e.name, e.path) for e in entries] == [("caf\udce9", d + "/caf\udce9")]
    r = sandbox.exec("sh", "-c", 'printf %s "$1"; printf / ; printf %s "$V"; printf / ; pwd', "sh", "a\udc80b",
                     env={"V": "\udcfe\u00e9"}, cwd=d)
    assert r.stdout == b"a\x80b/\xfe\xc3\xa9//tmp/d\xff\n"
    # Background processes report their argv and cwd the same way.
    p = sandbox.process.exec("sleep", "30", cwd=d)
    try:
        info = next(i for i in sandbox.process.list_processes() if i.pid == p.pid)
        assert (info.argv, info.cwd) == (["sleep", "30"], d)
    finally:
        p.kill()
