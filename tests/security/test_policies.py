"""The written policies (README "Policies", gh-19): what a restored copy's clocks and random
state do, how dangerous environment variables travel, and what the daemon's debug log never
prints. Real gVisor sandboxes; the daemon of this test session logs at debug (tests/conftest.py)."""

from __future__ import annotations

import os
import time

import rollbox
from rollbox.sdk.sandbox import default_client

HOOK = """#!/bin/sh
# The opt-in reseed hook: runs once in every restored copy, detached.
echo "$ROLLBOX_SEED $ROLLBOX_SANDBOX_ID" > /tmp/reseeded
"""


def _restore(snap: str) -> rollbox.SandboxInstance:
    return rollbox.Sandbox().create_from_memory_snapshot(snap)


def _wait_file(sb: rollbox.SandboxInstance, path: str, timeout: float = 10.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        r = sb.exec("cat", path)
        if r.exit_code == 0 and r.stdout.strip():
            return r.stdout
        assert time.monotonic() < deadline, f"{path} never appeared in {sb.sandbox_id}: {r}"
        time.sleep(0.1)


def test_monotonic_clock_counts_the_stored_time_and_restore_hook_reseeds(make_sandbox) -> None:
    sb = make_sandbox(memory=256)
    sb.fs.write_file("/etc/rollbox/restore-hook", HOOK.encode(), mode=0o755)
    # A process whose random state was seeded before the snapshot: cloned into every copy.
    sb.exec("sh", "-c", "python3 -c 'import random,time; random.seed(7); "
            "open(\"/tmp/r\",\"w\").write(str(random.random())); time.sleep(3600)' >/dev/null 2>&1 &")
    _wait_file(sb, "/tmp/r")
    m0 = float(sb.exec("python3", "-c", "import time; print(time.monotonic())").stdout)
    assert sb.exec("test", "-e", "/tmp/reseeded").exit_code == 1  # a fresh boot is no restore
    snap = sb.snapshot_memory()
    copies = []
    try:
        time.sleep(2.0)
        copies = [_restore(snap) for _ in range(2)]
        for c in copies:
            m1 = float(c.exec("python3", "-c", "import time; print(time.monotonic())").stdout)
            # Monotonic time never goes back and includes the time the snapshot was stored.
            assert m1 >= m0 + 2.0, (m0, m1)
            assert c.exec("cat", "/tmp/r").stdout == sb.exec("cat", "/tmp/r").stdout  # cloned by design
        seeds = [_wait_file(c, "/tmp/reseeded").split() for c in copies]
        assert [s[1].decode() for s in seeds] == [c.sandbox_id for c in copies]
        assert seeds[0][0] != seeds[1][0] and all(len(s[0]) == 32 for s in seeds)
    finally:
        for c in copies:
            c.terminate()
        default_client().request("DELETE", f"/snapshots/{snap}")


def test_dangerous_variables_travel_literally_and_never_reach_the_daemon(sandbox, paths) -> None:
    hostile = {"LD_PRELOAD": "/nonexistent/evil.so", "BASH_ENV": "/tmp/evil.sh", "PYTHONSTARTUP": "/tmp/x.py"}
    sandbox.fs.write_file("/tmp/evil.sh", b"echo BASH_ENV-ran\n")
    r = sandbox.exec("bash", "-c", "echo LD=$LD_PRELOAD BE=$BASH_ENV PS=$PYTHONSTARTUP", env=hostile)
    # Passed in as given: the sandbox's own loader and bash act on them, inside the sandbox.
    assert b"LD=/nonexistent/evil.so BE=/tmp/evil.sh PS=/tmp/x.py" in r.stdout, r
    assert b"BASH_ENV-ran" in r.stdout  # bash read BASH_ENV: in the sandbox, as documented
    daemon_pid = int(default_client().request("GET", "/health")["pid"])
    with open(f"/proc/{daemon_pid}/environ", "rb") as f:
        env = f.read()
    assert b"evil" not in env
    assert sandbox.exec("true").exit_code == 0


def test_debug_log_never_prints_exec_arguments_or_environments(sandbox, paths) -> None:
    secret_env, secret_arg = "env-secret-" + os.urandom(6).hex(), "arg-secret-" + os.urandom(6).hex()
    stdin_secret = "stdin-secret-" + os.urandom(6).hex()
    r = sandbox.exec("sh", "-c", f"cat >/dev/null; echo {secret_arg} >/dev/null", env={"API_KEY": secret_env},
                     stdin=stdin_secret.encode())
    assert r.exit_code == 0
    sandbox.fs.write_file("/tmp/f", ("file-" + secret_env).encode())
    log = paths.daemon_log.read_text(errors="replace")
    assert f"exec in {sandbox.sandbox_id}: sh (+2 arguments, 1 environment variables, not logged)" in log
    assert f"POST /sandboxes/{sandbox.sandbox_id}/exec -> 200" in log  # debug level is on
    for s in (secret_env, secret_arg, stdin_secret):
        assert s not in log
