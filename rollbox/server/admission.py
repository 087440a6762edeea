"""Admission control of starts (creates, restores, resumes).

Restores and boots are CPU-bound: a bounded number at once keeps each one fast and a
fork(1024) or a map at 64 from starting them all together (they queue here instead, and time
out nowhere). Each start is timed and counted by the metrics, queueing included.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from .. import errors
from .metrics import Metrics


def admission_limit() -> int:
    """Concurrent boots/restores: `ROLLBOX_MAX_STARTS`, else 2 per CPU core (at least 2).

    Raises:
        InvalidArgument: ROLLBOX_MAX_STARTS is set but not a positive integer.
    """
    raw = os.environ.get("ROLLBOX_MAX_STARTS", "")
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise errors.InvalidArgument(f"ROLLBOX_MAX_STARTS={raw!r} must be a positive integer")
        return n
    return max(2, 2 * (os.cpu_count() or 1))


class Admission:
    def __init__(self, metrics: Metrics, max_starts: int | None = None) -> None:
        self.metrics = metrics
        self.max_starts = max_starts or admission_limit()
        self._boots = asyncio.Semaphore(self.max_starts)

    @contextlib.asynccontextmanager
    async def start(self, runtime: str, kind: str) -> AsyncIterator[None]:
        """Holds one of `max_starts` start slots for the duration, waiting for one first;
        `kind` (create, restore, resume) labels the start's metrics."""
        with self.metrics.start(runtime, kind) as timer:
            async with self._boots:
                timer.admitted()
                yield
