"""SandboxPool: fan episodes out over fresh sandboxes restored from one memory snapshot.

Each episode: restore a fresh sandbox → `run_episode(sb, task)` → terminate. Outcomes:

- `ok`: the function returned; `reward` is derived from its value.
- `timeout`: the episode ran past `timeout` seconds, or an exec in it timed out: reward 0.
  (A timeout is a zero-reward sample, as RL trainers expect.)
- `oom`: the sandbox ran out of memory during the episode: reward 0.
- `error`: the function raised (the episode code failed): reward 0.
- `infra_error`: the platform failed (sandbox lost, daemon gone, restore failed) on every one
  of `retries + 1` fresh sandboxes: reward None, never a silent 0.

A sandbox is never reused: a failed one is discarded with its episode attempt.

Streaming (actors that produce work continuously): `pool.submit(task)` returns a Future at
once and `pool.as_completed()` yields EpisodeResults as they land. While streaming, the
daemon's warm pool follows the queue: it is sized to the number of episodes submitted and not
yet finished (capped by `warm`, or by `max_concurrency` when `warm` is 0), and set to zero
when the queue drains (scale to zero). In container mode there is no warm pool to size: the
pooled sandboxes are restored on demand and serve many episodes each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import math
import numbers
import secrets
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from .. import errors
from ..client.portal import PORTAL
from ..client.transport import Client
from ..types import EpisodeResult
from ._aio import threaded_stream
from .backends import LOCAL, AttemptOutcome, EpisodeFn, PoolBackend, PoolSpec, get_backend, resolve_backend
from .containers import ContainerInstance, EpisodePoolClient
from .pool_stream import EpisodeStream
from .sandbox import Sandbox, SandboxInstance, default_client

Outcome = tuple[str, Any, "str | None", "SandboxInstance | None", "float | None", bool]

# SandboxPool's isolation modes: "sandbox" = a fresh gVisor sandbox restored per episode (the
# strongest: episodes share only the host kernel behind gVisor); "container" = a fresh
# container per episode inside pooled gVisor sandboxes (episodes share a gVisor kernel).
ISOLATIONS = ("sandbox", "container")
# Where container-mode episodes run: "gvisor" (pooled gVisor sandboxes) or "runc" (pooled runc
# sandboxes booted with the snapshot's files: the episodes share the host kernel).
RUNTIMES = ("gvisor", "runc")


def check_pool_modes(isolation: str, runtime: str) -> None:
    """Raises InvalidArgument unless `isolation` is in ISOLATIONS, `runtime` in RUNTIMES, and
    runtime="runc" comes with isolation="container" (runc restores no memory snapshot)."""
    if isolation not in ISOLATIONS:
        raise errors.InvalidArgument(f"isolation={isolation!r} must be one of {', '.join(ISOLATIONS)}")
    if runtime not in RUNTIMES:
        raise errors.InvalidArgument(f"runtime={runtime!r} must be one of {', '.join(RUNTIMES)}")
    if runtime == "runc" and isolation != "container":
        raise errors.InvalidArgument(
            "runtime='runc' needs isolation='container': runc has no memory snapshots to restore an episode "
            "sandbox from (for a fresh runc sandbox per episode, use Sandbox(runtime='runc').create())")


def reward_of(value: Any) -> float | None:
    """bool → 1.0/0.0; a number → float; a dict with 'reward' → that; otherwise None."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, numbers.Real):  # int, float, numpy scalars
        r = float(value)
        return r if math.isfinite(r) else None
    if isinstance(value, dict) and "reward" in value:
        return reward_of(value["reward"])
    return None


class SandboxPool:
    """Runs episodes concurrently, each in a fresh sandbox restored from `snapshot_id`.

    Args:
        snapshot_id: the memory snapshot every episode starts from (`sb.snapshot_memory()`).
        max_concurrency: episodes (so sandboxes) alive at once.
        keep_warm_seconds: the backstop TTL of each episode sandbox, in seconds.
        warm: sandboxes the daemon keeps restored ahead of demand while the pool is open
            (0: none). Handing one out skips the ~200 ms restore; each is still used once.
        warm_idle_seconds: a warm pool unused this long drains to zero (and refills on use).
        fn: the default episode function of `submit` (`fn(sandbox, task)`), or None.
        scale_down_after_s: while streaming, seconds the queue must stay shallower before the
            warm pool is shrunk (avoids churning spares between bursts of submits).
        backend: "local" (this machine's daemon) or "ray" (episodes scheduled over a Ray
            cluster, one daemon per node: rollbox.distributed); None: "ray" after
            `rollbox.init()`, else "local".
        isolation: "sandbox" (default: each episode in a fresh gVisor sandbox restored from
            the snapshot; episodes share nothing but the host kernel behind gVisor) or
            "container" (each episode in a fresh container - own PID, mount, IPC, UTS and
            network namespaces, a copy-on-write root, loopback only - inside a few pooled
            sandboxes restored once; episodes of one pooled sandbox share its gVisor kernel;
            several times the throughput). The snapshot's image needs python3 for containers.
        lease_s: seconds after which the daemon ends this pool's sandboxes (warm spares and
            pooled sandboxes included) when it stops hearing from this process (a thread
            renews the lease every lease_s / 3): a crashed trainer leaves nothing spinning.
        episodes_per_sandbox: container mode: episodes a pooled sandbox serves before it is
            replaced by a fresh restore (default 256); any oom, timeout or infrastructure
            fault replaces it at once.
        runtime: container mode only: "gvisor" (default) or "runc" (pooled runc sandboxes
            booted with the snapshot's image, limits and files, but not its memory or running
            processes: runc has no memory snapshots here; each container gets the runc tier's
            seccomp denylist and Docker's masked /proc, and episodes share the HOST kernel).

    Raises InvalidArgument for a bad argument, e.g. runtime="runc" with isolation="sandbox".

    Use as a context manager or call `close()`; closing waits for teardowns in flight.
    """

    def __init__(self, snapshot_id: str, max_concurrency: int = 16, *, keep_warm_seconds: float | None = 600,
                 warm: int = 0, warm_idle_seconds: float = 300.0, client: Client | None = None,
                 fn: Callable[[SandboxInstance, Any], Any] | None = None, scale_down_after_s: float = 2.0,
                 backend: str | None = None, isolation: str = "sandbox",
                 episodes_per_sandbox: int | None = None, lease_s: float = 60.0, runtime: str = "gvisor") -> None:
        check_pool_modes(isolation, runtime)
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise errors.InvalidArgument(f"snapshot_id={snapshot_id!r} must be a snapshot id string ('sn-...')")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise errors.InvalidArgument(f"max_concurrency={max_concurrency!r} must be an int >= 1")
        self.snapshot_id = snapshot_id
        self.max_concurrency = max_concurrency
        self.isolation = isolation
        self.runtime = runtime
        self.episodes_per_sandbox = episodes_per_sandbox
        self._containers: EpisodePoolClient | None = None
        self._containers_lock = threading.Lock()
        self.keep_warm_seconds = keep_warm_seconds
        self._client = client or default_client()
        self._sems: tuple[asyncio.Semaphore, asyncio.Semaphore] | None = None
        self._sems_generation = -1
        self._teardowns: set[asyncio.Task[None]] = set()  # on the SDK's loop
        self._closed = False
        # Every episode sandbox carries this tag, so close() can find one whose create reply
        # was lost (a daemon crash mid-request) and would otherwise live until its TTL.
        self.pool_id = secrets.token_hex(8)
        if isolation == "container" and warm:
            # Pooled sandboxes are restored once and serve every episode: nothing to keep warm.
            made = "booted once (runc) and reused" if runtime == "runc" else "restored once and reused"
            warnings.warn(f"SandboxPool(warm={warm}) has no effect with isolation='container' (its pooled "
                          f"sandboxes are {made}); it applies to isolation='sandbox'", stacklevel=2)
        self.warm = warm
        self.warm_idle_seconds = warm_idle_seconds
        self._warm_set = False
        self._aborted = False
        self.fn = fn
        self.scale_down_after_s = scale_down_after_s
        self._stream: EpisodeStream | None = None
        self.lease_s = lease_s
        self._lease_stop = threading.Event()
        self._lease_thread: threading.Thread | None = None
        self._remote: PoolBackend | None = None
        name = resolve_backend(backend)
        if name != LOCAL:
            self._remote = get_backend(name).open_pool(PoolSpec(
                self.pool_id, snapshot_id, max_concurrency, keep_warm_seconds, warm, warm_idle_seconds, self._client,
                isolation, runtime))

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "SandboxPool":
        return self

    async def __aexit__(self, *exc: object) -> None:
        """`async with SandboxPool(...)`: closes without blocking the caller's event loop."""
        await asyncio.to_thread(self.close)

    def _container_pool(self) -> EpisodePoolClient:
        with self._containers_lock:
            if self._containers is None:
                self._containers = EpisodePoolClient(
                    self._client, self.snapshot_id, max_concurrency=self.max_concurrency,
                    episodes_per_sandbox=self.episodes_per_sandbox, keep_warm_seconds=self.keep_warm_seconds,
                    tags={"rollbox.pool": self.pool_id}, lease_s=self.lease_s, runtime=self.runtime)
            return self._containers

    def _hold_lease(self, warm_snapshot: str | None = None) -> None:
        """Takes the daemon lease on this pool's sandboxes and keeps renewing it."""
        body = {"lease_s": self.lease_s, "warm_snapshot": warm_snapshot}
        with self._containers_lock:
            self._client.request("PUT", f"/leases/{self.pool_id}", json=body)
            if self._lease_thread is not None:
                return
            body = {"lease_s": self.lease_s, "warm_snapshot": None}
            def renew() -> None:
                while not self._lease_stop.wait(self.lease_s / 3):
                    try:
                        self._client.request("PUT", f"/leases/{self.pool_id}", json=body)
                    except errors.RollboxError:
                        continue  # a restarting daemon: the next renewal may get through
            self._lease_thread = threading.Thread(target=renew, daemon=True, name=f"rollbox-lease-{self.pool_id}")
            self._lease_thread.start()

    def start_warm(self) -> None:
        """Asks the daemon to keep `warm` sandboxes restored (done by `map` on first use)."""
        if self.isolation == "container":
            return  # pooled sandboxes are restored once each, on demand
        if self.warm and not self._warm_set:
            self._hold_lease(self.snapshot_id)
            self._client.request("PUT", f"/snapshots/{self.snapshot_id}/warm",
                                 json={"count": self.warm, "idle_seconds": self.warm_idle_seconds})
            self._warm_set = True

    def terminate_live(self) -> None:
        """Terminates every sandbox of this pool that is still alive (errors ignored)."""
        PORTAL.run(self._aterminate_live())

    async def _aterminate_live(self) -> None:
        c = self._client.aio
        try:
            rows = await c.request("GET", "/sandboxes")
        except errors.RollboxError:
            return
        mine = [r["sandbox_id"] for r in rows
                if isinstance(r, dict) and r.get("tags", {}).get("rollbox.pool") == self.pool_id]

        async def end(sandbox_id: str) -> None:
            try:
                await c.request("DELETE", f"/sandboxes/{sandbox_id}")
            except errors.RollboxError:
                pass
        await asyncio.gather(*(end(i) for i in mine))

    def close(self) -> None:
        """Waits for teardowns in flight, then terminates any sandbox of this pool still alive."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._closed = True
        PORTAL.run(self._drain_teardowns())
        PORTAL.drain()  # restores cancelled midway (an interrupted map) end when they land
        if self._remote is not None:
            self._remote.close()
            return
        if self._containers is not None:
            self._containers.close()
            self._containers = None
        if self._warm_set:
            try:
                self._client.request("PUT", f"/snapshots/{self.snapshot_id}/warm", json={"count": 0})
            except errors.RollboxError:
                pass
            self._warm_set = False
        self.terminate_live()
        self._lease_stop.set()
        if self._lease_thread is not None:
            try:
                self._client.request("DELETE", f"/leases/{self.pool_id}")
            except errors.RollboxError:
                pass

    # ---- one attempt (async, on the SDK's event loop) ---------------------------------------

    def _limits(self) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        """(episodes running, sandboxes alive): made on the SDK's loop on first use."""
        if self._sems is None or self._sems_generation != PORTAL.generation:
            # Sandboxes stay held from restore until their teardown is done, so their number
            # is bounded (max_concurrency running + a few being torn down) even when teardown
            # is slower than episodes; the slack lets the next episode start meanwhile.
            self._sems = (asyncio.Semaphore(self.max_concurrency),
                          asyncio.Semaphore(self.max_concurrency + max(2, self.max_concurrency // 2)))
            self._sems_generation = PORTAL.generation
        return self._sems

    async def _drain_teardowns(self) -> None:
        while self._teardowns:
            await asyncio.gather(*list(self._teardowns), return_exceptions=True)

    def _terminate_later(self, sb: SandboxInstance, status: str, slots: asyncio.Semaphore) -> None:
        async def go() -> None:
            try:
                if isinstance(sb, ContainerInstance):
                    sb.terminated = True
                    await sb._pool.aend(sb.container_id, status)
                else:
                    await sb.terminate.aio()
            except errors.RollboxError:
                pass
            finally:
                slots.release()
        task = asyncio.ensure_future(go())
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)
        # A script that returns right after `map` (no close()) still ends its last episodes'
        # sandboxes or containers before the interpreter goes: the exit drain waits for these.
        PORTAL.track(task)

    def attempt(self, fn: EpisodeFn, task: Any, timeout: float | None) -> AttemptOutcome:
        """One episode attempt on one fresh sandbox, classified as `map` classifies it (the
        public entry point of a backend's node: rollbox.sdk.backends).

        Raises:
            SnapshotNotFound, InvalidArgument: as `map` does (not retryable).
        """
        status, value, err, sb, ttfc_ms, retryable = PORTAL.run(self._attempt(fn, task, timeout, None))
        return AttemptOutcome(status, value, err, sb.sandbox_id if sb else None, ttfc_ms, retryable)

    async def _fresh_sandbox(self) -> SandboxInstance:
        if self.isolation == "container":
            pool = self._containers if self._containers is not None else await asyncio.to_thread(self._container_pool)
            return await pool.abegin()
        if self._lease_thread is None:
            await asyncio.to_thread(self._hold_lease)
        return await Sandbox(keep_warm_seconds=self.keep_warm_seconds, client=self._client,
                             tags={"rollbox.pool": self.pool_id}).create_from_memory_snapshot.aio(self.snapshot_id)

    async def _attempt(self, fn: EpisodeFn, task: Any, timeout: float | None,
                       user_loop: asyncio.AbstractEventLoop | None) -> Outcome:
        """One attempt on one fresh sandbox: (status, value, error, sandbox, ttfc_ms, retryable)."""
        _running, slots = self._limits()
        await slots.acquire()
        t0 = time.monotonic()
        sb: Any  # a SandboxInstance, or a ContainerInstance with the same episode API
        try:
            sb = await self._fresh_sandbox()
        except errors.RollboxError as e:
            slots.release()
            if isinstance(e, (errors.SnapshotNotFound, errors.InvalidArgument, errors.UnsupportedOperation,
                              errors.VolumeBusy)):
                raise
            return "infra_error", None, f"{type(e).__name__}: {e}", None, None, True
        except BaseException:
            slots.release()
            raise
        ttfc_ms = (time.monotonic() - t0) * 1000
        outcome: Outcome = ("infra_error", None, "episode did not finish", sb, ttfc_ms, True)
        try:
            box, finished = await _run_episode(fn, sb, task, timeout, user_loop)
            outcome = self._classify(sb, box, finished, timeout, ttfc_ms)
            return outcome
        finally:
            # Terminating also ends a runaway episode: its pending calls fail and it returns.
            self._terminate_later(sb, outcome[0], slots)

    @staticmethod
    def _classify(sb: SandboxInstance, box: dict[str, Any], finished: bool, timeout: float | None,
                  ttfc_ms: float) -> Outcome:
        if not finished:
            return "timeout", None, f"episode ran past {timeout} s", sb, ttfc_ms, False
        if getattr(sb, "saw_sandbox_oom", False) and getattr(sb, "shares_sandbox", False):
            # The pooled sandbox ran out of memory as a whole (gVisor's kernel memory, pipe
            # buffers say), which any episode in it may have caused: not this one's fault to
            # score, an infrastructure failure retried on a fresh pooled sandbox (break-it trial:
            # an innocent neighbour was scored `oom`, reward 0).
            return ("infra_error", None, "the pooled sandbox ran out of memory as a whole (this episode or another "
                    "in it); retried on a fresh one", sb, ttfc_ms, True)
        if sb.saw_oom:
            why = ("the sandbox ran out of memory" if getattr(sb, "saw_sandbox_oom", False)
                   else "a command ran out of memory and was killed (the sandbox went on)")
            return "oom", None, why, sb, ttfc_ms, False
        exc = box.get("exc")
        if exc is not None:
            if isinstance(exc, errors.RollboxError) and exc.retryable:
                return "infra_error", None, f"{type(exc).__name__}: {exc}", sb, ttfc_ms, True
            if sb.saw_timeout:
                return "timeout", None, "a command timed out", sb, ttfc_ms, False
            return "error", None, f"{type(exc).__name__}: {exc}", sb, ttfc_ms, False
        if sb.saw_timeout:
            return "timeout", box.get("value"), "a command timed out", sb, ttfc_ms, False
        return "ok", box.get("value"), None, sb, ttfc_ms, False

    async def _episode(self, index: int, fn: EpisodeFn, task: Any, timeout: float | None, retries: int,
                       user_loop: asyncio.AbstractEventLoop | None = None) -> EpisodeResult:
        running, _slots = self._limits()
        async with running:
            start = time.monotonic()
            attempts = 0
            while True:
                attempts += 1
                status, value, err, sb, ttfc, retryable = await self._attempt(fn, task, timeout, user_loop)
                if status == "infra_error" and retryable and attempts <= retries and not self._aborted:
                    continue
                if status == "ok":
                    reward = reward_of(value)
                elif status == "infra_error":
                    reward = None
                else:
                    reward = 0.0
                return EpisodeResult(index=index, status=status, value=value if status == "ok" else None,  # type: ignore[arg-type]
                                     reward=reward, attempts=attempts, sandbox_id=sb.sandbox_id if sb else None,
                                     wall_s=time.monotonic() - start, error=err, ttfc_ms=ttfc)

    # ---- map -------------------------------------------------------------------------------

    @property
    def map(self) -> "_Map":
        """`pool.map(fn, tasks, ...)`: runs `fn(sandbox, task)` for every task; yields an
        EpisodeResult per task. `async for res in pool.map.aio(fn, tasks, ...)` is the same,
        awaited.

        Args:
            fn: the episode; its return value is the reward (bool, number, or {"reward": x, ...}).
                A plain function runs in a thread of its own per episode (its blocking SDK
                calls are fine there); a coroutine function is awaited on the event loop that
                called `map.aio` (its `await sb.exec.aio(...)` calls are fine there), or on
                the SDK's loop under the blocking `map`.
            tasks: any iterable; materialised up front.
            timeout: seconds per episode attempt (restore excluded); None = no limit. A
                coroutine episode past it is cancelled.
            retries: extra attempts, each on a fresh sandbox, after an infrastructure fault.
            ordered: yield in input order instead of completion order.
            progress: show a rich progress bar; None = only when stderr is a terminal.

        Yields:
            EpisodeResult, as episodes finish (or in input order with `ordered=True`).

        Raises:
            SnapshotNotFound: the snapshot id is unknown (raised before any episode runs).
        """
        return _Map(self)

    async def _amap(self, fn: EpisodeFn, tasks: Iterable[Any], timeout: float | None, retries: int,
                    ordered: bool, progress: bool | None, user_loop: asyncio.AbstractEventLoop | None
                    ) -> AsyncIterator[EpisodeResult]:
        if self._remote is not None:
            remote = self._remote
            it = await asyncio.to_thread(lambda: iter(remote.map(fn, tasks, timeout=timeout, retries=retries,
                                                                 ordered=ordered, progress=progress)))
            try:
                while (res := await asyncio.to_thread(next, it, None)) is not None:
                    yield res
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    await asyncio.to_thread(close)
            return
        items = list(tasks)
        if retries < 0:
            raise errors.InvalidArgument(f"retries={retries} must be >= 0")
        await self._client.aio.request("GET", "/snapshots")  # reachability; bad ids surface on first restore
        if self.warm:
            await asyncio.to_thread(self.start_warm)
        show = sys.stderr.isatty() if progress is None else progress
        bar = None
        if show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            bar = Progress(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           transient=False)
            bar_task = bar.add_task("episodes", total=len(items))
            bar.start()
        running = [asyncio.ensure_future(self._episode(i, fn, t, timeout, retries, user_loop))
                   for i, t in enumerate(items)]
        pending: dict[int, EpisodeResult] = {}
        next_i = 0
        try:
            for fut in asyncio.as_completed(running):
                res = await fut
                if bar is not None:
                    bar.advance(bar_task)
                if not ordered:
                    yield res
                    continue
                pending[res.index] = res
                while next_i in pending:
                    yield pending.pop(next_i)
                    next_i += 1
        except BaseException:
            # Stopped early (the caller broke out or raised): cancel this map's episodes. A
            # cancelled episode ends its own sandbox (its attempt's teardown; a restore still
            # under way is ended when it lands, see _aio.cleaning), so their calls fail at once
            # instead of running to their timeout; other maps of the pool are not touched.
            for f in running:
                f.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        finally:
            if bar is not None:
                bar.stop()

    # ---- streaming -------------------------------------------------------------------------

    def submit(self, task: Any, fn: EpisodeFn | None = None, *,
               timeout: float | None = 60.0, retries: int = 1) -> "cf.Future[EpisodeResult]":
        """Queues one episode and returns its Future at once (it never raises for the episode:
        the Future's result is an EpisodeResult, whose status says how it went). At most
        `max_concurrency` submitted episodes run at once; the rest wait their turn.

        Args:
            task: the episode's input.
            fn: `fn(sandbox, task)`; defaults to the pool's `fn`.
            timeout: seconds per attempt (restore excluded); None = no limit.
            retries: extra attempts on a fresh sandbox after an infrastructure fault.

        Raises:
            InvalidArgument: no episode function, or retries < 0.
            InvalidState: the pool is closed.
        """
        episode = fn or self.fn
        if episode is None:
            raise errors.InvalidArgument("submit needs an episode function: SandboxPool(..., fn=run_episode) "
                                         "or pool.submit(task, fn=run_episode)")
        if retries < 0:
            raise errors.InvalidArgument(f"retries={retries} must be >= 0")
        if self._closed:
            raise errors.InvalidState("this SandboxPool is closed; make a new one")
        if self._stream is None:
            self._stream = EpisodeStream(self)
        return self._stream.submit(episode, task, timeout, retries)

    @threaded_stream
    def as_completed(self, timeout: float | None = None) -> Iterator[EpisodeResult]:
        """Yields the EpisodeResult of every submitted episode as it finishes (each once),
        including episodes submitted while iterating; returns when none is outstanding.

        Args:
            timeout: seconds to wait for the next result; None waits as long as it takes.

        Raises:
            TimeoutError: no result arrived within `timeout` while episodes were outstanding.
        """
        if self._stream is None:
            return
        yield from self._stream.results(timeout)

    def queue_depth(self) -> int:
        """Episodes submitted and not yet finished."""
        return 0 if self._stream is None else self._stream.depth


class _Map:
    """`pool.map`: blocking (`pool.map(...)`) and awaited (`pool.map.aio(...)`) forms of one
    async implementation (`SandboxPool._amap`)."""

    def __init__(self, pool: SandboxPool) -> None:
        self._pool = pool
        self.__doc__ = SandboxPool.map.__doc__

    def __call__(self, fn: EpisodeFn, tasks: Iterable[Any], *, timeout: float | None = 60.0, retries: int = 1,
                 ordered: bool = False, progress: bool | None = None) -> Iterator[EpisodeResult]:
        PORTAL.check_not_in_loop()
        return PORTAL.iterate(self._pool._amap(fn, tasks, timeout, retries, ordered, progress, None))

    def aio(self, fn: EpisodeFn, tasks: Iterable[Any], *, timeout: float | None = 60.0, retries: int = 1,
            ordered: bool = False, progress: bool | None = None) -> AsyncIterator[EpisodeResult]:
        """`async for res in pool.map.aio(...)`; a coroutine `fn` runs on the calling loop."""
        return PORTAL.aiterate(self._pool._amap(fn, tasks, timeout, retries, ordered, progress,
                                                asyncio.get_running_loop()))


async def _run_episode(fn: EpisodeFn, sb: SandboxInstance, task: Any, timeout: float | None,
                       user_loop: asyncio.AbstractEventLoop | None) -> tuple[dict[str, Any], bool]:
    """Runs one episode function: ({"value": v} or {"exc": e}, finished within `timeout`).

    A plain function runs in a daemon thread of its own: a runaway one cannot be interrupted,
    so it is left to fail once its sandbox is terminated. A coroutine function runs on
    `user_loop` (the loop that called `map.aio`) or here, and is cancelled past `timeout`."""
    loop = asyncio.get_running_loop()
    box: dict[str, Any] = {}
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        coro = fn(sb, task)
        fut: asyncio.Future[Any] = (asyncio.ensure_future(coro) if user_loop is None or user_loop is loop
                                    else asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, user_loop)))
    else:
        fut = loop.create_future()

        def settle(value: Any, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)

        def run() -> None:
            try:
                value = fn(sb, task)
            except BaseException as e:  # noqa: BLE001 - classified by the caller
                loop.call_soon_threadsafe(settle, None, e)
            else:
                loop.call_soon_threadsafe(settle, value, None)
        threading.Thread(target=run, daemon=True, name=f"episode-{sb.sandbox_id}").start()
    # A plain function's late exception, after its episode was given up, is not an error
    # anyone waits for: mark it retrieved.
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        done, _ = await asyncio.wait({fut}, timeout=timeout)
    except asyncio.CancelledError:
        fut.cancel()  # the map was left: a coroutine episode is cancelled on its own loop
        raise
    if not done:
        fut.cancel()
        return box, False
    exc = fut.exception()
    if exc is not None:
        box["exc"] = exc
    else:
        box["value"] = fut.result()
    return box, True
