"""Warm pools: spares restored ahead of demand, each handed out once, drained when idle."""

from __future__ import annotations

import time

import pytest

import rollbox
from rollbox import Sandbox, SandboxPool
from rollbox.config import Paths
from rollbox.runtime import cgroups
from rollbox.sdk.sandbox import default_client

from tests.system.conftest import host_traces


def _wait_ready(snap: str, n: int) -> None:
    deadline = time.monotonic() + 60
    while default_client().request("GET", f"/snapshots/{snap}/warm")["ready"] < n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert default_client().request("GET", f"/snapshots/{snap}/warm")["ready"] >= n


def test_warm_pool_hands_out_fresh_spares_and_drains() -> None:
    c = default_client()
    src = Sandbox(memory=256).create()
    src.fs.write_file("/work/state", b"captured")
    snap = src.snapshot_memory()
    src.terminate()
    try:
        c.request("PUT", f"/snapshots/{snap}/warm", json={"count": 2, "idle_seconds": 3})
        _wait_ready(snap, 2)
        with pytest.raises(rollbox.InvalidState, match="warm pool"):
            c.request("DELETE", f"/snapshots/{snap}")
        got = []
        for _ in range(4):
            sb = Sandbox().create_from_memory_snapshot(snap)
            assert sb.fs.read_file("/work/state") == b"captured"
            sb.fs.write_file("/work/state", b"dirty")  # must never reach another episode
            got.append(sb.sandbox_id)
            sb.terminate()
        assert len(set(got)) == 4
        # Unused for idle_seconds: drained to zero, no spare left running.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st = c.request("GET", f"/snapshots/{snap}/warm")
            spares = [s for s in c.request("GET", "/sandboxes") if s["tags"].get("rollbox.warm") == snap]
            if st["drained"] and not spares:
                break
            time.sleep(0.5)
        assert st["drained"] and spares == []
        # The pool API of SandboxPool: warm while open, removed on close.
        with SandboxPool(snap, max_concurrency=2, warm=2) as pool:
            res = list(pool.map(lambda sb, t: sb.fs.read_file("/work/state") == b"captured", range(6),
                                progress=False))
        assert [r.reward for r in res] == [1.0] * 6
        assert c.request("GET", f"/snapshots/{snap}/warm")["target"] == 0
    finally:
        c.request("PUT", f"/snapshots/{snap}/warm", json={"count": 0})
        c.request("DELETE", f"/snapshots/{snap}")


def _spare_of(snap: str) -> str:
    spares = [s["sandbox_id"] for s in default_client().request("GET", "/sandboxes")
              if s["tags"].get("rollbox.warm") == snap]
    assert len(spares) == 1, spares
    return spares[0]


def _frozen_spare_snapshot() -> str:
    """A snapshot with a warm pool of one ready spare."""
    src = Sandbox(memory=256).create()
    snap = src.snapshot_memory()
    src.terminate()
    default_client().request("PUT", f"/snapshots/{snap}/warm", json={"count": 1, "idle_seconds": 60})
    _wait_ready(snap, 1)
    return snap


def _drop(snap: str) -> None:
    c = default_client()
    c.request("PUT", f"/snapshots/{snap}/warm", json={"count": 0})
    c.request("DELETE", f"/snapshots/{snap}")


def test_a_ready_spare_waits_frozen_and_runs_once_handed_out(paths: Paths) -> None:
    snap = _frozen_spare_snapshot()
    try:
        sid = _spare_of(snap)
        cid = sid.removeprefix("sb-")
        assert cgroups.is_frozen(cid, paths.cgroup_parent)
        used = cgroups.cpu_seconds(cid, paths.cgroup_parent)
        time.sleep(0.5)
        assert cgroups.cpu_seconds(cid, paths.cgroup_parent) == used  # an idle systrap sandbox spins; frozen: none
        sb = Sandbox().create_from_memory_snapshot(snap)
        assert sb.sandbox_id == sid  # the spare, handed out
        assert not cgroups.is_frozen(cid, paths.cgroup_parent)
        assert sb.exec("echo", "hi", timeout=10).stdout == b"hi\n"
        sb.terminate()
    finally:
        _drop(snap)


def test_a_frozen_spare_ends_at_once_leaving_nothing(paths: Paths) -> None:
    """A frozen process cannot die, not even of SIGKILL: teardown thaws first (without it
    `runsc delete` timed out after 20 s and the sandbox's processes stayed, frozen)."""
    snap = _frozen_spare_snapshot()
    try:
        sid = _spare_of(snap)
        assert cgroups.is_frozen(sid.removeprefix("sb-"), paths.cgroup_parent)
        t = time.monotonic()
        default_client().request("DELETE", f"/sandboxes/{sid}")
        assert time.monotonic() - t < 15
        assert host_traces(paths, sid) == []
    finally:
        _drop(snap)  # the refill's spare, frozen too, ends the same way (the leak check sees it)


def test_a_frozen_spare_answers_a_request_by_id(paths: Paths) -> None:
    snap = _frozen_spare_snapshot()
    try:
        sid = _spare_of(snap)
        res = rollbox.SandboxInstance(sid, default_client()).exec("echo", "up", timeout=10)
        assert res.stdout == b"up\n"
        assert not cgroups.is_frozen(sid.removeprefix("sb-"), paths.cgroup_parent)
    finally:
        _drop(snap)
