"""agent.py's background processes at the sandbox's process limit (gh-16): a start whose
reader thread cannot be made fails with resource_exhausted and leaves nothing running."""

from __future__ import annotations

import os
import time

import psutil
import pytest

import tests.unit.conftest as harness
from tests.unit.conftest import AgentProcess


@pytest.mark.parametrize("nproc", [7, 8])  # 7: no fork for the command; 8: no thread for its reader
def test_at_the_process_limit_a_start_fails_cleanly(monkeypatch: pytest.MonkeyPatch, nproc: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (to run the agent as a fresh uid: RLIMIT_NPROC is per user)")
    uid = 50000 + (os.getpid() + nproc) % 10000
    python = ["/usr/bin/python3", *harness.agent_command("python")[1:]]  # readable by any uid
    # Idle, agent.py is 7 tasks (main, reaper, 4 workers, the zygote launcher).
    monkeypatch.setattr(harness, "agent_command", lambda kind: [
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "prlimit", f"--nproc={nproc}:{nproc}", *python])
    a = AgentProcess("python")
    try:
        r = a.request("proc_start", argv=["sleep", "4243"], env={}, cwd="/tmp")
        assert (r["ok"], r["error"]) == (False, "resource_exhausted"), r
        assert "process limit" in r["message"]
        assert a.request("proc_list")["processes"] == []
        time.sleep(0.2)
        assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "4243"]]
        assert a.request("ping")["ok"] is True
    finally:
        a.close()
