"""A full disk under the store: snapshot and volume writes fail with ResourceExhausted, and
nothing already stored is damaged. The daemon here runs on a small loop-mounted ext4 of its
own (not tmpfs: tmpfs pages written by the gofer count against the sandbox's memory limit)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import rollbox
from rollbox import Sandbox, Volume
from rollbox.client.transport import Client, stop_daemon
from rollbox.config import Paths

from .conftest import host_traces

SIZE_MIB = 700


@pytest.fixture
def small_home(paths, tmp_path_factory):  # type: ignore[no-untyped-def]
    home = Path("/tmp/rollbox-diskfull")
    img = Path("/tmp/rollbox-diskfull.img")
    home.mkdir(exist_ok=True)
    subprocess.run(["truncate", "-s", f"{SIZE_MIB}M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(home)], check=True)
    small = Paths(home)
    small.ensure()
    (small.images / "im-debian-bookworm").symlink_to(paths.images / "im-debian-bookworm")
    client = Client(paths=small)
    try:
        yield small, client
    finally:
        try:
            for s in client.request("GET", "/sandboxes"):
                client.request("DELETE", f"/sandboxes/{s['sandbox_id']}")
            stop_daemon(small)
        finally:
            client.close()
            subprocess.run(["umount", str(home)], check=False)
            img.unlink(missing_ok=True)


def test_disk_full_snapshot_and_volume(small_home) -> None:
    small, client = small_home
    # disk=None: the writable layer on the (small) host disk itself, which is what fills here.
    sb = Sandbox(memory=256, disk=None, client=client, volumes=[Volume("v", "/data", client=client)]).create()
    sb.fs.write_file("/work/keep.txt", b"precious")
    good = sb.snapshot_memory()
    free_mib = os.statvfs(small.home).f_bavail * os.statvfs(small.home).f_frsize // 2**20
    # Fill the sandbox's writable layer so that copying it into a new snapshot cannot fit.
    # Leaves more than the 256 MiB pre-check wants, less than the copy needs (root may also use
    # ext4's 5% reserve): the copy itself hits ENOSPC.
    big = max(1, free_mib - 280)
    r = sb.exec("sh", "-c", f"head -c {big}M /dev/zero > /work/big", timeout=120)
    assert r.exit_code == 0, r.stderr
    with pytest.raises(rollbox.ResourceExhausted, match="disk|free"):
        sb.snapshot_memory()
    with pytest.raises(rollbox.ResourceExhausted):
        Volume("v", client=client).write_file("/huge", b"\0" * (400 * 2**20))
    # Nothing half-written is left in the store, and the earlier snapshot still restores.
    snaps = [s["snapshot_id"] for s in client.request("GET", "/snapshots")]
    assert snaps == [good]
    assert sorted(os.listdir(small.snapshots)) == [good]
    sb.exec("rm", "-f", "/work/big")
    # The copy mounts volume v read-write as its source did: only once the source is gone.
    sb.terminate()
    copy = Sandbox(client=client).create_from_memory_snapshot(good)
    assert copy.fs.read_file("/work/keep.txt") == b"precious"
    copy.terminate()
    assert host_traces(small, sb.sandbox_id) == []
