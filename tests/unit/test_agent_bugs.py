"""Regression tests for agent defects found in review (missing cwd, reaped-pid bookkeeping)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import rollbox.runtime.agent.agent as agent_module


def test_missing_cwd_is_not_reported_as_command_not_found(agent, tmp_path):
    missing = str(tmp_path / "missing-dir")
    r = agent.exec(["true"], cwd=missing)
    text = (r.get("message") or "") + r.get("stderr_raw", b"").decode(errors="replace")
    assert "command not found" not in text
    assert missing in text


# Runs agent.py's own reaper in a throwaway interpreter (never in pytest: it waits on pid -1).
# The process is made a child subreaper so orphans come back to it, as they do to PID 1 in gVisor.
_LEAK_SCRIPT = textwrap.dedent("""
    import ctypes, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import agent as A
    A.send = lambda msg: None
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    threading.Thread(target=A.reaper, daemon=True).start()
    # A live exec keeps the reaper inside waitpid(-1), racing Popen's own waitpid on failures.
    bg = threading.Thread(target=A.op_exec, args=({"id": 1, "argv": ["sleep", "2"]},), daemon=True)
    bg.start()
    time.sleep(0.2)
    for i in range(20):
        assert A.op_exec({"id": 100 + i, "argv": ["/nonexistent/rollbox-cmd"]})["exit_code"] == 127
    # An orphaned background job: reparented to us (as to PID 1), reaped by the reaper.
    assert A.op_exec({"id": 200, "argv": ["sh", "-c", "sleep 0.1 &"]})["exit_code"] == 0
    time.sleep(0.5)
    print(len(getattr(A, "_early_exits", {})) + len(A._waiters) - (1 if bg.is_alive() else 0))
""")


def test_early_exits_do_not_accumulate():
    agent_dir = str(agent_module.__file__).rsplit("/", 1)[0]
    out = subprocess.run([sys.executable, "-S", "-c", _LEAK_SCRIPT, agent_dir], capture_output=True,
                         text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == 0
