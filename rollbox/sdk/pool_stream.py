"""`SandboxPool.submit` / `as_completed`: episodes streamed in as they are produced."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import errors
from ..client.portal import PORTAL
from ..types import EpisodeResult

if TYPE_CHECKING:
    from .backends import EpisodeFn
    from .pool import SandboxPool


class EpisodeStream:
    """The futures, result queue and warm-pool sizer behind `SandboxPool.submit` and
    `as_completed`. Each submitted episode is a task on the SDK's event loop (bounded by the
    pool's `max_concurrency`); the sizer is a thread of its own. Thread-safe."""

    def __init__(self, pool: "SandboxPool") -> None:
        self.pool = pool
        self.futures: set[cf.Future[EpisodeResult]] = set()
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

    def submit(self, fn: "EpisodeFn", task: Any, timeout: float | None,
               retries: int) -> "cf.Future[EpisodeResult]":
        with self.lock:
            self.depth += 1
            self.unyielded += 1
        self.wake.set()
        fut = asyncio.run_coroutine_threadsafe(self.pool._episode(next(self.index), fn, task, timeout, retries),
                                               PORTAL.loop())
        with self.lock:
            self.futures.add(fut)
        fut.add_done_callback(self._finished)
        return fut

    def _finished(self, fut: "cf.Future[EpisodeResult]") -> None:
        with self.lock:
            self.depth -= 1
            self.futures.discard(fut)
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
        """Cancels episodes that have not started, waits for those running, stops the sizer."""
        with self.lock:
            futures = list(self.futures)
        for f in futures:
            f.cancel()  # an episode waiting for its turn is dropped; one running ends first
        cf.wait(futures)
        self.stopping = True
        self.wake.set()
        self.sizer.join(timeout=5)
        if self.warm_now:
            self._set(0)
