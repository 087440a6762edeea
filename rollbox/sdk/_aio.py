"""Blocking and awaitable forms of the SDK's methods, from one async implementation.

Each SDK method is written once, as a coroutine (httpx's async client underneath, see
`rollbox.client.aclient`) and decorated:

    @synchronized
    async def exec(self, *args: str, ...) -> ExecResult: ...

gives `sb.exec(...)` (blocks: runs the coroutine on the SDK's event loop, `client/portal.py`)
and `await sb.exec.aio(...)` (awaits it from any event loop). Type checkers see both with the
method's own signature (ParamSpec). `@streaming` does the same for async generators:
`for x in obj.method(...)` and `async for x in obj.method.aio(...)`.

Cancellation: cancelling an awaited `.aio` call (or interrupting a blocking one) cancels the
coroutine on the SDK's loop, which stops its request. A call whose result owns something the
daemon made (a created sandbox, a fork's copies) is `@cleaning(release)`: it is not interrupted
midway (the daemon would go on making it, unseen), and `release(result)` ends what it made once
it is there, so a cancelled `create.aio` leaves no sandbox behind.

The pool and `@function` orchestrate the user's own blocking episode functions on threads;
their streams get `async for` forms through `threaded_stream` (each step in a worker thread of
the SDK's own pool, separate from asyncio's default executor).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ..client.portal import PORTAL

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")
Y = TypeVar("Y")

Release = Callable[[Any], Awaitable[object]]


async def _guarded(coro: Coroutine[Any, Any, T], release: Release) -> T:
    """Runs `coro` to its end even when the caller is cancelled; then `release(result)`. The
    rest runs as a background task of the portal, which the process waits for at exit
    (`Portal.drain`), so an interrupted script still ends what it made."""
    task = asyncio.ensure_future(coro)
    PORTAL.track(task)  # an exit while it runs waits for it (and its release)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        PORTAL.spawn(_release_when_done(task, release))
        raise


async def _release_when_done(task: "asyncio.Future[Any]", release: Release) -> None:
    try:
        result = await task
    except BaseException:  # noqa: BLE001 - it made nothing
        return
    await _ignore(release(result))


async def _ignore(aw: Awaitable[object]) -> None:
    try:
        await aw
    except Exception:  # noqa: BLE001 - best effort: keep_warm_seconds is the backstop
        pass


class _Bound(Generic[P, T]):
    def __init__(self, fn: Callable[P, Coroutine[Any, Any, T]], release: Release | None) -> None:
        self._fn = fn
        self._release = release
        functools.update_wrapper(self, fn)

    def _coro(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
        coro = self._fn(*args, **kwargs)
        return coro if self._release is None else _guarded(coro, self._release)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        PORTAL.check_not_in_loop()
        return PORTAL.run(self._coro(*args, **kwargs))

    async def aio(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return await PORTAL.run_async(self._coro(*args, **kwargs))


class synchronized(Generic[S, P, T]):  # noqa: N801 - used as a decorator
    """Method decorator over a coroutine function: calling the method blocks until the
    coroutine (run on the SDK's loop) returns; `.aio(...)` awaits it. `@cleaning(release)` is
    the same and names what releases the result of a cancelled call."""

    def __init__(self, fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]], release: Release | None = None) -> None:
        self._fn = fn
        self._release = release
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "synchronized[S, P, T]": ...

    @overload
    def __get__(self, obj: S, owner: type | None = None) -> _Bound[P, T]: ...

    def __get__(self, obj: S | None, owner: type | None = None) -> "synchronized[S, P, T] | _Bound[P, T]":
        if obj is None:
            return self
        return _Bound(functools.partial(self._fn, obj), self._release)


def cleaning(release: Release) -> Callable[[Callable[Concatenate[S, P], Coroutine[Any, Any, T]]],
                                           synchronized[S, P, T]]:
    """`@synchronized` whose call, when cancelled, runs to its end and passes its result to
    `release` (a coroutine function, e.g. `lambda sb: sb.terminate.aio()`)."""
    def deco(fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]]) -> synchronized[S, P, T]:
        return synchronized(fn, release)
    return deco


class _BoundStream(Generic[P, Y]):
    def __init__(self, fn: Callable[P, AsyncIterator[Y]]) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Y]:
        PORTAL.check_not_in_loop()
        return PORTAL.iterate(self._fn(*args, **kwargs))

    def aio(self, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Y]:
        """The same stream for `async for`; leaving the loop early closes it."""
        return PORTAL.aiterate(self._fn(*args, **kwargs))


class streaming(Generic[S, P, Y]):  # noqa: N801 - used as a decorator
    """Decorator of an async generator method: `for x in obj.method(...)` blocks per item;
    `async for x in obj.method.aio(...)` awaits them."""

    def __init__(self, fn: Callable[Concatenate[S, P], AsyncIterator[Y]]) -> None:
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


# ---- thread-based forms, for the pool and @function (they run the user's blocking code) -----

AIO_THREADS = 512  # concurrent threaded steps in flight (each waits on the daemon, not a core)
_executor: cf.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> cf.ThreadPoolExecutor:
    """The SDK's own thread pool for threaded `.aio` forms (made on first use)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = cf.ThreadPoolExecutor(AIO_THREADS, thread_name_prefix="rollbox-aio")
        return _executor


async def run_in_thread(fn: Callable[[], T], release: Callable[[T], object] | None = None) -> T:
    """Runs `fn()` on the SDK's thread pool; when the awaiting task is cancelled, `fn` still
    finishes (a thread cannot be interrupted) and `release(result)` then releases its result."""
    fut = asyncio.get_running_loop().run_in_executor(executor(), fn)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if release is not None:
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() is not None
                                  else executor().submit(release, f.result()))
        raise


class _ThreadedBound(Generic[P, T]):
    def __init__(self, fn: Callable[P, T]) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._fn(*args, **kwargs)

    async def aio(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_in_thread(functools.partial(self._fn, *args, **kwargs))


class threaded(Generic[S, P, T]):  # noqa: N801 - used as a decorator
    """Decorator of a blocking method that orchestrates threads (it runs user code): it stays
    blocking and gains an awaitable `.aio` twin run in a worker thread."""

    def __init__(self, fn: Callable[Concatenate[S, P], T]) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "threaded[S, P, T]": ...

    @overload
    def __get__(self, obj: S, owner: type | None = None) -> _ThreadedBound[P, T]: ...

    def __get__(self, obj: S | None, owner: type | None = None) -> "threaded[S, P, T] | _ThreadedBound[P, T]":
        if obj is None:
            return self
        return _ThreadedBound(functools.partial(self._fn, obj))


class _ThreadedStream(Generic[P, Y]):
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
                step_cf: cf.Future[Any] = cf.Future()
                if step is not None:
                    step.add_done_callback(lambda _f: step_cf.set_result(None))
                else:
                    step_cf.set_result(None)

                def finish() -> None:
                    cf.wait([step_cf])
                    close()
                await asyncio.shield(loop.run_in_executor(executor(), finish))


class threaded_stream(Generic[S, P, Y]):  # noqa: N801 - used as a decorator
    """Decorator of a blocking method returning an iterator (the pool's map): it stays
    blocking and gains `async for x in obj.method.aio(...)`."""

    def __init__(self, fn: Callable[Concatenate[S, P], Iterator[Y]]) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "threaded_stream[S, P, Y]": ...

    @overload
    def __get__(self, obj: S, owner: type | None = None) -> _ThreadedStream[P, Y]: ...

    def __get__(self, obj: S | None, owner: type | None = None) -> "threaded_stream[S, P, Y] | _ThreadedStream[P, Y]":
        if obj is None:
            return self
        return _ThreadedStream(functools.partial(self._fn, obj))
