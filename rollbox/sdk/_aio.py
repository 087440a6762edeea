"""`.aio` async mirrors of the blocking SDK methods, derived from one implementation.

`sb.exec(...)` blocks; `await sb.exec.aio(...)` runs the same code on the SDK's own thread
pool (the I/O is HTTP to the daemon, which does the real work), as Beam/Modal users write it.
Streams have async forms too: `async for res in pool.map.aio(fn, tasks)`.

Single-sourced: each method is written once (blocking) and decorated; the decorators keep its
signature for type checkers (ParamSpec), so `sb.exec.aio` is typed like `sb.exec`.

Cancellation cleans up: cancelling an awaited call whose result owns something (a created
sandbox, a started process) releases it when the call finishes in its thread (`cleanup=`:
`create.aio` cancelled mid-boot terminates the sandbox as soon as it exists, instead of
leaving it to keep_warm_seconds); closing or cancelling an async iteration closes the blocking
generator, which ends what it started (a pool map ends the sandboxes of episodes in flight).

Why threads and not an async HTTP client underneath: the daemon does the waiting; the SDK's
own thread pool (AIO_THREADS, separate from asyncio's default executor, so an RL loop's
to_thread calls never queue behind rollbox's) keeps one implementation for both forms.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")
Y = TypeVar("Y")

AIO_THREADS = 512  # concurrent .aio calls in flight (each waits on the daemon, not a core)
_executor: cf.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> cf.ThreadPoolExecutor:
    """The SDK's own thread pool for `.aio` calls (made on first use)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = cf.ThreadPoolExecutor(AIO_THREADS, thread_name_prefix="rollbox-aio")
        return _executor


def _release(cleanup: Callable[[Any], object], fut: "asyncio.Future[Any]") -> None:
    if fut.cancelled() or fut.exception() is not None:
        return
    executor().submit(cleanup, fut.result())


async def run_in_thread(fn: Callable[[], T], cleanup: Callable[[T], object] | None = None) -> T:
    """Runs `fn()` on the SDK's thread pool; when the awaiting task is cancelled, `fn` still
    finishes (a thread cannot be interrupted) and `cleanup(result)` then releases its result."""
    fut = asyncio.get_running_loop().run_in_executor(executor(), fn)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if cleanup is not None:
            fut.add_done_callback(functools.partial(_release, cleanup))
        raise


class _Bound(Generic[P, T]):
    def __init__(self, fn: Callable[P, T], cleanup: Callable[[T], object] | None) -> None:
        self._fn = fn
        self._cleanup = cleanup
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._fn(*args, **kwargs)

    async def aio(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_in_thread(functools.partial(self._fn, *args, **kwargs), self._cleanup)


class synchronized(Generic[S, P, T]):  # noqa: N801 - used as a decorator
    """Method decorator: the method stays blocking and gains an awaitable `.aio` twin with the
    same signature. `@cleaning(fn)` is the same and also names what releases the method's
    result when an `.aio` call is cancelled (e.g. `SandboxInstance.terminate`)."""

    def __init__(self, fn: Callable[Concatenate[S, P], T], cleanup: Callable[[T], object] | None = None) -> None:
        self._fn = fn
        self._cleanup = cleanup
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "synchronized[S, P, T]": ...

    @overload
    def __get__(self, obj: S, owner: type | None = None) -> _Bound[P, T]: ...

    def __get__(self, obj: S | None, owner: type | None = None) -> "synchronized[S, P, T] | _Bound[P, T]":
        if obj is None:
            return self
        return _Bound(functools.partial(self._fn, obj), self._cleanup)


def cleaning(cleanup: Callable[[Any], object]) -> Callable[[Callable[Concatenate[S, P], T]], synchronized[S, P, T]]:
    """`@synchronized` whose `.aio`, when cancelled, passes the method's eventual result to
    `cleanup` (e.g. `lambda sb: sb.terminate()`)."""
    def deco(fn: Callable[Concatenate[S, P], T]) -> synchronized[S, P, T]:
        return synchronized(fn, cleanup)
    return deco


class _BoundStream(Generic[P, Y]):
    def __init__(self, fn: Callable[P, Iterator[Y]]) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Y]:
        return self._fn(*args, **kwargs)

    async def aio(self, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Y]:
        """The same stream, each item awaited; leaving the loop early (break, an exception,
        cancellation) closes the blocking generator, which ends what it started."""
        loop = asyncio.get_running_loop()
        it = await run_in_thread(lambda: iter(self._fn(*args, **kwargs)))
        done = object()
        step: asyncio.Future[Any] | None = None
        try:
            while True:
                step = loop.run_in_executor(executor(), next, it, done)
                item = await asyncio.shield(step)
                step = None
                if item is done:
                    return
                yield item
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                # Closing runs the generator's cleanup (a pool map ends its episodes' sandboxes),
                # which blocks: in a thread, once a `next` still running there has returned
                # (a generator cannot be closed while it executes).
                def finish() -> None:
                    if step is not None:
                        try:
                            cf.wait([step_cf])
                        except Exception:  # noqa: BLE001 - only its end matters here
                            pass
                    close()
                step_cf: cf.Future[Any] = cf.Future()
                if step is not None:
                    step.add_done_callback(lambda _f: step_cf.set_result(None))
                await asyncio.shield(loop.run_in_executor(executor(), finish))


class streaming(Generic[S, P, Y]):  # noqa: N801 - used as a decorator
    """Decorator of a method returning an iterator: it stays blocking and gains
    `async for x in obj.method.aio(...)`."""

    def __init__(self, fn: Callable[Concatenate[S, P], Iterator[Y]]) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "streaming[S, P, Y]": ...

    @overload
    def __get__(self, obj: S, owner: type | None = None) -> _BoundStream[P, Y]: ...

    def __get__(self, obj: S | None, owner: type | None = None) -> "streaming[S, P, Y] | _BoundStream[P, Y]":
        if obj is None:
            return self
        return _BoundStream(functools.partial(self._fn, obj))
