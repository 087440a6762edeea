"""Escape attempts from inside a sandbox, and through the file API, all fail.

A canary file and a canary environment variable live on the host (the daemon's environment
has the variable: tests/conftest.py sets it before the daemon starts); nothing in a sandbox
may see either.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest

import rollbox
from rollbox.sdk.sandbox import default_client

CANARY_ENV = os.environ.get("ROLLBOX_TEST_CANARY", "")


@pytest.fixture(scope="module")
def host_canary() -> str:
    """A file only the host has; its content must never show up inside a sandbox."""
    token = "host-canary-" + secrets.token_hex(8)
    p = Path("/etc") / f"rollbox-canary-{secrets.token_hex(4)}"
    p.write_text(token)
    yield str(p) + ":" + token
    p.unlink(missing_ok=True)


def _assert_not_in(sb, token: str, script: str) -> None:  # type: ignore[no-untyped-def]
    r = sb.exec("sh", "-c", script, timeout=60)
    assert token.encode() not in r.stdout + r.stderr, (script, r)


def test_host_files_are_out_of_reach(sandbox, host_canary) -> None:  # type: ignore[no-untyped-def]
    path, token = host_canary.split(":")
    for script in (f"cat {path}", f"cat /proc/1/root{path}", f"cat /proc/self/root{path}",
                   f"ls -la /proc/1/root/etc; cat /proc/1/root/../../..{path}",
                   f"grep -r {token} /sys 2>/dev/null | head -1",
                   f"for d in /proc/[0-9]*; do cat $d/root{path} 2>/dev/null; done",
                   "cat /proc/1/environ; cat /proc/self/environ",
                   "mount -t proc proc /mnt 2>&1; mknod /tmp/sda b 8 0 2>&1 && head -c 64 /tmp/sda 2>&1",
                   "ls /dev; head -c 16 /dev/vda 2>&1; head -c 16 /dev/sda 2>&1; cat /dev/kmsg 2>&1 | head -1"):
        _assert_not_in(sandbox, token, script)
    # What the sandbox calls / is its own root: its /etc has none of the host's extra files.
    assert sandbox.exec("test", "-e", path).exit_code != 0
    # Device nodes of the host disk are not there and cannot be made usable.
    r = sandbox.exec("sh", "-c", "mknod /tmp/d b 8 0 && dd if=/tmp/d bs=512 count=1 of=/dev/null")
    assert r.exit_code != 0


def test_file_api_stays_inside(sandbox, host_canary, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, token = host_canary.split(":")
    sandbox.exec("sh", "-c", f"ln -s {path} /tmp/to-host; ln -s / /tmp/root-link; ln -s /etc /tmp/etc-link; "
                             f"ln -s ../../../../../../etc /tmp/dotdot-link")
    for p in ("/tmp/to-host", f"/tmp/../../..{path}", f"/tmp/root-link{path}", f"/tmp/etc-link/{Path(path).name}",
              f"/tmp/dotdot-link/{Path(path).name}", f"/proc/1/root{path}", path):
        with pytest.raises((rollbox.FileNotFoundInSandbox, rollbox.InvalidArgument)):
            sandbox.fs.read_file(p)
        with pytest.raises((rollbox.FileNotFoundInSandbox, rollbox.InvalidArgument)):
            sandbox.fs.download_file(p, tmp_path / "out")
    # Writes through `..` and links land in the sandbox's own tree, never on the host.
    name = f"rollbox-written-{secrets.token_hex(4)}"
    sandbox.fs.write_file(f"/tmp/../../../etc/{name}", "x")
    sandbox.fs.write_file(f"/tmp/etc-link/{name}-2", "y")
    src = tmp_path / "up.txt"
    src.write_text("uploaded")
    sandbox.fs.upload_file(src, f"/tmp/dotdot-link/{name}-3")
    for n in (name, f"{name}-2", f"{name}-3"):
        assert not (Path("/etc") / n).exists()
        assert sandbox.exec("test", "-f", f"/etc/{n}").exit_code == 0
    assert sandbox.fs.download_file(f"/etc/{name}-3", tmp_path / "down.txt") == 8
    assert (tmp_path / "down.txt").read_text() == "uploaded"
    names = {e.name for e in sandbox.fs.list_files("/tmp/root-link/etc")}
    assert Path(path).name not in names and name in names
    sandbox.fs.remove(f"/tmp/etc-link/{name}")
    assert not sandbox.exec("test", "-e", f"/etc/{name}").exit_code == 0


def test_daemon_is_unreachable_from_inside(make_sandbox, paths) -> None:  # type: ignore[no-untyped-def]
    """No socket file, and a networked sandbox's TCP connects to the host are refused."""
    sb = make_sandbox(memory=256, block_network=False)
    r = sb.exec("sh", "-c", f"ls -la {paths.socket} {paths.home} 2>&1; find / -name 'rollbox.sock' 2>/dev/null")
    assert b"rollbox.sock\n" not in r.stdout.replace(b" ", b"\n") or r.stdout.count(b"No such") > 0
    assert str(paths.socket).encode() + b"\n" not in r.stdout
    host_ips = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    probe = ("import socket,sys\nfor h in sys.argv[1:]:\n  s=socket.socket(); s.settimeout(3)\n"
             "  try: s.connect((h, 22)); print('OPEN', h)\n  except Exception as e: print('refused', h, e)\n")
    sb.fs.write_file("/tmp/probe.py", probe)
    r = sb.exec("python3", "/tmp/probe.py", *[ip for ip in host_ips if ":" not in ip][:3], "172.31.255.1",
                timeout=60)
    assert b"OPEN" not in r.stdout, r.stdout


def test_sandboxes_cannot_see_or_signal_each_other(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    a = make_sandbox(memory=256)
    b = make_sandbox(memory=256)
    b.exec("sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/pid")
    pid_b = b.fs.read_file("/tmp/pid").decode().strip()
    r = a.exec("sh", "-c", "ps -eo pid,args 2>/dev/null || ls /proc")
    assert b"sleep 1000" not in r.stdout
    a.exec("sh", "-c", f"kill -9 {pid_b} 2>/dev/null; kill -9 -1 2>/dev/null; true")
    assert b.exec("sh", "-c", f"kill -0 {pid_b} && echo alive").stdout == b"alive\n"
    # Host processes are not visible either: the sandbox's PID 1 is its own agent.
    r = a.exec("sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; ls /proc | grep -c '^[0-9]'")
    assert b"rollbox serve" not in r.stdout and b"runsc" not in r.stdout


def test_host_environment_is_not_visible(sandbox, paths) -> None:  # type: ignore[no-untyped-def]
    assert CANARY_ENV, "tests/conftest.py sets ROLLBOX_TEST_CANARY before the daemon starts"
    r = sandbox.exec("sh", "-c", "env; cat /proc/1/environ | tr '\\0' '\\n'")
    assert CANARY_ENV.encode() not in r.stdout
    assert b"ROLLBOX_HOME" not in r.stdout
    # Variables given to exec reach the command but are never written to logs or the database.
    secret = "exec-secret-" + secrets.token_hex(8)
    assert sandbox.exec("sh", "-c", "echo $TOKEN", env={"TOKEN": secret}).stdout == secret.encode() + b"\n"
    default_client().request("GET", "/health")
    for f in [paths.daemon_log, paths.db, *paths.sandboxes.rglob("*.log")]:
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_pid1_does_not_shield_commands_from_their_own_signals(sandbox) -> None:  # type: ignore[no-untyped-def]
    """PID 1 semantics: a command that raises a signal at itself dies of it (the agent's own
    handlers are not inherited as SIG_IGN)."""
    for sig in ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "ALRM"):
        r = sandbox.exec("python3", "-c", f"import signal, time; signal.raise_signal(signal.SIG{sig}); time.sleep(5)",
                         timeout=20)
        num = getattr(__import__("signal"), f"SIG{sig}")
        assert r.signal == num and r.exit_code == 128 + num, (sig, r)
    # (Python ignores SIGPIPE itself; a shell shows the inherited disposition.)
    for sig, num in (("TERM", 15), ("PIPE", 13), ("HUP", 1)):
        r = sandbox.exec("sh", "-c", f"kill -{sig} $$; sleep 5", timeout=20)
        assert r.exit_code == 128 + num and r.signal == num, (sig, r)


def test_orphans_are_reaped(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    """200 orphaned children (above the sandbox's pids limit, 128) become zombies of PID 1 unless
    it reaps them; the next command must still fork freely."""
    sandbox = make_sandbox(image=rollbox.Image.debian(), memory=256, pids=128)
    # Double fork: each grandchild outlives its parent, is re-parented to PID 1 and exits there.
    r = sandbox.exec("python3", "-c",
                     "import os\nfor _ in range(200):\n  pid = os.fork()\n  if pid == 0:\n"
                     "    if os.fork() == 0:\n      os._exit(0)\n    os._exit(0)\n  os.waitpid(pid, 0)\n",
                     timeout=120)
    assert r.exit_code == 0, r.stderr
    r = sandbox.exec("sh", "-c", "for i in $(seq 150); do /bin/true || exit 1; done; "
                                 "ls /proc | grep -c '^[0-9]'", timeout=120)
    assert r.exit_code == 0
    assert int(r.stdout) < 50, r.stdout  # the zombies are gone, not merely under the limit
