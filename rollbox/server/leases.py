"""Client leases: sandboxes a SandboxPool (its warm spares included) or a `@function` call made
end soon after the client that made them dies, instead of idling until `keep_warm_seconds`.

A client holding a lease (`PUT /leases/{owner}` every `lease_s / 3` seconds, the SDK does it
from a thread) owns every sandbox tagged `rollbox.pool=<owner>` and the warm pools it asked
for. When the daemon has not heard from it for `lease_s` seconds (default 60), those sandboxes
are terminated and those warm pools set to zero. Standalone `Sandbox().create()` sandboxes
carry no such tag and keep their contract: they outlive the script, `keep_warm_seconds` is
their backstop (issue #19).

Thread-safety: all methods run on the daemon's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .. import errors

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .service import SandboxService

log = logging.getLogger("rollbox.leases")

DEFAULT_LEASE_S = 60.0
CHECK_S = 1.0
OWNER_TAG = "rollbox.pool"


class RenewLease(BaseModel):
    lease_s: float = Field(DEFAULT_LEASE_S, gt=0, le=86400, allow_inf_nan=False)
    warm_snapshot: str | None = None


@dataclass
class Lease:
    owner: str
    lease_s: float
    last_seen: float = field(default_factory=time.monotonic)
    warm_snapshots: set[str] = field(default_factory=set)


class Leases:
    def __init__(self, service: "SandboxService") -> None:
        self.service = service
        self.leases: dict[str, Lease] = {}
        self._task: asyncio.Task[None] | None = None

    def renew(self, owner: str, lease_s: float = DEFAULT_LEASE_S, warm_snapshot: str | None = None) -> dict[str, Any]:
        """Takes or renews `owner`'s lease for `lease_s` seconds; `warm_snapshot`: a warm pool
        it asked for (set to zero when the lease expires).

        Raises InvalidArgument for a bad owner id or lease."""
        if not owner or len(owner) > 64 or not owner.replace("-", "").isalnum():
            raise errors.InvalidArgument(f"lease owner {owner!r} must be 1-64 letters, digits or '-'")
        if not 0 < lease_s <= 86400:
            raise errors.InvalidArgument(f"lease_s={lease_s} must be in (0, 86400] seconds")
        lease = self.leases.get(owner)
        if lease is None:
            lease = self.leases[owner] = Lease(owner, lease_s)
        lease.lease_s, lease.last_seen = lease_s, time.monotonic()
        if warm_snapshot:
            lease.warm_snapshots.add(warm_snapshot)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._expire_loop())
        return {"owner": owner, "lease_s": lease_s}

    def release(self, owner: str) -> None:
        """The client closed cleanly: it ends its own sandboxes; drop the lease."""
        self.leases.pop(owner, None)

    async def _expire_loop(self) -> None:
        while self.leases:
            await asyncio.sleep(CHECK_S)
            now = time.monotonic()
            for owner, lease in list(self.leases.items()):
                if now - lease.last_seen > lease.lease_s:
                    self.leases.pop(owner, None)
                    await self.expire(lease)

    async def expire(self, lease: Lease) -> int:
        """Ends what the lease owned; returns how many sandboxes were terminated."""
        for snap in lease.warm_snapshots:
            try:
                self.service.warm.set(snap, 0)
            except errors.RollboxError:
                pass
        ids = [i.sandbox_id for i in self.service.list_sandboxes()
               if i.tags.get(OWNER_TAG) == lease.owner and i.state in ("running", "starting", "paused")]
        log.warning("lease of %s expired (no heartbeat for %.0f s): terminating its %d sandboxes", lease.owner,
                    lease.lease_s, len(ids))
        for sid in ids:
            try:
                await self.service.terminate(sid, reason="lease expired")
            except errors.RollboxError:
                pass
        return len(ids)


def add_lease_routes(app: "FastAPI", leases: Leases) -> None:
    """PUT /leases/{owner} (take or renew: {"lease_s": 60, "warm_snapshot": null}) and
    DELETE /leases/{owner} (release after a clean close)."""
    @app.put("/leases/{owner}")
    async def renew(owner: str, body: RenewLease) -> dict[str, Any]:
        return leases.renew(owner, body.lease_s, body.warm_snapshot)

    @app.delete("/leases/{owner}")
    async def release(owner: str) -> dict[str, Any]:
        leases.release(owner)
        return {"owner": owner, "released": True}
