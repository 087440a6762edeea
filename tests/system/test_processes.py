"""Background processes (gh-16): `sb.process` against real gVisor sandboxes.

The module runs its own daemon (a side home) whose sandboxes boot the agent named by
ROLLBOX_TEST_PROCS_AGENT (default: the one sandboxes boot by default, the native agent when it
is built; "python" for agent.py), so every test here exercises the agent's process table for
real. Both agents' ops are also checked side by side over pipes in tests/unit/test_agent_procs.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

import rollbox
from rollbox import Sandbox, SandboxInstance
from rollbox.client.transport import Client, stop_daemon
from rollbox.config import Paths
from rollbox.runtime.bundle import default_agent
from tests.system.conftest import side_home

pytestmark = pytest.mark.timeout(90)
AGENT = os.environ.get("ROLLBOX_TEST_PROCS_AGENT") or default_agent()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def home(paths: Paths) -> Iterator[Paths]:
    p = side_home(paths, "procs")
    stop_daemon(p)
    old = os.environ.get("ROLLBOX_AGENT")
    os.environ["ROLLBOX_AGENT"] = AGENT  # read by the daemon the client starts (and restarts)
    try:
        yield p
    finally:
        stop_daemon(p)
        if old is None:
            os.environ.pop("ROLLBOX_AGENT", None)
        else:
            os.environ["ROLLBOX_AGENT"] = old


@pytest.fixture(scope="module")
def client(home: Paths) -> Iterator[Client]:
    c = Client(paths=home)
    yield c
    c.close()


@pytest.fixture(scope="module")
def sb(client: Client) -> Iterator[SandboxInstance]:
    """One networked sandbox shared by the tests that do not snapshot or end it."""
    s = Sandbox(memory=512, ports=[8000], client=client).create()
    yield s
    s.terminate()


def _env(home: Paths) -> dict[str, str]:
    return dict(os.environ, ROLLBOX_HOME=str(home.home), PYTHONPATH=str(REPO), ROLLBOX_AGENT=AGENT)


def _py(home: Paths, code: str) -> str:
    """Runs `code` in a fresh Python process (another client of the same daemon)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(home), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _alive(sb: SandboxInstance, seconds: str) -> int:
    """How many processes in the sandbox run exactly `sleep SECONDS` (not a parent whose own
    command line merely contains the number: it matches before it has forked)."""
    code = ("import os,sys\nn=0\nfor p in os.listdir('/proc'):\n if p.isdigit() and int(p) != os.getpid():\n"
            "  try: c=open('/proc/%s/cmdline'%p,'rb').read()\n  except OSError: continue\n"
            "  n += c.split(b'\\0')[:2] == [b'sleep', sys.argv[1].encode()]\nprint(n)")
    return int(sb.exec("python3", "-c", code, seconds).stdout)


def test_a_server_answers_through_expose_port_and_kill_closes_it(sb: SandboxInstance) -> None:
    p = sb.process.exec("python3", "-m", "http.server", "8000", "--bind", "0.0.0.0", cwd="/")
    url = sb.expose_port(8000)
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                assert r.status == 200
            break
        except OSError:
            assert time.monotonic() < deadline, "the server never answered"
            time.sleep(0.1)
    assert [i.running for i in sb.process.list_processes() if i.pid == p.pid] == [True]
    assert p.kill() >= 1
    res = p.wait(timeout=10)
    assert res.signal == 9 and res.exit_code == 137
    with pytest.raises(OSError):  # refused, or the daemon's proxy answering 502
        urllib.request.urlopen(url, timeout=2)
    probe = "import socket\ntry: socket.create_connection(('127.0.0.1', 8000), 2)\nexcept OSError: print('closed')"
    assert sb.exec("python3", "-c", probe).stdout == b"closed\n"
    assert p.poll() == 137


def test_kill_reaches_a_process_that_daemonised_itself(sb: SandboxInstance) -> None:
    code = ("import os,time\nif os.fork(): time.sleep(100); raise SystemExit\nos.setsid()\n"
            "if os.fork(): os._exit(0)\nos.execvp('sleep', ['sleep', '4242'])")
    p = sb.process.exec("python3", "-c", code)
    deadline = time.monotonic() + 10
    while _alive(sb, "4242") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert p.kill() >= 2
    p.wait(timeout=10)
    assert _alive(sb, "4242") == 0


def test_kill_reaches_a_descendant_that_cleared_its_environment(sb: SandboxInstance) -> None:
    # setsid + env -i leaves both the process group and the environment marker: only the
    # process's own cgroup (jail) still finds it.
    p = sb.process.exec("sh", "-c", "setsid env -i sh -c 'exec sleep 4343' & sleep 100")
    deadline = time.monotonic() + 10
    while _alive(sb, "4343") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    p.kill()
    p.wait(timeout=10)
    deadline = time.monotonic() + 5
    while _alive(sb, "4343") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(sb, "4343") == 0


def test_50_concurrent_processes_keep_their_own_output_exit_codes_and_env(sb: SandboxInstance) -> None:
    script = 'for i in 1 2 3; do echo "$N-$i"; echo "e$N" >&2; done; exit $((N % 7))'
    procs = [sb.process.exec("sh", "-c", script, env={"N": str(n)}) for n in range(50)]
    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(lambda p: p.wait(timeout=60), procs))
    for n, r in enumerate(results):
        assert r.stdout == "".join(f"{n}-{i}\n" for i in (1, 2, 3)).encode()
        assert r.stderr == f"e{n}\n".encode() * 3
        assert r.exit_code == n % 7
    assert len({p.pid for p in procs}) == 50


def test_a_process_outlives_its_client_and_another_client_reads_it_from_byte_0(sb: SandboxInstance,
                                                                               home: Paths) -> None:
    pid = int(_py(home, f"""
        from rollbox import Sandbox
        sb = Sandbox().connect({sb.sandbox_id!r})
        p = sb.process.exec("python3", "-u", "-c", "import time\\nfor i in range(3000): print(i)\\ntime.sleep(60)")
        print(p.pid)
    """))
    want = "".join(f"{i}\n" for i in range(3000)).encode()
    got = _py(home, f"""
        import hashlib
        from rollbox import Sandbox
        p = Sandbox().connect({sb.sandbox_id!r}).process.get_process({pid})
        buf = b""
        for chunk in p.stdout:
            buf += chunk
            if len(buf) >= {len(want)}:
                break
        print(len(buf), hashlib.sha256(buf).hexdigest(), p.status().running)
    """).split()
    assert got == [str(len(want)), hashlib.sha256(want).hexdigest(), "True"]
    sb.process.get_process(pid).kill()


def test_a_daemon_restart_keeps_the_handle_and_its_stream(sb: SandboxInstance, home: Paths) -> None:
    p = sb.process.exec("sh", "-c", "echo before; read x; echo got $x")
    it = iter(p.stdout)
    assert next(it) == b"before\n"  # a stream open across the restart: it resumes where it was
    r = subprocess.run([sys.executable, "-m", "rollbox", "daemon", "restart"], env=_env(home), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert p.status().running
    p.stdin.write("after\n")
    assert b"".join(it) == b"got after\n"
    res = p.wait(timeout=10)
    assert res.stdout == b"before\ngot after\n" and res.exit_code == 0


def test_awaitable_twins_and_incremental_text(sb: SandboxInstance) -> None:
    import asyncio

    code = ("import sys,time\nb='añ€😀'.encode()\nfor i in range(len(b)):\n"
            "    sys.stdout.buffer.write(b[i:i+1]); sys.stdout.flush(); time.sleep(0.02)")

    async def go() -> tuple[list[bytes], str, int | None]:
        p = await sb.process.exec.aio("python3", "-c", code)
        chunks = [c async for c in p.stdout.aio()]
        text = "".join([t async for t in p.stdout.text_aio()])
        return chunks, text, (await p.wait.aio()).exit_code

    chunks, text, code_ = asyncio.run(go())
    assert len(chunks) > 1 and b"".join(chunks) == "añ€😀".encode()  # bytes as they came, split mid-character
    assert text == "añ€😀" and code_ == 0
    assert "".join(sb.process.exec("printf", "\\303\\251").stdout.text()) == "é"


def test_the_first_chunk_arrives_long_before_the_process_ends(sb: SandboxInstance) -> None:
    t0 = time.monotonic()
    p = sb.process.exec("python3", "-u", "-c", "print(1); import time; time.sleep(5)")
    it = iter(p.stdout)
    assert next(it).startswith(b"1")  # python -u may write "1" and "\\n" apart
    assert time.monotonic() - t0 < 2.0
    assert p.poll() is None  # still sleeping
    p.kill()


def test_pty_resize_raw_bytes_and_exit_code(sb: SandboxInstance) -> None:
    p = sb.process.exec("bash", "--norc", "-i", pty=True, cols=80, rows=24)
    it = iter(p.stdout)
    buf = b""

    def until(marker: bytes) -> None:
        nonlocal buf
        while marker not in buf:
            buf += next(it)
        buf = buf[buf.index(marker) + len(marker):]

    p.resize(cols=123, rows=45)
    p.stdin.write(b"stty size\n")
    until(b"45 123")
    # Raw mode (stty raw -echo): bytes pass untranslated both ways. Not ^C: gVisor's line
    # discipline still turns it into SIGINT with -isig (measured, runsc here).
    p.stdin.write(b"stty raw -echo; echo RE''ADY; head -c 3 | od -An -tx1; printf 'B''<\\377\\000\\001>E'; exit 3\n")
    until(b"READY")
    p.stdin.write(b"\x00\xff\x01")  # NUL, a non-UTF-8 byte, ^A
    until(b"00 ff 01")
    # And out: the same raw bytes from the process, exactly, in the stdout chunks.
    until(b"B<")
    while b">E" not in buf:
        buf += next(it)
    assert buf[:buf.index(b">E")] == b"\xff\x00\x01"
    it.close()
    assert p.wait(timeout=20).exit_code == 3
    with pytest.raises(rollbox.NotAPty):
        sb.process.exec("true").resize(10, 10)


def test_bad_input_is_typed(sb: SandboxInstance, client: Client) -> None:
    with pytest.raises(rollbox.ProcessNotFound):
        sb.process.get_process(999999)
    p = sb.process.exec("cat")
    p.stdin.write(b"x")
    p.stdin.close()
    with pytest.raises(rollbox.StdinClosed):
        p.stdin.write(b"y")
    assert p.wait(timeout=10).stdout == b"x"
    with pytest.raises(rollbox.InvalidArgument, match="not supported"):
        sb.process.run_code("1", language="ruby")
    msg = "unable to find user nosuchuser: no matching entries in passwd file"
    with pytest.raises(rollbox.InvalidArgument, match=msg):
        sb.process.exec("true", user="nosuchuser")
    with pytest.raises(rollbox.InvalidArgument, match=msg):
        sb.exec("true", user="nosuchuser")
    assert sb.exec("id", "-u", user="nobody").stdout == b"65534\n"
    assert sb.exec("id", "-u", user=65534).stdout == b"65534\n"
    assert sb.process.exec("id", "-un", user="nobody").wait().stdout == b"nobody\n"
    with pytest.raises(rollbox.UnsupportedOperation, match="episode containers"):
        client.request("POST", f"/sandboxes/{sb.sandbox_id}/containers/c-1/processes", json={"argv": ["true"]})
    with pytest.raises(rollbox.InvalidArgument, match="command not found"):
        sb.process.exec("no-such-command-xyz")
    with pytest.raises(rollbox.UnsupportedOperation, match="episode containers"):
        client.request("POST", f"/sandboxes/{sb.sandbox_id}/containers/c-1/run_code", json={"code": "1"})


def test_wait_timeout_and_a_stdin_write_larger_than_the_pipe(sb: SandboxInstance) -> None:
    p = sb.process.exec("sh", "-c", "sleep 6; wc -c")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        p.wait(timeout=0.5)
    assert time.monotonic() - t0 < 3 and p.poll() is None
    # 1 MiB into a pipe nobody reads for 6 s: the agent never holds a request longer than 5 s
    # (the daemon would take the sandbox for wedged); the SDK sends the rest again.
    assert p.stdin.write(b"z" * (1 << 20)) == 1 << 20
    p.stdin.close()
    res = p.wait(timeout=30)
    assert res.stdout.strip() == b"1048576" and res.exit_code == 0


def test_run_code_keeps_state_and_returns_value_and_error(sb: SandboxInstance) -> None:
    r = sb.process.run_code("import math, sys\nx = 40\nprint('hi')\nprint('warn', x, file=sys.stderr)\nx + 2")
    assert (r.stdout, r.stderr, r.value, r.error) == ("hi\n", "warn 40\n", "42", None)
    r = sb.process.run_code("x += 1\nmath.sqrt(x - 32)")
    assert (r.stdout, r.stderr, r.value) == ("", "", "3.0")  # each snippet's own output only
    r = sb.process.run_code("def f():\n    raise KeyError('k')\nf()")
    assert r.error is not None and r.error.name == "KeyError" and r.error.value == "'k'"
    assert "line 2, in f" in r.error.traceback and "code_driver" not in r.error.traceback
    assert sb.process.run_code("x").value == "41"  # a failed snippet keeps the state
    with pytest.raises(rollbox.InvalidState, match="timeout"):
        sb.process.run_code("import time\ntime.sleep(30)", timeout=0.5)
    r = sb.process.run_code("'x' in dir()")  # the killed interpreter's state is gone; a fresh one answers
    assert r.value == "False" and r.error is None


def test_retention_is_bounded_and_keeps_the_head(sb: SandboxInstance, home: Paths) -> None:
    daemon = psutil.Process(int(home.daemon_lock.read_text().strip()))
    rss0 = daemon.memory_info().rss
    code = "import sys\nw=sys.stdout.buffer.write\nw(b'HEAD\\n')\nfor _ in range(50): w(b'x' * (1 << 20))\nw(b'\\nTAIL\\n')"
    p = sb.process.exec("python3", "-c", code)
    res = p.wait(timeout=60)
    assert res.exit_code == 0 and res.truncated
    assert res.stdout_bytes == 5 + 50 * (1 << 20) + 6
    assert res.stdout.startswith(b"HEAD\n") and res.stdout.endswith(b"\nTAIL\n")
    assert len(res.stdout) < res.stdout_bytes  # a live reader gets what it kept up with
    late = p.stdout.read()  # a late reader: the 1 MiB head and (at most 2 MiB of) the tail window
    assert late.startswith(b"HEAD\n") and late.endswith(b"\nTAIL\n") and len(late) <= 3 * (1 << 20)
    assert p.stdout.truncated
    assert daemon.memory_info().rss - rss0 < 40 * (1 << 20)


def test_a_process_running_at_snapshot_runs_on_in_every_copy(client: Client) -> None:
    src = Sandbox(memory=256, client=client).create()
    made = [src]
    snap = None
    try:
        # A counter that runs on for as long as the test may take (the sandboxes end it).
        p = src.process.exec("python3", "-u", "-c", "import time\nfor i in range(10**6): print(i); time.sleep(0.05)")
        it = iter(p.stdout)
        while b"3\n" not in next(it):
            pass
        it.close()
        snap = src.snapshot_memory()
        at_snap = p.status().stdout_total  # the source's bytes by now: at least what the copy holds
        copy = Sandbox(client=client).create_from_memory_snapshot(snap)
        made.append(copy)
        kid = src.fork(1)[0]
        made.append(kid)
        at_fork = p.status().stdout_total
        for s, before in ((copy, at_snap), (kid, at_fork)):
            listed = {i.pid: i for i in s.process.list_processes()}
            assert listed[p.pid].running
            q = s.process.get_process(p.pid)
            seen = b""
            for chunk in q.stdout:  # through this copy's own handle
                seen += chunk
                if len(seen) >= before + 40 and seen.endswith(b"\n"):  # ~10 lines written after the snapshot
                    break
            n = seen.count(b"\n")
            # The retained output from before the snapshot, then the copy's own process
            # counting on from where it was: every number once, in order, none missing.
            assert seen == "".join(f"{i}\n" for i in range(n)).encode(), seen[-200:]
            assert len(seen) >= before + 40 and q.status().running
            q.kill()
            assert q.wait(timeout=10).exit_code == 137
        assert p.status().running  # the source's own process is untouched by the copies' kills
        src.pause()
        src.resume()
        assert p.status().running  # and a pause/resume carries it too
        it = iter(p.stdout)
        assert next(it).startswith(b"0\n")
        it.close()
    finally:
        for s in made:
            s.terminate()
        if snap is not None:
            client.request("DELETE", f"/snapshots/{snap}")


def test_rollbox_shell_and_process_ls(sb: SandboxInstance, home: Paths) -> None:
    cli = [sys.executable, "-m", "rollbox"]
    # Piped input gets a pipe, not a terminal (as with ssh and `docker exec -i`): it ends at EOF.
    r = subprocess.run([*cli, "shell", sb.sandbox_id], input=b"echo hi-$((6*7)); tty; exit 4\n",
                       env=_env(home), capture_output=True, timeout=60)
    assert r.returncode == 4, r.stderr[-2000:]
    assert b"hi-42" in r.stdout and b"not a tty" in r.stdout
    r = subprocess.run([*cli, "process", "ls", sb.sandbox_id], env=_env(home), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "exited" in r.stdout and "bash -l" in r.stdout, r.stdout + r.stderr


def test_rollbox_shell_passes_term_and_logs_no_follow_returns(sb: SandboxInstance, home: Paths) -> None:
    """New-user trial: the shell's TERM was unset (`clear` failed), and `rollbox process logs`
    of a running process never returned."""
    cli = [sys.executable, "-m", "rollbox"]
    r = subprocess.run([*cli, "shell", sb.sandbox_id, "--", "sh", "-c", "echo TERM=$TERM"],
                       env=dict(_env(home), TERM="xterm-256color"), capture_output=True, timeout=60)
    assert r.returncode == 0 and b"TERM=xterm-256color" in r.stdout, r.stdout + r.stderr[-2000:]
    p = sb.process.exec("sh", "-c", "echo first; sleep 60")
    assert next(iter(p.stdout)) == b"first\n"
    try:
        r = subprocess.run([*cli, "process", "logs", "--no-follow", sb.sandbox_id, str(p.pid)], env=_env(home),
                           capture_output=True, timeout=30)
        assert r.returncode == 0 and r.stdout == b"first\n", r.stdout + r.stderr[-2000:]
    finally:
        p.kill()


def test_rollbox_shell_whose_sandbox_ends_says_so_in_one_line(client: Client, home: Paths) -> None:
    """New-user trial: a sandbox terminated under `rollbox shell` printed the output thread's
    traceback before the CLI's one-line error."""
    other = Sandbox(memory=256, client=client).create()
    cli = subprocess.Popen([sys.executable, "-m", "rollbox", "shell", other.sandbox_id, "--", "sh", "-c",
                            "echo UP; sleep 120"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=_env(home))
    try:
        assert cli.stdout is not None and cli.stdout.readline().strip() == b"UP"
        other.terminate()
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode not in (0, None) and b"Traceback" not in err, err[-3000:]
    assert b"SandboxTerminated" in err or b"SandboxNotFound" in err, err[-3000:]


def test_rollbox_shell_with_input_at_eof_ends_with_the_commands_code(sb: SandboxInstance, home: Paths) -> None:
    """Break-it trial: `rollbox shell ID < /dev/null` hung (bash lost the ^D of a terminal it
    had not set up yet), and a command that exited before its stdin was closed was reported
    as StdinClosed (exit 2) instead of its own code."""
    cli = [sys.executable, "-m", "rollbox", "shell", sb.sandbox_id]
    r = subprocess.run(cli, stdin=subprocess.DEVNULL, env=_env(home), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    for _ in range(6):
        r = subprocess.run([*cli, "--", "sh", "-c", "exit 3"], stdin=subprocess.DEVNULL, env=_env(home),
                           capture_output=True, timeout=60)
        assert r.returncode == 3, r.stderr[-2000:]
    running = [p for p in sb.process.list_processes() if p.running and p.argv[:1] in (["/bin/sh"], ["sh"])]
    assert running == [], running


def _start_shell(sb: SandboxInstance, home: Paths, tmp_path: Path, *cmd: str) -> tuple[subprocess.Popen[bytes], int]:
    """`rollbox shell ID -- cmd` on a new pty (31x101); returns the CLI and the pty's master."""
    master, slave = os.openpty()
    _set_winsize(slave, 31, 101)
    with open(tmp_path / "stderr", "wb") as err:
        cli = subprocess.Popen([sys.executable, "-m", "rollbox", "shell", sb.sandbox_id, "--", *cmd], stdin=slave,
                               stdout=slave, stderr=err, env=_env(home), start_new_session=True)
    os.close(slave)
    return cli, master


def _read_until(master: int, marker: bytes, limit: float = 30.0) -> bytes:
    out = b""
    deadline = time.monotonic() + limit
    while marker not in out:
        left = deadline - time.monotonic()
        assert left > 0, (marker, out[-500:])
        if select.select([master], [], [], left)[0]:
            out += os.read(master, 65536)
    return out


def test_rollbox_shell_resizes_while_a_write_blocks_and_a_hangup_kills_the_command(
        sb: SandboxInstance, home: Paths, tmp_path: Path) -> None:
    """Break-it trial: a paste into a command that does not read stdin blocked the resizes
    (and crashed the CLI after 60 s); SIGHUP (a closed window) left the command running."""
    cli, master = _start_shell(sb, home, tmp_path, "sh", "-c", "while :; do stty size; sleep 0.3; done")
    try:
        _read_until(master, b"31 101")
        deadline = time.monotonic() + 30
        while termios.tcgetattr(master)[3] & termios.ECHO:  # the CLI's raw mode: it is reading keys
            assert time.monotonic() < deadline and cli.poll() is None, (tmp_path / "stderr").read_bytes()[-2000:]
            time.sleep(0.05)  # polling the terminal's mode, not ordering by a sleep
        def paste() -> None:
            try:
                os.write(master, b"x" * 200_000)  # more than the sandbox's terminal takes unread
            except OSError:  # the terminal closed at the end of the test
                pass

        threading.Thread(target=paste, daemon=True).start()
        time.sleep(1.0)  # let the write reach the CLI and block there (not an ordering by sleep: either way it must pass)
        _set_winsize(master, 50, 150)
        cli.send_signal(signal.SIGWINCH)
        _read_until(master, b"50 150", limit=15)
        cli.send_signal(signal.SIGHUP)
        assert cli.wait(timeout=30) == 128 + signal.SIGHUP, (tmp_path / "stderr").read_bytes()[-2000:]
        assert b"Traceback" not in (tmp_path / "stderr").read_bytes()
        deadline = time.monotonic() + 15
        while any(p.running and "stty size" in " ".join(p.argv) for p in sb.process.list_processes()):
            assert time.monotonic() < deadline, "the command outlived the hangup of its terminal"
            time.sleep(0.2)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        os.close(master)


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_rollbox_shell_on_a_terminal_resizes_and_exits_with_the_code(sb: SandboxInstance, home: Paths,
                                                                      tmp_path: Path) -> None:
    """`rollbox shell ID` at a real terminal (the slave end of a pty): the sandbox's terminal
    starts at this one's size, follows it on SIGWINCH, and the CLI exits with the shell's code."""
    master, slave = os.openpty()
    _set_winsize(slave, 31, 101)
    with open(tmp_path / "stderr", "wb") as err:
        cli = subprocess.Popen([sys.executable, "-m", "rollbox", "shell", sb.sandbox_id], stdin=slave, stdout=slave,
                               stderr=err, env=_env(home), start_new_session=True)
    os.close(slave)
    out = b""

    def until(marker: bytes, limit: float = 30.0) -> bytes:
        """Reads the terminal until `marker`; returns what came before it (and drops it)."""
        nonlocal out
        deadline = time.monotonic() + limit
        while marker not in out:
            left = deadline - time.monotonic()
            assert left > 0, (marker, out[-500:], (tmp_path / "stderr").read_bytes()[-2000:])
            if select.select([master], [], [], left)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:  # EIO: the CLI ended and closed the terminal
                    raise AssertionError((marker, out[-500:], (tmp_path / "stderr").read_bytes()[-2000:])) from None
        before, out = out.split(marker, 1)
        return before

    try:
        # Typing waits for the CLI's raw mode (setting it flushes what was typed before).
        deadline = time.monotonic() + 30
        while termios.tcgetattr(master)[3] & termios.ECHO:
            assert time.monotonic() < deadline and cli.poll() is None, (tmp_path / "stderr").read_bytes()[-2000:]
            time.sleep(0.05)  # polling the terminal's mode, not ordering by a sleep
        os.write(master, b"echo RE''ADY-$((6*7)); stty size; echo E''ND\n")
        until(b"READY-42")
        assert b"31 101" in until(b"END")  # the size the terminal had when the shell started
        _set_winsize(master, 45, 140)
        cli.send_signal(signal.SIGWINCH)  # what a terminal sends (the CLI also looks by itself)
        # The resize travels as its own request: ask until the shell sees it (10 s).
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            os.write(master, b"stty size; echo E''ND\n")
            seen.append(until(b"END")[-40:])
            if b"45 140" in seen[-1]:
                break
        else:
            raise AssertionError(("the sandbox's terminal never took the new size 45x140", seen[-3:],
                                  (tmp_path / "stderr").read_bytes()[-2000:]))
        os.write(master, b"exit 3\n")
        assert cli.wait(timeout=30) == 3
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        os.close(master)


def test_the_routes_are_in_the_openapi_spec_and_output_streams_once_without_follow(sb: SandboxInstance,
                                                                                    client: Client) -> None:
    spec = client.request("GET", "/openapi.json")
    paths = spec["paths"]
    for path in ("/sandboxes/{sandbox_id}/processes", "/sandboxes/{sandbox_id}/processes/{pid}/output",
                 "/sandboxes/{sandbox_id}/processes/{pid}/stdin", "/sandboxes/{sandbox_id}/run_code"):
        assert path in paths, sorted(paths)
    assert "application/x-ndjson" in paths["/sandboxes/{sandbox_id}/processes/{pid}/output"]["get"]["responses"]["200"][
        "content"]
    p = sb.process.exec("sh", "-c", "echo now; sleep 30")
    assert next(iter(p.stdout)) == b"now\n"
    events = list(client.stream_lines(f"/sandboxes/{sb.sandbox_id}/processes/{p.pid}/output",
                                      params={"follow": "false"}))
    assert events[0]["stream"] == "stdout" and events[-1]["exit"]["running"] is True  # what is there, then at once the end
    p.kill()


def test_pause_goes_ahead_while_a_client_follows_output(client: Client) -> None:
    # Break-it trial: a thread iterating p.stdout made pause() refuse ("1 command(s) running").
    import threading

    s = Sandbox(memory=256, client=client).create()
    try:
        p = s.process.exec("sh", "-c", "for i in 1 2 3 4 5 6; do echo $i; sleep 1; done")
        got: list[bytes] = []
        t = threading.Thread(target=lambda: got.extend(p.stdout), daemon=True)
        t.start()
        time.sleep(1.5)
        s.pause()
        s.resume()
        t.join(timeout=60)
        assert not t.is_alive() and b"".join(got) == b"1\n2\n3\n4\n5\n6\n"
    finally:
        s.terminate()
