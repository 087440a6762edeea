"""Regression tests for agent defects found in review (missing cwd, reaped-pid bookkeeping)."""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
import textwrap
import time

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
    fifo = sys.argv[2]
    bg = threading.Thread(target=A.op_exec, args=({"id": 1, "argv": ["sh", "-c", "echo up > " + fifo + "; sleep 2"]},),
                          daemon=True)
    bg.start()
    with open(fifo) as f:  # the live exec runs
        assert f.read().strip() == "up"
    for i in range(20):
        assert A.op_exec({"id": 100 + i, "argv": ["/nonexistent/rollbox-cmd"]})["exit_code"] == 127
    # An orphaned background job: reparented to us (as to PID 1), reaped by the reaper.
    assert A.op_exec({"id": 200, "argv": ["sh", "-c", "sleep 0.1 &"]})["exit_code"] == 0
    def left():
        return len(getattr(A, "_early_exits", {})) + len(A._waiters) - (1 if bg.is_alive() else 0)
    deadline = time.monotonic() + 10  # until the reaper has had the orphan (a bound, not an order)
    while left() and time.monotonic() < deadline:
        time.sleep(0.01)
    print(left())
""")


def test_early_exits_do_not_accumulate(tmp_path):
    agent_dir = str(agent_module.__file__).rsplit("/", 1)[0]
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-S", "-c", _LEAK_SCRIPT, agent_dir, str(fifo)], capture_output=True,
                         text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == 0


# ---- both agents (the `agent` fixture runs agent.py and the native binary) --------------------


def test_remove_refuses_root_in_any_spelling(agent):
    for path in ("/", "//", "/.", "/tmp/..", "///"):
        r = agent.request("remove", path=path)
        assert r["ok"] is False, path
        assert r["error"] == "invalid_argument", path
    assert os.path.isdir("/tmp")


def test_bad_stdin_base64_is_invalid_argument(agent):
    r = agent.request("exec", argv=["true"], stdin="Z")
    assert r["ok"] is False
    assert r["error"] == "invalid_argument"
    assert agent.request("ping")["ok"] is True


def test_read_file_refuses_a_fifo(agent, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = agent.request("read_file", path=str(fifo), timeout=10)
    assert r["ok"] is False
    assert r["error"] == "invalid_argument"
    assert "not a regular file" in r["message"]


def test_relative_paths_are_invalid_arguments(agent):
    for op in ("read_file", "list_files", "remove"):
        r = agent.request(op, path="work/a.py")
        assert r["ok"] is False, op
        assert r["error"] == "invalid_argument", op


def test_non_utf8_names_round_trip(agent, tmp_path):
    # Python's json writes such bytes as lone surrogates (surrogateescape): both agents must.
    (tmp_path / os.fsdecode(b"f\xff")).write_bytes(b"raw")
    ls = agent.request("list_files", path=str(tmp_path))
    names = [e["name"] for e in ls["entries"]]
    assert names == ["f\udcff"]
    r = agent.request("read_file", path=ls["entries"][0]["path"])
    assert r["ok"] is True
    assert base64.b64decode(r["data"]) == b"raw"


def test_exec_as_another_user(agent):
    r = agent.exec_as(["id", "-u"], user="nobody")
    assert r["exit_code"] == 0, r
    assert base64.b64decode(r["stdout"]).strip() == b"65534"
    r = agent.exec_as(["id", "-u"], user="65534:65534")
    assert base64.b64decode(r["stdout"]).strip() == b"65534"
    r = agent.exec_as(["id", "-u"], user="rollbox-no-such-user")
    assert r["ok"] is False
    assert r["error"] == "invalid_argument"
    r = agent.exec_as(["/nonexistent/rollbox-cmd"], user="nobody")
    assert r["exit_code"] == 127


def test_spawn_starts_and_is_reaped(agent, tmp_path):
    log = tmp_path / "log"
    r = agent.request("spawn", argv=["sh", "-c", "echo spawned $ROLLBOX_EXEC_MARK"], log=str(log))
    assert r["ok"] is True
    assert isinstance(r["pid"], int)
    deadline = time.monotonic() + 10
    while not log.exists() or not log.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert log.read_bytes() == b"spawned\n"  # no exec mark: a spawned process outlives requests
    r = agent.request("spawn", argv=["rollbox-no-such-cmd-on-path"])
    assert r["ok"] is False
    assert r["error"] == "invalid_argument"


def test_oversized_frame_ends_the_agent(agent):
    agent.proc.stdin.write(struct.pack(">I", (1 << 30) + 1))
    agent.proc.stdin.flush()
    assert agent.proc.wait(timeout=10) == 3


# ---- the native agent only -------------------------------------------------------------------


def test_native_timeout_holds_when_the_command_closed_its_output(native):
    # No pipe is left to wait on, yet the deadline still kills the command.
    t0 = time.monotonic()
    r = native.exec(["sh", "-c", "exec >&- 2>&-; sleep 107.317"], timeout=1, wait=20)
    assert r["timed_out"] is True
    assert r["exit_code"] is None
    assert time.monotonic() - t0 < 10
    assert native.pids_with_cmdline(["sleep", "107.317"]) == []


def test_native_many_failed_and_orphaned_execs_leave_it_serving(native):
    for _ in range(20):
        assert native.exec(["/nonexistent/rollbox-cmd"])["exit_code"] == 127
    assert native.exec(["sh", "-c", "sleep 0.1 &"])["exit_code"] == 0
    rids = [native.send_exec(["true"]) for _ in range(30)]
    assert all(native.wait_reply(rid)["exit_code"] == 0 for rid in rids)


def test_native_reports_signal_and_duration_types(native):
    r = native.exec(["sh", "-c", "kill -TERM $$"])
    assert r["exit_code"] == 128 + 15 and r["signal"] == 15
    assert isinstance(r["duration_s"], float) and isinstance(r["agent_s"], float)
    p = native.request("ping")
    assert isinstance(p["time"], float)
