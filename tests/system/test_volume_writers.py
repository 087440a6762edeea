"""Concurrent writers on one volume keep every line, or are refused up front (gh-19 item 9).

gVisor's sentry appends to a shared host file as "stat, then write at that size": two gVisor
sandboxes appending to one file overwrite each other's lines, and so do a gVisor and a runc
one (rollbox/volumes/writers.py has the measurements). So a volume has one gVisor writer at a
time: a second read-write mount is VolumeBusy, read-only mounts go anywhere, and runc
sandboxes (the host kernel's atomic O_APPEND) share a read-write mount.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import time

import pytest

import rollbox
from rollbox import Sandbox, Volume
from rollbox.sdk.sandbox import default_client

LINES = 1000


@pytest.fixture
def name():  # type: ignore[no-untyped-def]
    n = f"w-{os.getpid()}-{time.monotonic_ns() % 10**8}"
    yield n
    try:
        Volume(n).delete()
    except rollbox.RollboxError:
        pass


def _append(sb, tag: str, procs: int = 1):  # type: ignore[no-untyped-def]
    """`procs` processes in `sb`, each appending LINES lines `tag-p-i` to /data/shared."""
    loop = f'for i in $(seq {LINES}); do echo {tag}-$p-$i >> /data/shared; done'
    return sb.exec("sh", "-c", f"for p in $(seq {procs}); do ({loop}) & done; wait", timeout=300)


def _assert_intact(vol: Volume, expected: set[str]) -> None:
    lines = vol.read_file("/shared").decode(errors="replace").split("\n")
    assert lines[-1] == ""
    counts = collections.Counter(lines[:-1])
    assert set(counts) == expected, (len(expected - set(counts)), sorted(set(counts) - expected)[:5])
    assert max(counts.values()) == 1


def test_eight_gvisor_writers_keep_every_line_or_are_refused_gh19(name) -> None:
    rw, ro = Volume(name, "/data"), Volume(name, "/data", read_only=True)
    boxes, refused = [], 0
    try:
        for _ in range(8):
            try:
                boxes.append(Sandbox(memory=256, volumes=[rw]).create())
            except rollbox.VolumeBusy as e:
                assert "read_only=True" in str(e) and boxes[0].sandbox_id in str(e)
                refused += 1
        # One gVisor sandbox may write it; the other seven are refused before they boot.
        assert (len(boxes), refused) == (1, 7)
        # The writes it admits: 8 writers x 1,000 lines in the one gVisor writer (one kernel
        # serialises them), beside 7 gVisor sandboxes reading the volume.
        readers = [Sandbox(memory=256, volumes=[ro]).create() for _ in range(7)]
        boxes += readers
        r = _append(boxes[0], "g", procs=8)
        assert r.exit_code == 0, r.stderr
        _assert_intact(rw, {f"g-{p}-{i}" for p in range(1, 9) for i in range(1, LINES + 1)})
        assert all(sb.exec("wc", "-l", "/data/shared").stdout.split()[0] == b"8000" for sb in readers)
        # A fork's copies would all write beside their source: refused before any capture.
        with pytest.raises(rollbox.VolumeBusy):
            boxes[0].fork(2)
    finally:
        for sb in boxes:
            sb.terminate()
    # The writer gone, another may write.
    Sandbox(memory=256, volumes=[rw]).create().terminate()


def test_eight_runc_writers_share_a_volume_and_keep_every_line_gh19(name) -> None:
    rw = Volume(name, "/data")
    boxes = [Sandbox(memory=256, runtime="runc", volumes=[rw]).create() for _ in range(8)]
    try:
        with cf.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(lambda ib: _append(ib[1], f"r{ib[0]}"), enumerate(boxes)))
        assert [r.exit_code for r in results] == [0] * 8
        _assert_intact(rw, {f"r{b}-1-{i}" for b in range(8) for i in range(1, LINES + 1)})
    finally:
        for sb in boxes:
            sb.terminate()


def test_gvisor_and_runc_writers_do_not_mix_gh19(name) -> None:
    """gVisor + runc on one read-write volume lost 41 of 40,000 lines: refused either way;
    the one that writes keeps every line while the other reads along."""
    rw, ro = Volume(name, "/data"), Volume(name, "/data", read_only=True)
    for writer_rt, other_rt in (("gvisor", "runc"), ("runc", "gvisor")):
        writer = Sandbox(memory=256, runtime=writer_rt, volumes=[rw]).create()
        reader = None
        try:
            with pytest.raises(rollbox.VolumeBusy):
                Sandbox(memory=256, runtime=other_rt, volumes=[rw]).create()
            reader = Sandbox(memory=256, runtime=other_rt, volumes=[ro]).create()
            writer.exec("touch", "/data/shared")
            with cf.ThreadPoolExecutor(2) as ex:
                w = ex.submit(_append, writer, writer_rt, 2)
                tail = ex.submit(reader.exec, "sh", "-c", "for i in $(seq 50); do wc -l < /data/shared; done",
                                 timeout=120)
                assert w.result().exit_code == 0 and tail.result().exit_code == 0
            _assert_intact(rw, {f"{writer_rt}-{p}-{i}" for p in (1, 2) for i in range(1, LINES + 1)})
            assert b"Read-only" in reader.exec("sh", "-c", "echo x >> /data/shared").stderr
        finally:
            writer.terminate()
            if reader is not None:
                reader.terminate()
        Volume(name).remove("/shared")


def test_snapshot_of_a_writer_restores_once_and_has_no_warm_pool_gh19(name) -> None:
    rw = Volume(name, "/data")
    src = Sandbox(memory=256, volumes=[rw]).create()
    snap = src.snapshot_memory()
    try:
        with pytest.raises(rollbox.VolumeBusy):
            Sandbox().create_from_memory_snapshot(snap)  # beside its running source
        src.terminate()
        copy = Sandbox().create_from_memory_snapshot(snap)
        try:
            assert copy.exec("sh", "-c", "echo x > /data/x && cat /data/x").stdout == b"x\n"
            with rollbox.SandboxPool(snap, max_concurrency=2, warm=2) as pool, pytest.raises(rollbox.VolumeBusy):
                pool.start_warm()
        finally:
            copy.terminate()
    finally:
        src.terminate()
        default_client().request("DELETE", f"/snapshots/{snap}")


def test_shared_writes_fleet_writes_one_file_each_from_a_pool(name) -> None:
    # The waiver: a fleet (a pool over a snapshot, its warm spares included) whose episodes
    # each write their own file may all mount the volume read-write; nothing is lost.
    vol = Volume(name, "/data", shared_writes=True)
    src = Sandbox(memory=256, volumes=[vol]).create()
    snap = src.snapshot_memory()
    try:
        def episode(sb, i: int) -> int:  # type: ignore[no-untyped-def]
            return sb.exec("sh", "-c", f"seq 200 > /data/ep{i}.txt && echo {i}").exit_code or 0

        with rollbox.SandboxPool(snap, max_concurrency=3, warm=2) as pool:
            results = list(pool.map(episode, range(6)))
        assert [r.status for r in results] == ["ok"] * 6
        for i in range(6):
            assert vol.read_file(f"/ep{i}.txt") == "".join(f"{n}\n" for n in range(1, 201)).encode()
        with pytest.raises(rollbox.VolumeBusy, match="shared_writes"):
            Sandbox(memory=256, volumes=[Volume(name, "/data")]).create()  # a plain writer beside them
    finally:
        src.terminate()
        default_client().request("DELETE", f"/snapshots/{snap}")
