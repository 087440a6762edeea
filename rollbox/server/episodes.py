"""Episode pools: fresh containers inside pooled sandboxes (SandboxPool isolation="container").

Why: a `runsc restore` per episode costs ~140 ms of CPU (PLATFORM.md), which caps a 2-core
machine near 5 episodes/s. An episode pool restores a few sandboxes from the snapshot once and
runs each episode in a fresh container inside one of them (agent/zygote.py: own PID, mount,
IPC, UTS and network namespaces in gVisor's kernel, a copy-on-write root, discarded after the
episode). Episodes in one pooled sandbox share its gVisor kernel, never the host's.
On the runc tier (runtime="runc") the pooled sandboxes are runc sandboxes booted from the
snapshot's files, and the containers run on the host kernel (each with the runc tier's
seccomp denylist and masked /proc: agent/seccomp.py, agent/nsutil.py).

Memory: gVisor's limit covers a whole sandbox, so each container's processes get an address
space limit (RLIMIT_AS) of the snapshot's memory limit: one container's runaway allocation
fails inside it and its neighbours go on; containers that together exceed the sandbox's limit
end it, and every episode running there is reported `oom`.

A pooled sandbox is retired (no new episodes; terminated once its running ones end, replaced
by a fresh restore on demand) after `episodes_per_sandbox` episodes, after an episode that
ended `oom`, `timeout` or `error`-from-infrastructure, and whenever a container could not be
made or destroyed cleanly. So an anomaly costs one restore, never a leak into a later episode.

Ownership: a pool is leased to the client that opened it. Every call renews the lease, the SDK
sends a heartbeat every `lease_s / 3` seconds, and a pool not heard from for `lease_s`
(default 60 s) is closed by the daemon: a trainer that dies leaves no sandbox spinning until
`keep_warm_seconds` (pooled sandboxes keep that as their backstop too). They carry the tag
`rollbox.episode_pool`; `close()` (and the SDK's pool close) terminates them.

Thread-safety: all methods run on the daemon's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import errors
from ..runtime.channel import AgentError

if TYPE_CHECKING:
    from .service import SandboxService

log = logging.getLogger("rollbox.episodes")

# Episodes a pooled sandbox serves before it is replaced by a fresh restore: bounds what a
# gVisor-kernel-level trace (page cache, kernel memory growth) could ever accumulate.
DEFAULT_EPISODES_PER_SANDBOX = 256
# Episode containers running at once in one pooled sandbox (its CPU quota is the snapshot's).
DEFAULT_CONTAINERS_PER_SANDBOX = 2
# Episode statuses after which the pooled sandbox is not trusted with another episode.
RETIRING_STATUSES = frozenset({"oom", "timeout", "infra_error"})
CREATE_WAIT_S = 30.0
DEFAULT_LEASE_S = 60.0
LEASE_CHECK_S = 1.0
DESTROY_WAIT_S = 30.0


@dataclass
class PooledSandbox:
    sandbox_id: str
    running: set[str] = field(default_factory=set)  # container ids
    served: int = 0
    retired: bool = False


@dataclass
class EpisodePool:
    pool_id: str
    snapshot_id: str
    max_sandboxes: int
    containers_per_sandbox: int
    episodes_per_sandbox: int
    keep_warm_seconds: float | None
    root_mib: int
    as_mib: int
    tags: dict[str, str]
    sandboxes: dict[str, PooledSandbox] = field(default_factory=dict)
    starting: int = 0
    closed: bool = False
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    episodes: int = 0
    restores: int = 0
    lease_s: float = DEFAULT_LEASE_S
    last_seen: float = field(default_factory=time.monotonic)
    runtime: str = "gvisor"


def _new_container_id() -> str:
    return "ct-" + secrets.token_hex(8)  # fixed length: no id is a prefix of another


class EpisodePools:
    """The daemon's episode pools (one per open SandboxPool in container mode)."""

    def __init__(self, service: "SandboxService") -> None:
        self.service = service
        self.pools: dict[str, EpisodePool] = {}
        self._expiry: asyncio.Task[None] | None = None

    def open(self, snapshot_id: str, *, max_concurrency: int, sandboxes: int | None = None,
             episodes_per_sandbox: int = DEFAULT_EPISODES_PER_SANDBOX, keep_warm_seconds: float | None = 600,
             root_mib: int | None = None, tags: dict[str, str] | None = None,
             lease_s: float = DEFAULT_LEASE_S, runtime: str = "gvisor") -> dict[str, Any]:
        """Opens a pool over `snapshot_id` for `max_concurrency` concurrent episodes.

        Args:
            sandboxes: pooled sandboxes at most (default: one per DEFAULT_CONTAINERS_PER_SANDBOX
                concurrent episodes, at least one).
            episodes_per_sandbox: episodes one pooled sandbox serves before a fresh restore.
            root_mib: MiB each container may write (its tmpfs upper, counted against the pooled
                sandbox's memory); default a quarter of the snapshot's memory limit.
            lease_s: seconds without a call or heartbeat after which the daemon closes the pool.
            runtime: "gvisor" (pooled sandboxes restored from the snapshot, its memory and
                running processes included) or "runc" (pooled runc sandboxes booted with the
                snapshot's image, limits and files, not its memory: runc has no memory
                snapshots here; containers then share the host kernel, see runtime/runc.py).

        Raises:
            SnapshotNotFound: no such snapshot. InvalidArgument: a bad number or runtime.
            RuntimeMissing: runc is not installed.
        """
        meta = self.service.snapshots.meta(snapshot_id)
        if runtime not in ("gvisor", "runc"):
            raise errors.InvalidArgument(f"runtime={runtime!r}: episode pools run on 'gvisor' or 'runc'")
        if runtime != "gvisor":
            self.service.drivers[runtime].check()  # RuntimeMissing with the install hint
        if not lease_s > 0:
            raise errors.InvalidArgument(f"lease_s={lease_s} must be a positive number of seconds")
        if max_concurrency < 1 or episodes_per_sandbox < 1 or (sandboxes is not None and sandboxes < 1):
            raise errors.InvalidArgument(
                f"episode pool needs max_concurrency >= 1, episodes_per_sandbox >= 1 and sandboxes >= 1 "
                f"(got {max_concurrency}, {episodes_per_sandbox}, {sandboxes})")
        n = sandboxes or max(1, math.ceil(max_concurrency / DEFAULT_CONTAINERS_PER_SANDBOX))
        n = min(n, max_concurrency)
        root = root_mib or max(32, meta.memory_mib // 4)
        if root >= meta.memory_mib:
            raise errors.InvalidArgument(f"root_mib={root} must be under the snapshot's memory limit "
                                         f"({meta.memory_mib} MiB): a container's writes are held in memory")
        pool = EpisodePool(pool_id="ep-" + secrets.token_hex(8), snapshot_id=snapshot_id, max_sandboxes=n,
                           containers_per_sandbox=math.ceil(max_concurrency / n),
                           episodes_per_sandbox=episodes_per_sandbox, keep_warm_seconds=keep_warm_seconds,
                           root_mib=root, as_mib=meta.memory_mib, tags=dict(tags or {}), lease_s=lease_s,
                           runtime=runtime)
        self.pools[pool.pool_id] = pool
        if self._expiry is None or self._expiry.done():
            self._expiry = asyncio.ensure_future(self._expire_loop())
        return self.describe(pool.pool_id)

    def _pool(self, pool_id: str) -> EpisodePool:
        pool = self.pools.get(pool_id)
        if pool is None or pool.closed:
            raise errors.EpisodePoolNotFound(f"episode pool {pool_id} not found (closed, its lease expired, or "
                                             "opened on another daemon); open a new SandboxPool")
        pool.last_seen = time.monotonic()
        return pool

    def heartbeat(self, pool_id: str) -> dict[str, Any]:
        """Renews the pool's lease. Raises EpisodePoolNotFound once it was closed or expired."""
        pool = self._pool(pool_id)
        return {"pool_id": pool_id, "lease_s": pool.lease_s}

    async def _expire_loop(self) -> None:
        while self.pools:
            await asyncio.sleep(LEASE_CHECK_S)
            now = time.monotonic()
            for pid, pool in list(self.pools.items()):
                if now - pool.last_seen > pool.lease_s:
                    log.warning("episode pool %s: no call or heartbeat for %.0f s (its client is gone?); "
                                "closing it", pid, now - pool.last_seen)
                    await self.close(pid)

    def listing(self) -> list[dict[str, Any]]:
        """Every open pool, as `describe` gives it (listing renews no lease)."""
        return [self._describe(p) for p in self.pools.values() if not p.closed]

    def describe(self, pool_id: str) -> dict[str, Any]:
        return self._describe(self._pool(pool_id))

    def _describe(self, pool: EpisodePool) -> dict[str, Any]:
        return {"pool_id": pool.pool_id, "snapshot_id": pool.snapshot_id, "max_sandboxes": pool.max_sandboxes,
                "containers_per_sandbox": pool.containers_per_sandbox,
                "episodes_per_sandbox": pool.episodes_per_sandbox, "episodes": pool.episodes,
                "restores": pool.restores, "root_mib": pool.root_mib, "lease_s": pool.lease_s,
                "runtime": pool.runtime,
                "sandboxes": [{"sandbox_id": p.sandbox_id, "running": len(p.running), "served": p.served,
                               "retired": p.retired} for p in pool.sandboxes.values()]}

    def _drop_ended(self, pool: EpisodePool) -> None:
        """Forgets pooled sandboxes that ended by themselves (keep_warm expiry while the pool
        sat idle, out of memory, killed): a container made there could only fail, and after a
        long idle spell every one of them has ended."""
        for sid, p in list(pool.sandboxes.items()):
            if sid not in self.service.live:
                p.retired = True
                if not p.running:
                    del pool.sandboxes[sid]

    def _free_slot(self, pool: EpisodePool) -> PooledSandbox | None:
        self._drop_ended(pool)
        best = None
        for p in pool.sandboxes.values():
            if p.retired or len(p.running) >= pool.containers_per_sandbox:
                continue
            if p.served + len(p.running) >= pool.episodes_per_sandbox:
                continue
            if best is None or len(p.running) < len(best.running):
                best = p
        return best

    async def _restore(self, pool: EpisodePool) -> None:
        tags = {**pool.tags, "rollbox.episode_pool": pool.pool_id}
        try:
            if pool.runtime == "gvisor":
                info = await self.service.acquire(pool.snapshot_id, keep_warm_seconds=pool.keep_warm_seconds,
                                                  tags=tags)
            else:
                info = await self.service.booter.boot_from_files(
                    pool.snapshot_id, runtime=pool.runtime, keep_warm_seconds=pool.keep_warm_seconds, tags=tags)
        except errors.RollboxError as e:
            log.warning("episode pool %s: restoring a pooled sandbox failed: %s", pool.pool_id, e)
            async with pool.changed:
                pool.starting -= 1
                pool.changed.notify_all()
            raise
        async with pool.changed:
            pool.starting -= 1
            pool.restores += 1
            if pool.closed:
                self.service.spawn(self.service.terminate(info.sandbox_id, reason="episode pool closed"))
            else:
                pool.sandboxes[info.sandbox_id] = PooledSandbox(info.sandbox_id)
            pool.changed.notify_all()

    async def _reserve(self, pool: EpisodePool) -> tuple[PooledSandbox, str]:
        deadline = time.monotonic() + CREATE_WAIT_S * 4
        async with pool.changed:
            while True:
                if pool.closed:
                    raise errors.EpisodePoolNotFound(f"episode pool {pool.pool_id} was closed")
                slot = self._free_slot(pool)
                if slot is not None:
                    cid = _new_container_id()
                    slot.running.add(cid)
                    return slot, cid
                live = sum(1 for p in pool.sandboxes.values() if not p.retired)
                if live + pool.starting < pool.max_sandboxes:
                    pool.starting += 1
                    restore = asyncio.ensure_future(self._restore(pool))
                    pool.changed.release()
                    try:
                        await restore  # a failed restore raises its typed (retryable) error here
                    finally:
                        await pool.changed.acquire()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.ResourceExhausted(f"episode pool {pool.pool_id}: no container slot freed up in "
                                                   f"{CREATE_WAIT_S * 4:.0f} s; end episodes or raise max_concurrency")
                try:
                    await asyncio.wait_for(pool.changed.wait(), timeout=left)
                except asyncio.TimeoutError:
                    pass

    async def begin(self, pool_id: str, *, env: dict[str, str] | None = None) -> dict[str, Any]:
        """A fresh container for one episode: {"sandbox_id", "container_id", "setup_cpu_ms"}
        (the CPU the container's init spent setting it up, as gVisor accounts it).

        Waits for a free slot (admission: at most `max_concurrency` at once per pool).

        Raises:
            EpisodePoolNotFound; SandboxLost (retryable) when the container could not be made,
            after which its pooled sandbox is retired.
        """
        pool = self._pool(pool_id)
        slot, cid = await self._reserve(pool)
        lv = self.service.live.get(slot.sandbox_id)
        # The pooled sandbox's volumes, bound into the container read-write (shared, as a
        # fleet's volume is meant to be): through the overlay they would be copied up instead.
        binds = [v["mount_path"] for v in (lv.volumes if lv else [])]
        try:
            made = await self.service.execfiles.agent_request(
                slot.sandbox_id, "container_create", CREATE_WAIT_S, cid=cid, hostname=cid,
                env={"ROLLBOX_CONTAINER_ID": cid, "ROLLBOX_SANDBOX_ID": cid, **(env or {})},
                root_mib=pool.root_mib, as_mib=pool.as_mib, binds=binds)
        except (AgentError, errors.RollboxError) as e:
            await self._release(pool, slot, cid, retire=True)
            if isinstance(e, AgentError) and e.kind == "container_unavailable":
                raise errors.UnsupportedOperation(
                    f"episode containers are unavailable in sandboxes of snapshot {pool.snapshot_id}: {e}; "
                    "container isolation needs python3 (>= 3.8) in the image and a snapshot made by this "
                    "rollbox version (re-create the snapshot), or use isolation='sandbox'") from None
            raise errors.SandboxLost(f"episode pool {pool_id}: making a container in {slot.sandbox_id} failed: "
                                     f"{e}", sandbox_id=slot.sandbox_id) from None
        pool.episodes += 1
        return {"sandbox_id": slot.sandbox_id, "container_id": cid,
                "setup_cpu_ms": round(float(made.get("setup_cpu_ms") or 0.0), 2)}

    async def end(self, pool_id: str, container_id: str, *, status: str = "ok") -> dict[str, Any]:
        """Destroys an episode's container (every process of it killed, its files discarded).

        status: the episode's status; one in RETIRING_STATUSES retires the pooled sandbox.
        Raises ContainerNotFound for an unknown (or already ended) container.
        """
        pool = self._pool(pool_id)
        slot = next((p for p in pool.sandboxes.values() if container_id in p.running), None)
        if slot is None:
            raise errors.ContainerNotFound(f"container {container_id} is not running in episode pool {pool_id}")
        retire = status in RETIRING_STATUSES
        destroyed = False
        try:
            reply = await self.service.execfiles.agent_request(slot.sandbox_id, "container_destroy", DESTROY_WAIT_S,
                                                     cid=container_id)
            destroyed = bool(reply.get("ok", True))
            if reply.get("init_lost"):
                log.warning("episode pool %s: a process of %s killed or stopped its init in %s; retiring the sandbox",
                            pool_id, container_id, slot.sandbox_id)
                retire = True
            if reply.get("leftovers"):
                log.warning("episode pool %s: %s left %s processes behind in %s; retiring the sandbox", pool_id,
                            container_id, reply["leftovers"], slot.sandbox_id)
                destroyed = False
        except (AgentError, errors.RollboxError) as e:
            log.info("episode pool %s: destroying %s in %s: %s; retiring the sandbox", pool_id, container_id,
                     slot.sandbox_id, e)
        await self._release(pool, slot, container_id, retire=retire or not destroyed)
        return {"container_id": container_id, "destroyed": destroyed, "retired": slot.retired}

    async def end_many(self, pool_id: str, ends: list[tuple[str, str]]) -> None:
        """Ends several containers at once ((container_id, status) pairs); unknown or already
        ended ones are skipped, as a client resending an end after a lost answer expects."""
        async def one(cid: str, status: str) -> None:
            try:
                await self.end(pool_id, cid, status=status)
            except errors.ContainerNotFound:
                pass
        await asyncio.gather(*(one(cid, status) for cid, status in ends))

    async def _release(self, pool: EpisodePool, slot: PooledSandbox, cid: str, *, retire: bool) -> None:
        async with pool.changed:
            slot.running.discard(cid)
            slot.served += 1
            if retire or slot.served >= pool.episodes_per_sandbox:
                slot.retired = True
            if slot.retired and not slot.running:
                pool.sandboxes.pop(slot.sandbox_id, None)
                self.service.spawn(self.service.terminate(slot.sandbox_id, reason="episode pool recycled"))
            pool.changed.notify_all()

    def forget_sandbox(self, sandbox_id: str) -> None:
        """A pooled sandbox ended by itself (oom, killed): its slots go, a restore replaces it."""
        for pool in self.pools.values():
            slot = pool.sandboxes.get(sandbox_id)
            if slot is not None:
                slot.retired = True

    async def close(self, pool_id: str) -> dict[str, Any]:
        """Terminates every pooled sandbox of the pool (their containers with them). Idempotent."""
        pool = self.pools.pop(pool_id, None)
        if pool is None:
            return {"pool_id": pool_id, "closed": True, "terminated": 0}
        async with pool.changed:
            pool.closed = True
            ids = list(pool.sandboxes)
            pool.sandboxes.clear()
            pool.changed.notify_all()
        for sid in ids:
            try:
                await self.service.terminate(sid, reason="episode pool closed")
            except errors.RollboxError:
                pass
        return {"pool_id": pool_id, "closed": True, "terminated": len(ids)}
