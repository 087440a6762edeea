"""Daemon crash and restart: running sandboxes are re-attached, dead ones cleaned up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import rollbox
from rollbox import Sandbox
from rollbox.sdk.sandbox import default_client

from .conftest import host_traces


def _daemon_pid(paths) -> int:  # type: ignore[no-untyped-def]
    return int(paths.daemon_lock.read_text().strip())


def _kill_daemon(paths) -> None:  # type: ignore[no-untyped-def]
    pid = _daemon_pid(paths)
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def test_daemon_crash_and_restart(paths) -> None:
    survivor = Sandbox(memory=256).create()
    victim = Sandbox(memory=256).create()
    survivor.fs.write_file("/work/note", b"still here")
    _kill_daemon(paths)
    # While the daemon is down, one sandbox dies.
    cid = victim.sandbox_id.removeprefix("sb-")
    out = subprocess.run(["pgrep", "-f", f"runsc-sandbox .*{cid}"], capture_output=True, text=True).stdout.split()
    for pid in out:
        os.kill(int(pid), signal.SIGKILL)
    # The next call starts a fresh daemon, which re-attaches and cleans up.
    try:
        assert survivor.exec("cat", "/work/note").stdout == b"still here"
        with pytest.raises(rollbox.SandboxLost):
            victim.exec("true")
        deadline = time.monotonic() + 30
        while host_traces(paths, victim.sandbox_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert host_traces(paths, victim.sandbox_id) == []
    finally:
        survivor.terminate()
    assert host_traces(paths, survivor.sandbox_id) == []
    assert default_client().request("GET", "/health")["ok"]


def test_a_restarted_daemon_readopts_a_sandbox_as_it_was_started(paths) -> None:
    """live.json: env, disk cap and platform survive a daemon crash, so commands run as before
    and a snapshot taken after the restart carries the same cap and platform."""
    sb = Sandbox(memory=256, env={"EPISODE": "e-17"}, disk=64).create()
    try:
        _kill_daemon(paths)
        r = sb.exec("sh", "-c", 'echo "$EPISODE"')  # starts a fresh daemon, which re-adopts it
        assert r.stdout == b"e-17\n"
        snap = sb.snapshot_memory()
        meta = json.loads((paths.snapshots / snap / "meta.json").read_text())
        assert meta["disk_mib"] == 64 and meta["env"] == {"EPISODE": "e-17"} and meta["platform"] == "systrap"
        default_client().request("DELETE", f"/snapshots/{snap}")
    finally:
        sb.terminate()
    assert host_traces(paths, sb.sandbox_id) == []


def test_a_cgroup_busy_across_a_restart_is_removed_once_free(paths) -> None:  # type: ignore[no-untyped-def]
    """A sandbox's cgroup still busy at teardown (a process in it not yet gone) and then a
    daemon restart: the new daemon keeps retrying it and removes it once it is free."""
    from rollbox.client.transport import stop_daemon
    from rollbox.runtime import cgroups
    from rollbox.server.service import container_id

    sb = Sandbox(memory=256).create()
    cid = container_id(sb.sandbox_id)
    mem = cgroups.CGROUP_ROOT / "memory" / paths.cgroup_parent / cid
    holder = subprocess.Popen(["sleep", "600"])
    try:
        (mem / "cgroup.procs").write_text(str(holder.pid))
        sb.terminate()
        assert mem.is_dir()  # busy: the teardown could not remove it
        stop_daemon(paths)
        assert default_client().request("GET", "/health")["ok"]  # a new daemon, its recovery done
        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 15
        while cgroups.controller_dirs(cid, paths.cgroup_parent) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cgroups.controller_dirs(cid, paths.cgroup_parent) == []
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_an_exec_cut_off_by_a_daemon_restart_or_crash_is_typed_and_retryable_gh19(paths, how: str) -> None:
    """`rollbox daemon restart` during an exec gave an untyped ApiError("Internal Server Error"):
    the daemon's server answered the request it cancelled itself, in plain text."""
    sb = Sandbox(memory=256).create()
    got: list[BaseException | None] = []

    def run() -> None:
        try:
            sb.exec("sleep", "10")
            got.append(None)
        except BaseException as e:  # noqa: BLE001
            got.append(e)

    t = threading.Thread(target=run)
    try:
        t.start()
        time.sleep(1.5)  # the exec is running in the sandbox
        if how == "restart":
            subprocess.run([sys.executable, "-m", "rollbox", "daemon", "restart"], check=True, capture_output=True,
                           timeout=120)
        else:
            _kill_daemon(paths)
        t.join(60)
        assert len(got) == 1, "the exec did not return"
        err = got[0]
        assert isinstance(err, (rollbox.DaemonUnavailable, rollbox.SandboxLost)), repr(err)
        assert err.retryable
        assert sb.exec("echo", "again").stdout == b"again\n"  # the retry, on the re-adopted sandbox
    finally:
        t.join(60)
        sb.terminate()
    assert host_traces(paths, sb.sandbox_id) == []


def test_streamed_files_and_output_followers_reach_the_restarted_daemon(paths) -> None:
    # Break-it trial: after a crash, fs.read_file/write_file failed at once with "Connection
    # refused" and a process follower waited 60 s, where exec started the next daemon.
    sb = Sandbox(memory=256).create()
    try:
        sb.fs.write_file("/work/a", b"before")
        p = sb.process.exec("sh", "-c", "sleep 2; echo late")
        _kill_daemon(paths)
        assert sb.fs.read_file("/work/a") == b"before"  # starts (or finds) the next daemon
        _kill_daemon(paths)
        sb.fs.write_file("/work/b", b"after")
        _kill_daemon(paths)
        t0 = time.monotonic()
        assert b"".join(p.stdout) == b"late\n"
        assert time.monotonic() - t0 < 20
        assert sb.fs.read_file("/work/b") == b"after"
    finally:
        sb.terminate()


def test_a_container_pool_goes_on_after_a_daemon_crash_gh19(paths) -> None:  # type: ignore[no-untyped-def]
    """A restarted daemon has forgotten its episode pools: the SandboxPool opens its pool again
    instead of failing every later episode with EpisodePoolNotFound (break-it finding)."""
    sb = Sandbox(memory=256).create()
    try:
        snap = sb.snapshot_memory()
    finally:
        sb.terminate()
    try:
        def ep(box, i):  # type: ignore[no-untyped-def]
            return float(box.exec("echo", str(i)).stdout == f"{i}\n".encode())

        with rollbox.SandboxPool(snap, isolation="container", max_concurrency=2) as pool:
            assert [r.status for r in pool.map(ep, range(4), retries=0)] == ["ok"] * 4
            _kill_daemon(paths)
            res = list(pool.map(ep, range(6), retries=0))
            assert [(r.status, r.reward) for r in res] == [("ok", 1.0)] * 6, [r.error for r in res]
    finally:
        default_client().request("DELETE", f"/snapshots/{snap}")
