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

import concurrent.futures as cf
import itertools
import math
import numbers
import queue
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .. import errors
from ..client.transport import Client
from ..types import EpisodeResult
from ._aio import threaded_stream
from .backends import LOCAL, AttemptOutcome, PoolBackend, PoolSpec, get_backend, resolve_backend
from .containers import ContainerInstance, EpisodePoolClient
from .sandbox import Sandbox, SandboxInstance, default_client

# SandboxPool's isolation modes: "sandbox" = a fresh gVisor sandbox restored per episode (the
# strongest: episodes share only the host kernel behind gVisor); "container" = a fresh
# container per episode inside pooled gVisor sandboxes (episodes share a gVisor kernel).
ISOLATIONS = ("sandbox", "container")


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

    Use as a context manager or call `close()`; closing waits for teardowns in flight.
    """

    def __init__(self, snapshot_id: str, max_concurrency: int = 16, *, keep_warm_seconds: float | None = 600,
                 warm: int = 0, warm_idle_seconds: float = 300.0, client: Client | None = None,
                 fn: Callable[[SandboxInstance, Any], Any] | None = None, scale_down_after_s: float = 2.0,
                 backend: str | None = None, isolation: str = "sandbox",
                 episodes_per_sandbox: int | None = None, lease_s: float = 60.0) -> None:
        if isolation not in ISOLATIONS:
            raise errors.InvalidArgument(f"isolation={isolation!r} must be one of {', '.join(ISOLATIONS)}")
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise errors.InvalidArgument(f"snapshot_id={snapshot_id!r} must be a snapshot id string ('sn-...')")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise errors.InvalidArgument(f"max_concurrency={max_concurrency!r} must be an int >= 1")
        self.snapshot_id = snapshot_id
        self.max_concurrency = max_concurrency
        self.isolation = isolation
        self.episodes_per_sandbox = episodes_per_sandbox
        self._containers: EpisodePoolClient | None = None
        self._containers_lock = threading.Lock()
        self.keep_warm_seconds = keep_warm_seconds
        self._client = client or default_client()
        self._reaper = cf.ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="rollbox-teardown")
        # Held from a sandbox's restore until its teardown is done, so the number of this
        # pool's sandboxes is bounded (max_concurrency running + a few being torn down) even
        # when teardown is slower than episodes; the slack lets the next episode start while
        # the last one's sandbox is still being deleted.
        self._slots = threading.BoundedSemaphore(max_concurrency + max(2, max_concurrency // 2))
        # Every episode sandbox carries this tag, so close() can find one whose create reply
        # was lost (a daemon crash mid-request) and would otherwise live until its TTL.
        self.pool_id = secrets.token_hex(8)
        self.warm = warm
        self.warm_idle_seconds = warm_idle_seconds
        self._warm_set = False
        self._aborted = False
        self.fn = fn
        self.scale_down_after_s = scale_down_after_s
        self._stream: _Stream | None = None
        self.lease_s = lease_s
        self._lease_stop = threading.Event()
        self._lease_thread: threading.Thread | None = None
        self._remote: PoolBackend | None = None
        name = resolve_backend(backend)
        if name != LOCAL:
            self._remote = get_backend(name).open_pool(PoolSpec(
                self.pool_id, snapshot_id, max_concurrency, keep_warm_seconds, warm, warm_idle_seconds, self._client,
                isolation))

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _container_pool(self) -> EpisodePoolClient:
        with self._containers_lock:
            if self._containers is None:
                self._containers = EpisodePoolClient(
                    self._client, self.snapshot_id, max_concurrency=self.max_concurrency,
                    episodes_per_sandbox=self.episodes_per_sandbox, keep_warm_seconds=self.keep_warm_seconds,
                    tags={"rollbox.pool": self.pool_id}, lease_s=self.lease_s)
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
        try:
            for info in self._client.request("GET", "/sandboxes"):
                if isinstance(info, dict) and info.get("tags", {}).get("rollbox.pool") == self.pool_id:
                    try:
                        self._client.request("DELETE", f"/sandboxes/{info['sandbox_id']}")
                    except errors.RollboxError:
                        pass
        except errors.RollboxError:
            pass

    def close(self) -> None:
        """Waits for teardowns in flight, then terminates any sandbox of this pool still alive."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._reaper.shutdown(wait=True)
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

    def _terminate_later(self, sb: SandboxInstance, status: str = "ok") -> None:
        def go() -> None:
            try:
                if isinstance(sb, ContainerInstance):
                    sb.terminated = True
                    sb._pool.end(sb.container_id, status)
                else:
                    sb.terminate()
            except errors.RollboxError:
                pass
            finally:
                self._slots.release()
        try:
            self._reaper.submit(go)
        except RuntimeError:  # closed while this attempt ran (a Ray node's late attempt): end it now
            go()

    def attempt(self, fn: Callable[[SandboxInstance, Any], Any], task: Any, timeout: float | None) -> AttemptOutcome:
        """One episode attempt on one fresh sandbox, classified as `map` classifies it (the
        public entry point of a backend's node: rollbox.sdk.backends).

        Raises:
            SnapshotNotFound, InvalidArgument: as `map` does (not retryable).
        """
        status, value, err, sb, ttfc_ms, retryable = self._attempt(fn, task, timeout)
        return AttemptOutcome(status, value, err, sb.sandbox_id if sb else None, ttfc_ms, retryable)

    def _attempt(self, fn: Callable[[SandboxInstance, Any], Any], task: Any, timeout: float | None
                 ) -> tuple[str, Any, str | None, SandboxInstance | None, float | None, bool]:
        """One attempt on one fresh sandbox: (status, value, error, sandbox, ttfc_ms, retryable)."""
        self._slots.acquire()
        t0 = time.monotonic()
        sb: Any  # a SandboxInstance, or a ContainerInstance with the same episode API
        try:
            if self.isolation == "container":
                sb = self._container_pool().begin()
            else:
                if self._lease_thread is None:
                    self._hold_lease()
                sb = Sandbox(keep_warm_seconds=self.keep_warm_seconds, client=self._client,
                             tags={"rollbox.pool": self.pool_id}).create_from_memory_snapshot(self.snapshot_id)
        except errors.RollboxError as e:
            self._slots.release()
            if isinstance(e, (errors.SnapshotNotFound, errors.InvalidArgument, errors.UnsupportedOperation,
                              errors.VolumeBusy)):
                raise
            return "infra_error", None, f"{type(e).__name__}: {e}", None, None, True
        except BaseException:
            self._slots.release()
            raise
        ttfc_ms = (time.monotonic() - t0) * 1000
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn(sb, task)
            except BaseException as e:  # noqa: BLE001 - classified below
                box["exc"] = e
            finally:
                done.set()

        threading.Thread(target=run, daemon=True, name=f"episode-{sb.sandbox_id}").start()
        finished = done.wait(timeout)
        outcome: tuple[str, Any, str | None, SandboxInstance | None, float | None, bool] = (
            "infra_error", None, "episode did not finish", sb, ttfc_ms, True)
        try:
            outcome = self._classify(sb, box, finished, timeout, ttfc_ms)
            return outcome
        finally:
            # Terminating also ends a runaway episode: its pending calls fail and it returns.
            self._terminate_later(sb, outcome[0])

    @staticmethod
    def _classify(sb: SandboxInstance, box: dict[str, Any], finished: bool, timeout: float | None,
                  ttfc_ms: float) -> tuple[str, Any, str | None, SandboxInstance | None, float | None, bool]:
        if not finished:
            return "timeout", None, f"episode ran past {timeout} s", sb, ttfc_ms, False
        if sb.saw_oom:
            return "oom", None, "the sandbox ran out of memory", sb, ttfc_ms, False
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

    def _episode(self, index: int, fn: Callable[[SandboxInstance, Any], Any], task: Any,
                 timeout: float | None, retries: int) -> EpisodeResult:
        start = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            status, value, err, sb, ttfc, retryable = self._attempt(fn, task, timeout)
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

    @threaded_stream
    def map(self, fn: Callable[[SandboxInstance, Any], Any], tasks: Iterable[Any], *, timeout: float | None = 60.0,
            retries: int = 1, ordered: bool = False, progress: bool | None = None) -> Iterator[EpisodeResult]:
        """Runs `fn(sandbox, task)` for every task; yields an EpisodeResult per task.

        Args:
            fn: the episode; its return value is the reward (bool, number, or {"reward": x, ...}).
            tasks: any iterable; materialised up front.
            timeout: seconds per episode attempt (restore excluded); None = no limit.
            retries: extra attempts, each on a fresh sandbox, after an infrastructure fault.
            ordered: yield in input order instead of completion order.
            progress: show a rich progress bar; None = only when stderr is a terminal.

        Yields:
            EpisodeResult, as episodes finish (or in input order with `ordered=True`).

        Raises:
            SnapshotNotFound: the snapshot id is unknown (raised before any episode runs).
        """
        if self._remote is not None:
            yield from self._remote.map(fn, tasks, timeout=timeout, retries=retries, ordered=ordered, progress=progress)
            return
        items = list(tasks)
        if retries < 0:
            raise errors.InvalidArgument(f"retries={retries} must be >= 0")
        self._client.request("GET", "/snapshots")  # reachability; bad ids surface on first restore
        if self.warm:
            self.start_warm()
        show = sys.stderr.isatty() if progress is None else progress
        bar = None
        if show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            bar = Progress(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           transient=False)
            bar_task = bar.add_task("episodes", total=len(items))
            bar.start()
        try:
            with cf.ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="rollbox-episode") as ex:
                futs = {ex.submit(self._episode, i, fn, t, timeout, retries): i for i, t in enumerate(items)}
                pending: dict[int, EpisodeResult] = {}
                next_i = 0
                try:
                    for fut in cf.as_completed(futs):
                        res = fut.result()
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
                    # Stopped early (the caller broke out or raised): cancel what has not
                    # started and end the sandboxes of episodes in flight, so their calls fail
                    # at once instead of running to their timeout.
                    self._aborted = True
                    for f in futs:
                        f.cancel()
                    self.terminate_live()
                    raise
        finally:
            if bar is not None:
                bar.stop()

    # ---- streaming -------------------------------------------------------------------------

    def submit(self, task: Any, fn: Callable[[SandboxInstance, Any], Any] | None = None, *,
               timeout: float | None = 60.0, retries: int = 1) -> "cf.Future[EpisodeResult]":
        """Queues one episode and returns its Future at once (it never raises for the episode:
        the Future's result is an EpisodeResult, whose status says how it went).

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
        if self._reaper._shutdown:
            raise errors.InvalidState("this SandboxPool is closed; make a new one")
        if self._stream is None:
            self._stream = _Stream(self)
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


class _Stream:
    """The executor, result queue and warm-pool sizer behind submit/as_completed."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self.ex = cf.ThreadPoolExecutor(max_workers=pool.max_concurrency, thread_name_prefix="rollbox-stream")
        self.done: queue.SimpleQueue[cf.Future[EpisodeResult]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.depth = 0  # submitted, not finished
        self.unyielded = 0  # submitted, result not yet yielded by as_completed
        self.index = itertools.count()
        # Container mode restores its pooled sandboxes on demand: spares would sit unused.
        self.cap = 0 if pool.isolation == "container" else min(64, pool.warm if pool.warm > 0 else pool.max_concurrency)
        self.warm_now = 0  # what the daemon was last told
        self.wake = threading.Event()
        self.stopping = False
        self.sizer = threading.Thread(target=self._size_loop, daemon=True, name="rollbox-warm-sizer")
        self.sizer.start()

    def submit(self, fn: Callable[[SandboxInstance, Any], Any], task: Any, timeout: float | None,
               retries: int) -> "cf.Future[EpisodeResult]":
        with self.lock:
            self.depth += 1
            self.unyielded += 1
        self.wake.set()
        fut = self.ex.submit(self.pool._episode, next(self.index), fn, task, timeout, retries)
        fut.add_done_callback(self._finished)
        return fut

    def _finished(self, fut: "cf.Future[EpisodeResult]") -> None:
        with self.lock:
            self.depth -= 1
        self.done.put(fut)
        self.wake.set()

    def results(self, timeout: float | None) -> Iterator[EpisodeResult]:
        while True:
            with self.lock:
                if self.unyielded == 0:
                    return
            try:
                fut = self.done.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no episode finished within {timeout} s ({self.depth} outstanding)") from None
            with self.lock:
                self.unyielded -= 1
            if fut.cancelled():
                continue
            yield fut.result()

    def _want(self) -> int:
        return min(self.cap, self.depth)

    def _size_loop(self) -> None:
        """Grows the daemon's warm pool at once with the queue; shrinks it (to zero when the
        queue drains) once the queue has stayed shallower for scale_down_after_s."""
        low_since: float | None = None
        while not self.stopping:
            self.wake.wait(0.2)
            self.wake.clear()
            want = self._want()
            now = time.monotonic()
            if want >= self.warm_now:
                low_since = None
                if want > self.warm_now:
                    self._set(want)
                continue
            low_since = low_since or now
            if now - low_since >= self.pool.scale_down_after_s:
                self._set(want)
                low_since = None

    def _set(self, count: int) -> None:
        try:
            self.pool._client.request("PUT", f"/snapshots/{self.pool.snapshot_id}/warm",
                                      json={"count": count, "idle_seconds": self.pool.warm_idle_seconds})
            self.warm_now = count
        except errors.RollboxError:
            pass  # a warm pool is an optimisation: episodes still restore on demand

    def close(self) -> None:
        self.ex.shutdown(wait=True, cancel_futures=True)
        self.stopping = True
        self.wake.set()
        self.sizer.join(timeout=5)
        if self.warm_now:
            self._set(0)
