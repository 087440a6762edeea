"""The warm pool's refill policy (server/warm.py) against a small in-process service: a failed
restore is retried with backoff while the pool lacks the spare, and given up once it does not."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from rollbox import errors
from rollbox.server import warm
from rollbox.server.warm import WarmPools
from rollbox.snapshots.store import SnapshotMeta
from rollbox.types import SandboxInfo


class Service:
    """What WarmPools uses of SandboxService: snapshots.meta, spawn, restore, live, terminate."""

    def __init__(self, faults: int, volumes: list[dict[str, Any]] | None = None) -> None:
        self.faults = faults
        self.volumes = volumes or []
        self.restores = 0
        self.live: dict[str, object] = {}
        self.cg = "rollbox-unit-no-such-parent"  # no freezer there: spares stay running
        self.tasks: list[asyncio.Task[Any]] = []
        self.snapshots = self
        self.terminated: list[str] = []

    def meta(self, snapshot_id: str) -> SnapshotMeta:
        return SnapshotMeta(snapshot_id, "sb-src", "im-x", 1.0, 256, volumes=self.volumes)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))

    async def restore(self, snapshot_id: str, **kw: Any) -> SandboxInfo:
        self.restores += 1
        if self.faults:
            self.faults -= 1
            raise errors.SandboxLost(f"restore {self.restores} failed")
        sid = f"sb-{self.restores:032d}"
        self.live[sid] = SimpleNamespace(frozen=False)
        return SandboxInfo(sandbox_id=sid, state="running", image_id="im-x", created_at=0.0, cpu=1.0,
                           memory_mib=256, keep_warm_seconds=kw.get("keep_warm_seconds"))

    async def terminate(self, sandbox_id: str, reason: str = "") -> None:
        self.terminated.append(sandbox_id)

    def is_live(self, sandbox_id: str) -> bool:
        return sandbox_id in self.live

    async def settle(self) -> None:
        while any(not t.done() for t in self.tasks):
            await asyncio.gather(*self.tasks)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "FILL_RETRY_FIRST_S", 0.0)


def test_a_failed_restore_is_retried_until_the_spare_is_there() -> None:
    async def go() -> tuple[Service, WarmPools]:
        svc = Service(faults=2)
        pools = WarmPools(svc)  # type: ignore[arg-type]
        pools.set("sn-1", 1)
        await svc.settle()
        return svc, pools

    svc, pools = asyncio.run(go())
    assert svc.restores == 3
    assert pools.status("sn-1")["ready"] == 1 and pools.status("sn-1")["filling"] == 0
    assert pools.pools["sn-1"].failures == 0  # reset by the success


def test_a_ready_spare_waits_frozen_and_is_thawed_as_it_is_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(warm.cgroups, "freeze", lambda cid, parent: calls.append(("freeze", cid)) or True)
    monkeypatch.setattr(warm.cgroups, "thaw", lambda cid, parent: calls.append(("thaw", cid)))

    async def go() -> tuple[Service, WarmPools, str | None]:
        svc = Service(faults=0)
        pools = WarmPools(svc)  # type: ignore[arg-type]
        pools.set("sn-1", 1)
        await svc.settle()
        return svc, pools, pools.take("sn-1")

    svc, pools, sid = asyncio.run(go())
    assert sid is not None
    cid = sid.removeprefix("sb-")
    assert calls[:2] == [("freeze", cid), ("thaw", cid)]  # frozen while it waited, running once taken
    assert svc.live[sid].frozen is False  # type: ignore[attr-defined]
    # The refill's spare is frozen in its turn, and not yet thawed.
    assert [c for c in calls[2:] if c[0] == "thaw"] == []


def test_a_spare_no_freezer_takes_stays_running_and_is_not_thawed(monkeypatch: pytest.MonkeyPatch) -> None:
    thawed: list[str] = []
    monkeypatch.setattr(warm.cgroups, "thaw", lambda cid, parent: thawed.append(cid))

    async def go() -> str | None:
        svc = Service(faults=0)
        pools = WarmPools(svc)  # type: ignore[arg-type]
        pools.set("sn-1", 1)
        await svc.settle()
        return pools.take("sn-1")

    assert asyncio.run(go()) is not None
    assert thawed == []  # the unit parent has no freezer: nothing was frozen


def test_a_retry_stops_once_the_pool_is_gone() -> None:
    async def go() -> tuple[Service, WarmPools, int]:
        svc = Service(faults=10**6)
        pools = WarmPools(svc)  # type: ignore[arg-type]
        pools.set("sn-1", 1)
        while svc.restores < 3:  # failing over and over
            await asyncio.sleep(0)
        pools.set("sn-1", 0)
        before = svc.restores
        await svc.settle()
        return svc, pools, before

    svc, pools, before = asyncio.run(go())
    assert svc.restores <= before + 1  # at most the try already under way
    assert pools.status("sn-1") == {"snapshot_id": "sn-1", "target": 0, "ready": 0, "filling": 0}


def test_no_warm_pool_of_a_snapshot_that_writes_a_volume_gh19() -> None:
    """Its spares and the sandboxes handed out would all mount the volume read-write at once."""
    svc = Service(faults=0, volumes=[{"name": "v", "mount_path": "/data"}])
    pools = WarmPools(svc)  # type: ignore[arg-type]
    with pytest.raises(errors.VolumeBusy, match="read_only=True"):
        pools.set("sn-1", 2)
    assert svc.restores == 0 and pools.status("sn-1")["target"] == 0
    pools.set("sn-1", 0)  # removing none is fine


def test_a_snapshot_that_reads_a_volume_has_a_warm_pool_gh19() -> None:
    async def go() -> tuple[Service, WarmPools]:
        svc = Service(faults=0, volumes=[{"name": "v", "mount_path": "/data", "read_only": True}])
        pools = WarmPools(svc)  # type: ignore[arg-type]
        pools.set("sn-1", 2)
        await svc.settle()
        return svc, pools

    svc, pools = asyncio.run(go())
    assert svc.restores == 2 and pools.status("sn-1")["ready"] == 2
