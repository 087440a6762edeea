"""The agent's background-process ops (gh-16, /work/notes/proc-spec.md), driven over its pipe
protocol as a host subprocess (no gVisor). `AGENTS` lists the agents that implement them."""

from __future__ import annotations

import base64
import os
import signal
import time
from typing import Any

import pytest

from tests.unit.conftest import NATIVE_AGENT_PATH, AgentProcess

# Both agents implement these ops, to the same spec: every test runs on each.
AGENTS = ["python", "native"]


@pytest.fixture(params=AGENTS)
def ag(request):  # type: ignore[no-untyped-def]
    if request.param == "native" and not os.access(NATIVE_AGENT_PATH, os.X_OK):
        pytest.skip("the native agent is not built (`make agent` needs Debian's cargo: scripts/setup-host.sh)")
    a = AgentProcess(request.param)
    try:
        yield a
    finally:
        a.close()


def start(ag: AgentProcess, argv: list[str], **kw: Any) -> int:
    r = ag.wait_reply(ag.send("proc_start", argv=argv, env=kw.pop("env", {}), **kw), 15.0)
    assert r["ok"] is True, r
    assert isinstance(r["started_at"], float)
    return int(r["pid"])


def read_all(ag: AgentProcess, pid: int, limit: float = 15.0) -> tuple[bytes, bytes, dict[str, Any]]:
    """Reads both streams to eof, as a client would, with long polls."""
    out, err = b"", b""
    offs = {"stdout": 0, "stderr": 0}
    t_end = time.monotonic() + limit
    while True:
        r = ag.request("proc_read", pid=pid, offsets=offs, wait=2.0)
        assert r["ok"] is True, r
        for name in ("stdout", "stderr"):
            s = r[name]
            data = base64.b64decode(s["data"])
            if name == "stdout":
                out += data
            else:
                err += data
            offs[name] = s["offset"] + len(data)
        if r["stdout"]["eof"] and r["stderr"]["eof"]:
            return out, err, r
        assert time.monotonic() < t_end, r


def test_start_read_exit(ag):
    pid = start(ag, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    out, err, r = read_all(ag, pid)
    assert (out, err) == (b"out\n", b"err\n")
    assert (r["running"], r["exit_code"], r["signal"], r["timed_out"]) == (False, 3, None, False)
    st = ag.request("proc_status", pid=pid)
    assert st["ok"] and st["exit_code"] == 3 and st["stdout_total"] == 4 and st["running"] is False
    assert st["argv"] == ["sh", "-c", "echo out; echo err >&2; exit 3"] and isinstance(st["ended_at"], float)


def test_first_chunk_arrives_before_the_end(ag):
    pid = start(ag, ["sh", "-c", "echo first; sleep 3; echo last"])
    t0 = time.monotonic()
    r = ag.request("proc_read", pid=pid, offsets={"stdout": 0, "stderr": 0}, wait=5.0)
    assert base64.b64decode(r["stdout"]["data"]) == b"first\n"
    assert r["running"] is True and r["stdout"]["eof"] is False
    assert time.monotonic() - t0 < 2.0
    # A long poll past the data waits, then returns with nothing new.
    t1 = time.monotonic()
    r = ag.request("proc_read", pid=pid, offsets={"stdout": 6, "stderr": 0}, wait=0.5)
    assert r["stdout"]["data"] == "" and 0.4 < time.monotonic() - t1 < 2.0
    ag.request("proc_kill", pid=pid)


def test_stdin_write_and_close(ag):
    pid = start(ag, ["cat"])
    r = ag.request("proc_write", pid=pid, data=base64.b64encode(b"hello ").decode())
    assert r["ok"] and r["written"] == 6
    r = ag.request("proc_write", pid=pid, data=base64.b64encode(b"world").decode(), close=True)
    assert r["ok"] and r["written"] == 5
    out, _, r = read_all(ag, pid)
    assert out == b"hello world" and r["exit_code"] == 0
    r = ag.request("proc_write", pid=pid, data=base64.b64encode(b"x").decode())
    assert (r["ok"], r["error"]) == (False, "stdin_closed")


def test_unknown_pid_and_bad_input_are_typed(ag):
    for op in ("proc_read", "proc_status", "proc_kill", "proc_write", "proc_resize"):
        r = ag.request(op, pid=999999, data="", cols=10, rows=10)
        assert (r["ok"], r["error"]) == (False, "process_not_found"), (op, r)
    pid = start(ag, ["sleep", "30"])
    r = ag.request("proc_resize", pid=pid, cols=100, rows=40)
    assert (r["ok"], r["error"]) == (False, "not_a_pty")
    ag.request("proc_kill", pid=pid)
    r = ag.request("proc_start", argv=["id"], env={}, user="rollbox-no-such-user")
    assert (r["ok"], r["error"]) == (False, "invalid_argument")
    assert r["message"] == "unable to find user rollbox-no-such-user: no matching entries in passwd file"
    r = ag.request("proc_start", argv=["rollbox-no-such-cmd"], env={})
    assert (r["ok"], r["error"]) == (False, "invalid_argument")
    r = ag.request("proc_start", argv=[], env={})
    assert (r["ok"], r["error"]) == (False, "invalid_argument")
    r = ag.request("proc_start", argv=["true"], env={}, pty=True, cols=0, rows=70000)
    assert (r["ok"], r["error"]) == (False, "invalid_argument")


def test_kill_reaches_a_setsid_daemon(ag, tmp_path):
    pidfile = tmp_path / "daemon.pid"
    pid = start(ag, ["sh", "-c", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 300"])
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    daemon = int(pidfile.read_text())
    r = ag.request("proc_kill", pid=pid)
    assert r["ok"] and r["killed"] >= 3, r
    _, _, r = read_all(ag, pid)
    assert r["running"] is False and r["signal"] == signal.SIGKILL

    def dead() -> bool:
        try:
            with open(f"/proc/{daemon}/stat") as f:
                return f.read().split()[2] == "Z"
        except OSError:
            return True
    deadline = time.monotonic() + 5
    while not dead() and time.monotonic() < deadline:
        time.sleep(0.02)  # polling for the kernel's end of it, not ordering by a sleep
    assert dead()


def _dead(pid: int) -> bool:
    """Whether `pid` is gone (or a zombie: killed, waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


KEEP_ENDED = 64  # the ended processes both agents list (procs.py, native/src/procs.rs)


def test_an_evicted_entry_is_gone_from_the_sandbox(ag, tmp_path):
    """An ended process pushed out of the table by newer ended ones takes what is left of its
    tree with it (a setsid'd descendant that still holds its pipes): a process gone from the
    list is gone from the sandbox."""
    pidfile = tmp_path / "daemon.pid"
    first = start(ag, ["sh", "-c", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & exit 4"])
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)  # polling for the descendant to start, not ordering by a sleep
    daemon = int(pidfile.read_text())
    _, _, r = read_all(ag, first)
    assert r["exit_code"] == 4 and not _dead(daemon)  # the entry ended; its descendant runs on
    others = []
    for _ in range(KEEP_ENDED):
        pid = start(ag, ["true"])
        assert read_all(ag, pid)[2]["exit_code"] == 0
        others.append(pid)
        assert first in {p["pid"] for p in ag.request("proc_list")["processes"]} or len(others) == KEEP_ENDED
    listed = {p["pid"] for p in ag.request("proc_list")["processes"]}
    assert first not in listed and set(others) <= listed
    r = ag.request("proc_status", pid=first)
    assert (r["ok"], r["error"]) == (False, "process_not_found"), r
    deadline = time.monotonic() + 5
    while not _dead(daemon) and time.monotonic() < deadline:
        time.sleep(0.02)  # polling for the kernel's end of it
    assert _dead(daemon), f"the evicted entry's descendant {daemon} still runs"


def test_kill_with_a_handled_signal(ag):
    pid = start(ag, ["sh", "-c", "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"])
    r = ag.request("proc_read", pid=pid, offsets={"stdout": 0, "stderr": 0}, wait=10.0)
    assert base64.b64decode(r["stdout"]["data"]) == b"ready\n"  # the trap is set: no race with the kill
    r = ag.request("proc_kill", pid=pid, signal=15)
    assert r["ok"] and r["killed"] >= 1
    out, _, r = read_all(ag, pid)
    assert b"got-term" in out and r["exit_code"] == 7


def test_timeout_kills_the_tree(ag):
    t0 = time.monotonic()
    pid = start(ag, ["sh", "-c", "sleep 300 & sleep 300"], timeout=0.5)
    _, _, r = read_all(ag, pid)
    assert r["timed_out"] is True and r["running"] is False and r["exit_code"] is None
    assert time.monotonic() - t0 < 5


def test_retention_keeps_the_head_and_says_truncated(ag):
    # 3 MB with a 1000-byte head: the head, then a gap, then the 1 MiB tail.
    pid = start(ag, ["sh", "-c", "head -c 3000000 /dev/zero"], max_retained=1000)
    for _ in range(100):
        st = ag.request("proc_status", pid=pid)
        if not st["running"]:
            break
        time.sleep(0.05)
    assert st["stdout_total"] == 3000000
    r = ag.request("proc_read", pid=pid, offsets={"stdout": 0, "stderr": 0})
    assert r["stdout"]["offset"] == 0 and len(base64.b64decode(r["stdout"]["data"])) == 1000
    assert r["stdout"]["truncated"] is False and r["stdout"]["eof"] is False
    r = ag.request("proc_read", pid=pid, offsets={"stdout": 1000, "stderr": 0}, max_bytes=10)
    # At least the most recent 1 MiB is kept (agent.py trims its tail in batches).
    assert r["stdout"]["truncated"] is True and 1000 < r["stdout"]["offset"] <= 3000000 - (1 << 20)
    r = ag.request("proc_read", pid=pid, offsets={"stdout": 3000000 - 5, "stderr": 0})
    assert len(base64.b64decode(r["stdout"]["data"])) == 5 and r["stdout"]["eof"] is True


def test_pty_is_a_terminal_and_resizes(ag):
    pid = start(ag, ["sh", "-c", "tty -s && echo isatty; stty size; read l; stty size; echo got:$l"],
                pty=True, cols=100, rows=30)
    out = b""
    offs = {"stdout": 0, "stderr": 0}
    while b"30 100" not in out:
        r = ag.request("proc_read", pid=pid, offsets=offs, wait=2.0)
        d = base64.b64decode(r["stdout"]["data"])
        assert d or r["running"], (out, r)
        out += d
        offs["stdout"] += len(d)
    assert b"isatty" in out
    assert ag.request("proc_resize", pid=pid, cols=120, rows=50)["ok"]
    ag.request("proc_write", pid=pid, data=base64.b64encode(b"hi\n").decode())
    rest, err, r = read_all(ag, pid)
    out += rest
    assert b"50 120" in out and b"got:hi" in out and r["exit_code"] == 0 and err == b""
    assert ag.request("proc_status", pid=pid)["pty"] is True


def test_list_and_concurrent_processes_keep_their_own_output(ag):
    pids = [start(ag, ["sh", "-c", f"echo n=$N; exit {i}"], env={"N": str(i)}) for i in range(20)]
    for i, pid in enumerate(pids):
        out, _, r = read_all(ag, pid)
        assert out == f"n={i}\n".encode() and r["exit_code"] == i
    lst = ag.request("proc_list")["processes"]
    assert {p["pid"] for p in lst} >= set(pids)
    assert all(p["running"] is False for p in lst if p["pid"] in pids)


def test_output_is_drained_while_nobody_reads(ag):
    pid = start(ag, ["sh", "-c", "head -c 5000000 /dev/zero; echo done >&2"])
    t0 = time.monotonic()
    while ag.request("proc_status", pid=pid)["running"]:
        assert time.monotonic() - t0 < 10
        time.sleep(0.05)
    st = ag.request("proc_status", pid=pid)
    assert st["stdout_total"] == 5000000 and st["stderr_total"] == 5


def test_no_thread_for_the_reader_fails_the_start_cleanly(monkeypatch):
    """At the process limit (RLIMIT_NPROC counts threads) the native agent cannot make a
    process's reader thread: proc_start fails with resource_exhausted and starts nothing."""
    if os.geteuid() != 0 or not os.access(NATIVE_AGENT_PATH, os.X_OK):
        pytest.skip("needs root (to run the agent as a fresh uid) and the native agent")
    import tests.unit.conftest as harness

    uid = 50000 + os.getpid() % 10000  # a uid with no other process: the limit is per user
    # The idle agent is 7 tasks (main, reaper, 4 pool threads, the zygote launcher).
    monkeypatch.setattr(harness, "agent_command", lambda kind: [
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "prlimit", "--nproc=7:7",
        str(NATIVE_AGENT_PATH)])
    a = AgentProcess("native")
    try:
        assert a.request("ping")["ok"] is True
        # Whether the reader thread or the process is the task over the limit depends on how
        # many of the agent's threads are up at this moment: either way the start fails as
        # resource_exhausted and nothing runs (was: invalid_argument when the spawn failed).
        r = a.request("proc_start", argv=["sh", "-c", "echo started > /dev/null"], env={})
        assert (r["ok"], r["error"]) == (False, "resource_exhausted"), r
        assert "process limit" in r["message"]
        assert a.request("proc_list")["processes"] == []
        assert a.request("ping")["ok"] is True
    finally:
        a.close()


def test_a_write_nobody_reads_returns_what_the_pipe_took_and_keeps_stdin_open(ag):
    pid = start(ag, ["sh", "-c", "sleep 6; wc -c"])
    t0 = time.monotonic()
    r = ag.request("proc_write", pid=pid, data=base64.b64encode(b"z" * (1 << 20)).decode(), close=True)
    # Within the agent's 5 s write limit, the pipe takes its capacity; close waits for the rest.
    assert r["ok"] and 0 < r["written"] < 1 << 20 and time.monotonic() - t0 < 8, r
    rest = (1 << 20) - r["written"]
    r = ag.request("proc_write", pid=pid, data=base64.b64encode(b"z" * rest).decode(), close=True)
    assert r["ok"] and r["written"] == rest, r
    out, _, r = read_all(ag, pid)
    assert out.strip() == b"1048576" and r["exit_code"] == 0


def test_user_applies_to_pipes_and_ptys(ag):
    if os.geteuid() != 0:
        pytest.skip("switching user needs root")
    for pty in (False, True):
        pid = start(ag, ["sh", "-c", "id -u; tty -s && echo tty || echo notty"], user="nobody", pty=pty)
        out, _, r = read_all(ag, pid)
        assert out.replace(b"\r", b"").split() == [b"65534", b"tty" if pty else b"notty"], (pty, out)
        assert r["exit_code"] == 0 and ag.request("proc_status", pid=pid)["user"] == "nobody"


def _ctx_switches(pid: int) -> int:
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/status") as f:
            total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    return total


def test_idle_processes_cost_the_native_agent_no_wakeups(native):
    """The reaper wakes a reader at its process's exit, so idle readers sleep in poll (under
    gVisor every wake-up is a sentry round trip); the exit is still seen at once while a
    descendant holds the pipes."""
    pids = [start(native, ["sleep", "30"]) for _ in range(20)]
    time.sleep(0.3)
    before = _ctx_switches(native.pid)
    time.sleep(1.0)
    assert _ctx_switches(native.pid) - before < 10  # polling every 200 ms: 100
    pid = start(native, ["sh", "-c", "sleep 30 & exit 5"])
    t0 = time.monotonic()
    r = native.request("proc_read", pid=pid, offsets={"stdout": 0, "stderr": 0}, wait=5.0)
    while r["running"]:
        r = native.request("proc_read", pid=pid, offsets={"stdout": 0, "stderr": 0}, wait=5.0)
    assert r["exit_code"] == 5 and time.monotonic() - t0 < 0.5
    for p in pids + [pid]:
        native.request("proc_kill", pid=p)
