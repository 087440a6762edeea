"""Auto-pause (gh-19: idle sandboxes cost ~nothing): a sandbox idle past auto_pause_seconds is
paused to disk and resumed transparently by the next call; one that computes is not idle.
Real gVisor sandboxes; the watchdog runs every second."""

from __future__ import annotations

import time

import pytest

import rollbox
from tests.system.conftest import proc_cmdlines


def _state(sb: rollbox.SandboxInstance) -> str:
    return str(sb.info().state)


def _wait_state(sb: rollbox.SandboxInstance, want: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _state(sb) != want:
        assert time.monotonic() < deadline, f"{sb.sandbox_id} never became {want} (is {_state(sb)})"
        time.sleep(0.3)


def _runsc_processes(sandbox_id: str) -> int:
    cid = sandbox_id.removeprefix("sb-").encode()
    return sum(1 for _pid, argv in proc_cmdlines() if any(cid in a for a in argv))


def test_idle_sandbox_is_paused_and_the_next_call_resumes_it(make_sandbox) -> None:
    sb = make_sandbox(memory=256, auto_pause_seconds=2)
    sb.fs.write_file("/work/state.txt", b"kept")
    sb.exec("sh", "-c", "sleep 3600 >/dev/null 2>&1 &")  # a background process, sleeping
    assert _runsc_processes(sb.sandbox_id) > 0
    _wait_state(sb, "paused")
    deadline = time.monotonic() + 10
    while _runsc_processes(sb.sandbox_id) and time.monotonic() < deadline:
        time.sleep(0.2)  # its runsc processes exiting
    assert _runsc_processes(sb.sandbox_id) == 0  # nothing of it spins on the host
    r = sb.exec("cat", "/work/state.txt")  # resumes it, same id
    assert r.stdout == b"kept" and _state(sb) == "running"
    assert sb.exec("pgrep", "-x", "sleep").exit_code == 0  # its processes came back too
    _wait_state(sb, "paused")  # and it pauses again when idle again
    assert sb.fs.read_file("/work/state.txt") == b"kept"


def test_a_sandbox_that_computes_is_not_idle(make_sandbox) -> None:
    sb = make_sandbox(memory=256, auto_pause_seconds=1)
    sb.exec("sh", "-c", "(while :; do :; done) >/dev/null 2>&1 &")
    time.sleep(5)
    assert _state(sb) == "running"
    sb.exec("pkill", "-f", "while")
    _wait_state(sb, "paused")


def test_auto_paused_sandbox_still_ends_at_keep_warm(make_sandbox) -> None:
    sb = make_sandbox(memory=256, auto_pause_seconds=1, keep_warm_seconds=6)
    _wait_state(sb, "paused")
    _wait_state(sb, "terminated", timeout=30)
    with pytest.raises(rollbox.SandboxTerminated, match="keep_warm_expired"):
        sb.exec("true")


@pytest.mark.parametrize("bad", [0.5, -1.0])
def test_bad_auto_pause_values_are_refused_before_anything_starts(bad: float) -> None:
    n = len(rollbox.Sandbox.list()) if hasattr(rollbox.Sandbox, "list") else None
    with pytest.raises(rollbox.InvalidArgument, match="auto_pause_seconds"):
        rollbox.Sandbox(memory=256, auto_pause_seconds=bad).create()
    if n is not None:
        assert len(rollbox.Sandbox.list()) == n
