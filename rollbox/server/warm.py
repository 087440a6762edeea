"""Warm pools: sandboxes restored from a snapshot ahead of demand.

`set(snapshot_id, count, idle_seconds)` keeps `count` spares restored; `take(snapshot_id)`
hands one out (a dictionary pop and one agent round trip, instead of a ~200 ms
`runsc restore`) and starts a refill. A ready spare waits in the cgroup freezer (no CPU; an
idle systrap sandbox spins ~3-5% of a core) and is thawed as it is handed out, or by any
request on it; teardown thaws before it kills. Every spare is a separate restore, so each has its own
entropy and sandbox id, and none is handed out twice. A pool unused for `idle_seconds` drains
to zero (scale to zero) and fills again on its next use. Spares carry the tag `rollbox.warm`
and a keep_warm of `idle_seconds`, so a spare orphaned by a daemon crash still expires.
A restore that fails is tried again (tenacity) after 1 s, 2 s, 4 s, ... (at most 30 s) for as
long as the pool still lacks that spare.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import tenacity

from .. import errors
from ..runtime import cgroups
from ..volumes.writers import exclusive_writes
from .validation import container_id

if TYPE_CHECKING:
    from ..types import SandboxInfo
    from .service import SandboxService

log = logging.getLogger("rollbox.warm")
MAX_SPARES = 64
FILL_RETRY_FIRST_S = 1.0  # seconds before the second try of a failed restore; doubling after
FILL_RETRY_MAX_S = 30.0


class _NotNeeded(Exception):
    """The pool no longer lacks the spare a failed restore was being retried for."""


@dataclass
class WarmPool:
    snapshot_id: str
    target: int
    idle_seconds: float
    spares: deque[str] = field(default_factory=deque)
    filling: int = 0
    last_used: float = field(default_factory=time.monotonic)
    drained: bool = False
    failures: int = 0


class WarmPools:
    def __init__(self, service: "SandboxService") -> None:
        self.svc = service
        self.pools: dict[str, WarmPool] = {}

    def set(self, snapshot_id: str, count: int, idle_seconds: float = 300.0) -> dict[str, object]:
        """Sets the pool's size (0 removes it and terminates its spares)."""
        meta = self.svc.snapshots.meta(snapshot_id)
        rw = exclusive_writes(meta.volumes)
        if count and rw:
            raise errors.VolumeBusy(f"snapshot {snapshot_id} mounts volume {rw[0]!r} read-write: its spares and the "
                                    "sandboxes handed out would all write it at once, which gVisor cannot keep intact; "
                                    "snapshot a sandbox that mounts it with read_only=True (or shared_writes=True "
                                    "if each sandbox writes its own files)")
        if not 0 <= count <= MAX_SPARES:
            raise errors.InvalidArgument(f"warm count={count} must be between 0 and {MAX_SPARES}")
        if not idle_seconds > 0:
            raise errors.InvalidArgument(f"idle_seconds={idle_seconds} must be a positive number of seconds")
        pool = self.pools.get(snapshot_id)
        if count == 0:
            if pool is not None:
                del self.pools[snapshot_id]
                self._drain(pool)
            return {"snapshot_id": snapshot_id, "target": 0, "ready": 0}
        if pool is None:
            pool = self.pools[snapshot_id] = WarmPool(snapshot_id, count, idle_seconds)
        pool.target, pool.idle_seconds, pool.drained = count, idle_seconds, False
        pool.last_used = time.monotonic()
        self._refill(pool)
        return self.status(snapshot_id)

    async def set_and_settle(self, snapshot_id: str, count: int, idle_seconds: float = 300.0) -> dict[str, object]:
        """`set`, and when removing a pool, wait (up to 60 s) for its restores in flight to
        finish and be torn down, so the snapshot is free to delete on return."""
        pool = self.pools.get(snapshot_id)
        out = self.set(snapshot_id, count, idle_seconds)
        if count == 0 and pool is not None:
            deadline = time.monotonic() + 60
            while pool.filling and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return out

    def status(self, snapshot_id: str) -> dict[str, object]:
        pool = self.pools.get(snapshot_id)
        if pool is None:
            return {"snapshot_id": snapshot_id, "target": 0, "ready": 0, "filling": 0}
        return {"snapshot_id": snapshot_id, "target": pool.target, "ready": len(pool.spares),
                "filling": pool.filling, "drained": pool.drained, "idle_seconds": pool.idle_seconds}

    def in_use(self, snapshot_id: str) -> bool:
        return snapshot_id in self.pools

    def take(self, snapshot_id: str) -> str | None:
        """A ready spare's sandbox id, or None (then the caller restores as usual)."""
        pool = self.pools.get(snapshot_id)
        if pool is None:
            return None
        pool.last_used = time.monotonic()
        if pool.drained:
            pool.drained = False
        sid = None
        while pool.spares:
            cand = pool.spares.popleft()
            if self.svc.is_live(cand):
                sid = cand
                break
        if sid is not None:
            self.thaw(sid)
        self._refill(pool)
        return sid

    def freeze(self, sandbox_id: str) -> None:
        """Holds a ready spare in the cgroup freezer (cgroups.freeze): an idle systrap sandbox
        spins ~3-5% of a core, and with `warm=C` beside C episodes running, C spares each
        waiting an episode's length cost ~30% more CPU per episode (measured, HumanEval c=8).
        A spare that cannot be frozen simply stays running."""
        lv = self.svc.live.get(sandbox_id)
        if lv is not None and not lv.frozen and cgroups.freeze(container_id(sandbox_id), self.svc.cg):
            lv.frozen = True

    def thaw(self, sandbox_id: str) -> None:
        """Lets a frozen spare run again (before anything is asked of it)."""
        lv = self.svc.live.get(sandbox_id)
        if lv is not None and lv.frozen:
            cgroups.thaw(container_id(sandbox_id), self.svc.cg)
            lv.frozen = False

    def _refill(self, pool: WarmPool) -> None:
        while not pool.drained and len(pool.spares) + pool.filling < pool.target and self.pools.get(pool.snapshot_id) is pool:
            pool.filling += 1
            self.svc.spawn(self._fill_one(pool))

    def _lacks_one(self, pool: WarmPool) -> bool:
        """The pool is still in place and short of spares, not counting the caller's own
        restore in flight."""
        return (self.pools.get(pool.snapshot_id) is pool and not pool.drained
                and len(pool.spares) + pool.filling - 1 < pool.target)

    def _failed(self, pool: WarmPool, state: tenacity.RetryCallState) -> None:
        pool.failures += 1
        err = state.outcome.exception() if state.outcome else None
        log.warning("warm pool %s: a restore failed (%s); retrying in %.0f s", pool.snapshot_id, err,
                    state.next_action.sleep if state.next_action else 0.0)

    async def _restore_retrying(self, pool: WarmPool) -> "SandboxInfo":
        """One spare restored; a RollboxError is retried with backoff while the pool lacks it.

        Raises:
            _NotNeeded: the pool was removed, drained or filled while this one backed off.
        """
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(multiplier=FILL_RETRY_FIRST_S, max=FILL_RETRY_MAX_S),
            retry=tenacity.retry_if_exception_type(errors.RollboxError),
            before_sleep=lambda state: self._failed(pool, state), reraise=True)
        async for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1 and not self._lacks_one(pool):
                    raise _NotNeeded
                return await self.svc.restore(pool.snapshot_id, keep_warm_seconds=pool.idle_seconds,
                                              tags={"rollbox.warm": pool.snapshot_id})
        raise AssertionError("unreachable: tenacity retries until it returns")

    async def _fill_one(self, pool: WarmPool) -> None:
        try:
            info = await self._restore_retrying(pool)
        except _NotNeeded:
            return
        finally:
            pool.filling -= 1
        pool.failures = 0
        if self.pools.get(pool.snapshot_id) is pool and not pool.drained:
            self.freeze(info.sandbox_id)
            pool.spares.append(info.sandbox_id)
        else:
            self.svc.spawn(self.svc.terminate(info.sandbox_id, reason="warm_pool_drained"))

    def _drain(self, pool: WarmPool) -> None:
        pool.drained = True
        while pool.spares:
            self.svc.spawn(self.svc.terminate(pool.spares.popleft(), reason="warm_pool_drained"))

    def expire(self) -> None:
        """Drains pools unused for their idle_seconds (called by the watchdog)."""
        now = time.monotonic()
        for pool in self.pools.values():
            if not pool.drained and now - pool.last_used > pool.idle_seconds:
                log.info("warm pool %s idle for %.0f s; draining", pool.snapshot_id, now - pool.last_used)
                self._drain(pool)
            # A spare's own keep_warm must not expire it while its pool is in use.
            for sid in pool.spares:
                self.svc.touch(sid, now)
