"""The SDK's event loop: the async implementation runs here, for blocking and async callers.

The SDK is written once, async (httpx's async client underneath). A blocking call
(`sb.exec(...)`) submits the coroutine to this loop, which runs in a daemon thread of its own,
and waits for it; an awaitable call (`await sb.exec.aio(...)`) from any other event loop
awaits the same coroutine run here (`asyncio.wrap_future`), so cancelling the awaiting task
cancels the work on this loop. One loop serves the whole process (its connections to the daemon
are bound to it), as synchronicity does for Modal's client.

After `os.fork()` the child starts a new loop on first use: the parent's thread does not exist
there (`os.register_at_fork`), and clients open new connections (`generation`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class Portal:
    """One asyncio loop in a daemon thread, started on first use. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.generation = 0  # bumped when a forked child drops its parent's loop

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started on first use)."""
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def main() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()
                thread = threading.Thread(target=main, name="rollbox-sdk-loop", daemon=True)
                thread.start()
                ready.wait()
                self._thread, self._loop = thread, loop
            return self._loop

    def in_loop(self) -> bool:
        """True when called from the portal's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def check_not_in_loop(self) -> None:
        """Raises RuntimeError on the loop's own thread, where a blocking call would wait on
        itself (the SDK's async code uses the `.aio` forms)."""
        if self.in_loop():
            raise RuntimeError("a blocking rollbox call was made on the SDK's event loop thread: "
                               "await the `.aio` form instead")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop and blocks until it ends; an interrupt (Ctrl-C) in the
        waiting thread cancels it there.

        Raises:
            RuntimeError: called from the loop's own thread (it would wait on itself); use the
                `.aio` form there.
        """
        if self.in_loop():
            coro.close()
            self.check_not_in_loop()
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return fut.result()
        except BaseException:
            if not fut.done():  # interrupted while waiting: cancel the work, then let it finish
                fut.cancel()
                cf.wait([fut], timeout=5.0)
            raise

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Awaits `coro` run on the loop, from any event loop (directly when already on it).
        Cancelling the awaiting task cancels `coro`."""
        loop = self.loop()
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Runs `coro` on the loop in the background (cleanups of cancelled calls); keeps a
        reference until it ends so it is not collected midway."""
        def start() -> None:
            task = asyncio.ensure_future(coro)
            self._tasks.add(task)
            task.add_done_callback(self._done)
        self.loop().call_soon_threadsafe(start)

    def drain(self, timeout_s: float = 30.0) -> None:
        """Waits up to `timeout_s` seconds for the background tasks (`spawn`): the releases of
        cancelled calls. Run at interpreter exit and by `SandboxPool.close`, so an interrupted
        create, restore or fork still ends what it made before the process goes."""
        loop = self._loop
        if loop is None or self.in_loop() or not loop.is_running():
            return

        async def settle() -> None:
            while True:
                # Let cancellations already requested (by threads, or by other loops through
                # wrap_future) run their except clauses, which spawn the releases.
                for _ in range(5):
                    await asyncio.sleep(0)
                if not self._tasks:
                    return
                await asyncio.wait(set(self._tasks))
        try:
            asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout_s)
        except (cf.TimeoutError, RuntimeError):
            pass  # keep_warm_seconds stays the backstop

    def track(self, task: "asyncio.Future[Any]") -> None:
        """Counts a task of the loop among those `drain` waits for (a create under way)."""
        self._tasks.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._done)  # type: ignore[arg-type]

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed cleanup is not worth a "never retrieved" warning

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """A blocking iterator over an async one, each step run on the loop; closing it (or
        leaving a for loop early) closes `agen` there."""
        try:
            while True:
                try:
                    item = self.run(_anext(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            self.run(_aclose(agen))

    async def aiterate(self, agen: AsyncIterator[T]) -> AsyncIterator[T]:
        """The same for async callers on another loop; leaving early closes `agen`."""
        try:
            while True:
                try:
                    item = await self.run_async(_anext(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            await asyncio.shield(self.run_async(_aclose(agen)))

    def _forget(self) -> None:
        """In a forked child: the loop's thread is gone; start afresh on first use."""
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None
        self._tasks = set()
        self.generation += 1


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


async def _aclose(agen: AsyncIterator[Any]) -> None:
    """Closes an async generator, once a step of it cancelled just before has unwound (a
    generator cannot be closed while it runs)."""
    aclose = getattr(agen, "aclose", None)
    if aclose is None:
        return
    for _ in range(500):
        try:
            await aclose()
            return
        except RuntimeError as e:
            if "already running" not in str(e):
                raise
            await asyncio.sleep(0.01)


PORTAL = Portal()
os.register_at_fork(after_in_child=PORTAL._forget)
atexit.register(PORTAL.drain)

__all__ = ["PORTAL", "Portal"]
