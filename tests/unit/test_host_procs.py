"""Host process scans (psutil): finding a container's runsc processes by command line, and
telling runsc's re-parented orphans (comm `exe`, zombies included) from the daemon's own spawns."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rollbox.runtime import reaper
from rollbox.runtime.runsc import _runsc_role, runsc_processes

CID = "a1b2c3d4" * 4
SLEEPER = "import sys; sys.stdin.read()"  # lives until its stdin closes


@pytest.fixture
def fake_runsc() -> Iterator[dict[str, int]]:
    """Two processes whose command lines look like runsc's sandbox and gofer of CID, and one
    of another container."""
    procs = {}
    for role, cid in (("sandbox", CID), ("gofer", CID), ("other", "f" * 32)):
        name = "runsc-sandbox" if role == "other" else f"runsc-{role}"
        procs[role] = subprocess.Popen([name, "-c", SLEEPER, "--root=/tmp/x", cid], executable=sys.executable,
                                       stdin=subprocess.PIPE)
    yield {k: p.pid for k, p in procs.items()}
    for p in procs.values():
        p.stdin.close()  # type: ignore[union-attr]
        p.wait(10)


def test_runsc_processes_of_one_container(fake_runsc: dict[str, int]) -> None:
    assert sorted(runsc_processes(CID)) == sorted([(fake_runsc["sandbox"], "sandbox"), (fake_runsc["gofer"], "gofer")])
    assert _runsc_role(fake_runsc["gofer"], CID) == "gofer"
    assert _runsc_role(fake_runsc["other"], CID) is None
    assert _runsc_role(os.getpid(), CID) is None
    assert _runsc_role(2**22 + 1, CID) is None  # above pid_max: no such process


def test_an_exited_exe_orphan_is_recognised_and_reaped() -> None:
    """runsc's processes are re-executions of /proc/self/exe (comm `exe`); once exited they
    are zombies whose comm must still be read, so the reaper reaps them."""
    code = "import ctypes; ctypes.CDLL(None).prctl(15, b'exe', 0, 0, 0)"  # PR_SET_NAME
    exe = subprocess.Popen([sys.executable, "-c", code])
    mine = subprocess.Popen([sys.executable, "-c", "pass"])
    for p in (exe, mine):  # both exited, neither reaped yet: zombies
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    try:
        assert reaper._comm_state(exe.pid) == (reaper.RUNSC_COMM, "Z")
        comm, state = reaper._comm_state(mine.pid)  # type: ignore[misc]
        assert comm != reaper.RUNSC_COMM and state == "Z"
        assert {exe.pid, mine.pid} <= reaper._children()
        assert reaper.Reaper().sweep() == 1
        assert exe.pid not in reaper._children() and mine.pid in reaper._children()
    finally:
        mine.wait(10)
        exe.returncode = 0  # reaped by the sweep; Popen must not wait for it again
