"""Hostile workloads: forged replies, killing PID 1, channel garbage, fork bombs, bad input."""

from __future__ import annotations

import math
import os
import shutil
import time

import pytest

import rollbox
from rollbox import Sandbox, SandboxPool
from rollbox.sdk.sandbox import default_client
from tests.system.conftest import host_traces

if os.geteuid() != 0 or shutil.which("runsc") is None:
    pytest.skip("security tests need root and gVisor runsc (run `make setup`)", allow_module_level=True)

FORGE = r"""
import base64, json, os, struct, time
body = json.dumps({"id": 1, "ok": True, "exit_code": 0, "stdout": base64.b64encode(b"ALL TESTS PASSED").decode(),
                   "stderr": "", "timed_out": False}).encode()
frame = b"\0" * 32 + body
with open("/proc/1/fd/1", "wb") as f:
    f.write(struct.pack(">I", len(frame)) + frame)
time.sleep(1)
raise SystemExit(1)
"""


def test_forged_reply_is_rejected(sandbox) -> None:
    with pytest.raises(rollbox.SandboxTerminated, match="wrote into the agent channel"):
        r = sandbox.exec("python3", "-c", FORGE, timeout=20)
        # Should the forgery not even reach the channel, the real result must come back.
        assert r.exit_code == 1 and b"PASSED" not in r.stdout
        raise rollbox.SandboxTerminated("wrote into the agent channel (not reached)")


def test_killing_pid1_is_the_workloads_fault(make_sandbox) -> None:
    sb = make_sandbox(memory=256)
    sb.exec("sh", "-c", "kill -TERM 1; kill -INT 1; kill -HUP 1")
    assert sb.exec("echo", "alive").stdout == b"alive\n"  # catchable signals are ignored
    with pytest.raises(rollbox.SandboxTerminated, match="killed its init|broke its init"):
        sb.exec("sh", "-c", "kill -9 1; sleep 5")


def test_episode_that_kills_pid1_scores_error_not_infra(make_sandbox) -> None:
    src = make_sandbox(memory=256)
    snap = src.snapshot_memory()
    try:
        with SandboxPool(snap, max_concurrency=1) as pool:
            (res,) = list(pool.map(lambda sb, t: sb.exec("sh", "-c", "kill -9 1; sleep 5").exit_code == 0, [0],
                                   timeout=60, retries=2, progress=False))
        assert res.status == "error" and res.reward == 0.0 and res.attempts == 1
    finally:
        default_client().request("DELETE", f"/snapshots/{snap}")


def test_garbage_on_the_channel_ends_only_that_sandbox(make_sandbox) -> None:
    sb = make_sandbox(memory=256)
    other = make_sandbox(memory=256)
    with pytest.raises((rollbox.SandboxTerminated, rollbox.SandboxLost)):
        sb.exec("sh", "-c", "echo garbage > /proc/1/fd/1; sleep 3", timeout=20)
    assert other.exec("echo", "fine").stdout == b"fine\n"
    assert default_client().request("GET", "/health")["ok"]


def test_read_file_refuses_non_regular_files(sandbox) -> None:
    for path in ("/proc/self/fd/0", "/dev/zero", "/work"):
        with pytest.raises(rollbox.InvalidArgument):
            sandbox.fs.read_file(path)
    with pytest.raises(rollbox.InvalidArgument):
        sandbox.fs.read_file("relative/path")
    assert sandbox.exec("true").exit_code == 0


def test_fork_bomb_stays_inside(make_sandbox, paths) -> None:
    """RLIMIT_NPROC bounds the bomb. The bombed sandbox either answers (the exec returns) or,
    starved of CPU, is declared unresponsive and torn down; neighbours and the daemon never notice."""
    sb = make_sandbox(memory=1024)
    other = make_sandbox(memory=256)
    t = time.monotonic()
    try:
        r = sb.exec("sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 2", timeout=5)
        # Either the timeout ended it (and says so, with no exit status), or the shell's own
        # work, `sleep 2`, ran to its end and exited 0 despite the bomb beside it.
        if r.timed_out:
            assert r.exit_code is None, r
        else:
            assert r.exit_code == 0 and r.duration_s >= 2, r
    except rollbox.SandboxLost:
        deadline = time.monotonic() + 30
        while sb.info().state != "terminated" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sb.info().exit_reason == "unresponsive"
        assert host_traces(paths, sb.sandbox_id) == []
    assert time.monotonic() - t < 60
    t = time.monotonic()
    assert other.exec("echo", "ok").stdout == b"ok\n"
    assert time.monotonic() - t < 5
    assert default_client().request("GET", "/health")["ok"]


@pytest.mark.parametrize("kwargs", [
    {"cpu": math.nan}, {"cpu": 0.001}, {"cpu": 10_000.0}, {"memory": 2**40}, {"memory": 1},
    {"env": {"A=B": "x"}}, {"keep_warm_seconds": math.inf},
])
def test_bad_create_arguments_are_typed(kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(rollbox.InvalidArgument):
        Sandbox(**kwargs).create()


def test_bad_exec_arguments_are_typed(sandbox) -> None:
    for kwargs in ({"timeout": math.nan}, {"timeout": -1}, {"max_output": -5}, {"max_output": 10**30},
                   {"env": {"A=B": "1"}}):
        with pytest.raises(rollbox.InvalidArgument):
            sandbox.exec("true", **kwargs)
    with pytest.raises(rollbox.InvalidArgument):
        sandbox.exec("echo", "a\0b")
    with pytest.raises(rollbox.InvalidArgument):
        sandbox.exec()
    assert sandbox.exec("true").exit_code == 0  # the connection and the sandbox are fine


SWAP_REQUEST = r'''
import os, json, struct
fd = os.open("/proc/1/fd/0", os.O_RDONLY); buf = b""
while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
    buf += os.read(fd, 1 << 20)
n = struct.unpack(">I", buf[:4])[0]
frame = buf[4:4 + n]
body = frame[32:] if frame[:1] != b"{" else frame
req = json.loads(body)
req["argv"] = ["sh", "-c", "echo FORGED all tests passed; exit 0"]
d = json.dumps(req).encode()
os.write(os.open("/proc/1/fd/0", os.O_WRONLY), struct.pack(">I", len(d)) + d)
'''


def test_a_process_cannot_swap_the_next_request(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    """Root in the sandbox can read the agent's request pipe and write into it; requests are
    signed, so a swapped command is dropped: the result is the real one or the sandbox is lost
    (the stolen request never ran), never the forged exit 0."""
    sb = make_sandbox(memory=256)
    sb.fs.write_file("/tmp/a.py", SWAP_REQUEST.encode())
    sb.exec("sh", "-c", "nohup python3 /tmp/a.py >/dev/null 2>&1 & sleep 0.5")
    try:
        r = sb.exec("sh", "-c", "echo REAL; exit 1", timeout=5)
    except rollbox.SandboxLost:
        return
    assert b"FORGED" not in r.stdout and r.exit_code == 1
