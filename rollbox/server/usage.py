"""Usage accounting: copies each live sandbox's cgroup counters (CPU seconds, peak memory) and
last-activity time into the store's ledger, which survives daemon restarts."""

from __future__ import annotations

import time

from ..runtime import cgroups
from .context import ServiceContext
from .validation import container_id


class Usage:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def record(self, sandbox_id: str) -> None:
        """Records the sandbox's cgroup counters now (before its cgroup goes away)."""
        cid = container_id(sandbox_id)
        self.ctx.store.record_resources(sandbox_id, cgroups.cpu_seconds(cid, self.ctx.cg),
                                        cgroups.peak_memory_bytes(cid, self.ctx.cg))

    def sample(self) -> None:
        """Copies cgroup counters and last-activity times into the ledger (survives restarts)."""
        now_mono, now = time.monotonic(), time.time()
        for sid, lv in list(self.ctx.registry.live.items()):
            self.record(sid)
            self.ctx.store.update_sandbox(sid, last_active_at=now - (now_mono - lv.last_active))
