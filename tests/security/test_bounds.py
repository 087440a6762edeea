"""Every writable path and the process count have a bound (gh-19 items 2 and 7).

A write past a bound fails inside with ENOSPC and the sandbox lives on; before, /tmp and
/dev/shm were tmpfs mounts of half the *host's* memory, so filling one ended the whole
sandbox as `oom`. A fork bomb fills `pids` inside and a bounded number of host tasks.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import rollbox
from rollbox.runtime import cgroups
from rollbox.runtime.bundle import host_pids_max
from rollbox.sdk.sandbox import default_client

# Writing 1 GiB, twice the memory limit: a path backed by memory would end the sandbox as OOM.
MEMORY, DISK = 512, 256
# path -> its bound in MiB: the writable layer (`disk`) or a quarter of `memory` (/dev/shm).
BOUNDS = {"/tmp": DISK, "/dev/shm": MEMORY // 4, "/run": DISK, "/var/tmp": DISK, "/root": DISK, "/": DISK}


@pytest.mark.parametrize("path", list(BOUNDS))
def test_writing_past_each_path_is_enospc_not_oom_gh19(make_sandbox, path: str) -> None:  # type: ignore[no-untyped-def]
    sb = make_sandbox(memory=MEMORY, disk=DISK)
    target = path.rstrip("/") + "/fill"
    r = sb.exec("sh", "-c", f"head -c 1G /dev/zero > {target}", timeout=300)
    assert r.exit_code != 0 and b"No space left" in r.stderr and not r.oom_killed, r
    written = int(sb.exec("stat", "-c", "%s", target).stdout)
    assert (BOUNDS[path] - 64) << 20 < written <= BOUNDS[path] << 20, written
    assert sb.exec("echo", "ok", timeout=30).stdout == b"ok\n"
    assert sb.info().state == "running"
    assert sb.exec("sh", "-c", f"rm {target} && echo again > {target} && cat {target}").stdout == b"again\n"


def test_tmp_is_the_writable_layer_and_shm_its_own_bound_gh19(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb = make_sandbox(memory=512, disk=256)
    # No gVisor tmpfs over /tmp (the daemon's marker that prevents it is gone before any command).
    assert sb.exec("ls", "-A", "/tmp").stdout == b""
    assert sb.exec("stat", "-c", "%a", "/tmp").stdout == b"1777\n"
    df = sb.exec("sh", "-c", "df -k /tmp / /dev/shm | tail -3").stdout.decode().split("\n")
    tmp, root, shm = (line.split() for line in df[:3])
    assert tmp[1] == root[1] and int(root[1]) <= 256 * 1024
    assert int(shm[1]) == 128 * 1024


def test_bounds_hold_after_snapshot_restore_gh19(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    """Files in /tmp and /dev/shm come back with a restored copy, and so do the bounds."""
    sb = make_sandbox(memory=512, disk=256)
    sb.exec("sh", "-c", "echo t > /tmp/t && echo s > /dev/shm/s")
    snap = sb.snapshot_memory()
    copy = rollbox.Sandbox().create_from_memory_snapshot(snap)
    try:
        assert copy.exec("cat", "/tmp/t", "/dev/shm/s").stdout == b"t\ns\n"
        for target in ("/dev/shm/fill", "/tmp/fill"):
            r = copy.exec("sh", "-c", f"head -c 1G /dev/zero > {target}", timeout=300)
            assert r.exit_code != 0 and b"No space left" in r.stderr and not r.oom_killed, r
            copy.exec("rm", target)
        assert copy.exec("echo", "ok").stdout == b"ok\n"
    finally:
        copy.terminate()
        default_client().request("DELETE", f"/snapshots/{snap}")


def _pids_file(paths, sb, name: str) -> Path:  # type: ignore[no-untyped-def]
    return cgroups.CGROUP_ROOT / "pids" / paths.cgroup_parent / sb.sandbox_id.removeprefix("sb-") / name


def test_fork_bomb_under_pids_64_is_reported_and_bounded_on_the_host_gh19(make_sandbox, paths) -> None:  # type: ignore[no-untyped-def]
    sb = make_sandbox(memory=1024, pids=64)
    assert sb.info().pids == 64
    assert b"Max processes             64 " in sb.exec("cat", "/proc/1/limits").stdout
    assert int(_pids_file(paths, sb, "pids.max").read_text()) == host_pids_max(64)
    idle = int(_pids_file(paths, sb, "pids.current").read_text())
    peak, stop = [idle], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], int(_pids_file(paths, sb, "pids.current").read_text()))
            except (OSError, ValueError):
                pass
            time.sleep(0.02)

    t = threading.Thread(target=sample)
    t.start()
    try:
        r = sb.exec("bash", "-c", "bomb() { bomb | bomb; }; bomb", timeout=10)
    finally:
        stop.set()
        t.join()
    assert r.timed_out and r.pids_limited, r
    # ~2 host tasks per task inside on systrap (a stub per address space): 64 tasks inside
    # made ~130 host tasks here, against ~1,000 for the default 512.
    assert peak[0] - idle <= 3 * 64, (idle, peak[0])
    assert sb.exec("echo", "ok", timeout=30).stdout == b"ok\n"
    # A restored copy keeps the limit, inside and on the host.
    (copy,) = sb.fork(1)
    try:
        assert copy.info().pids == 64
        assert int(_pids_file(paths, copy, "pids.max").read_text()) == host_pids_max(64)
        assert b"Max processes             64 " in copy.exec("cat", "/proc/1/limits").stdout
    finally:
        copy.terminate()


def test_default_pids_and_runc_pids_gh19(make_sandbox, paths) -> None:  # type: ignore[no-untyped-def]
    sb = make_sandbox(memory=256)
    assert sb.info().pids == 512
    assert int(_pids_file(paths, sb, "pids.max").read_text()) == host_pids_max(512)
    rc = make_sandbox(memory=256, runtime="runc", pids=32)
    assert int(_pids_file(paths, rc, "pids.max").read_text()) == 32  # one host task per task
    r = rc.exec("bash", "-c", "bomb() { bomb | bomb; }; bomb", timeout=5)
    assert r.timed_out and r.pids_limited, r
    assert rc.exec("echo", "ok", timeout=30).stdout == b"ok\n"


@pytest.mark.parametrize("bad", [0, 15, -1, 4097, 10**9, True, "64", 64.0, None])
def test_invalid_pids_is_invalid_argument_gh19(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(rollbox.InvalidArgument, match="pids"):
        rollbox.Sandbox(pids=bad).create()


@pytest.mark.parametrize("bad", [0, 4097, True])
def test_daemon_refuses_invalid_pids_gh19(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(rollbox.InvalidArgument, match="pids"):
        default_client().request("POST", "/sandboxes", json={"image_id": "im-debian-bookworm", "pids": bad})
