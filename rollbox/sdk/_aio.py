"""`.aio` async mirrors of the sync SDK methods, sharing one implementation.

`sb.exec(...)` blocks; `await sb.exec.aio(...)` runs the same code in a worker thread
(the I/O is HTTP to the daemon, which does the real work), as Beam/Modal users write it.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class _Bound(Generic[T]):
    def __init__(self, fn: Callable[..., T], obj: Any) -> None:
        self._fn = fn
        self._obj = obj
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        return self._fn(self._obj, *args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(self._fn, self._obj, *args, **kwargs)


class synchronized(Generic[T]):  # noqa: N801 - used as a decorator
    """Method decorator: the method stays sync and gains an awaitable `.aio` twin."""

    def __init__(self, fn: Callable[..., T]) -> None:
        self._fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return _Bound(self._fn, obj)
