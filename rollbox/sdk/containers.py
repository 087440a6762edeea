"""Episode containers: the `sb` a SandboxPool(isolation="container") episode function gets.

A container is a fresh set of namespaces and a copy-on-write root inside a pooled gVisor
sandbox (see rollbox/server/episodes.py); it has the sandbox API an episode needs (`exec`,
`fs.*`) and is discarded when the episode ends. What it shares with other episodes of the
same pooled sandbox is gVisor's kernel (never the host's): the README's threat model.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import errors
from ..client.transport import Client
from ..client.portal import PORTAL
from ._aio import synchronized
from .sandbox import SandboxInstance

# The sandbox API calls a container serves (the rest, e.g. snapshots or ports, are the pooled
# sandbox's and refused with UnsupportedOperation).
CONTAINER_CALLS = frozenset({"exec", "files/write", "files/read", "files/list", "files/remove"})


class ContainerInstance(SandboxInstance):
    """One episode's container. `sandbox_id` is the pooled sandbox; `container_id` its own id.

    Thread-safe like SandboxInstance. `terminate()` ends the container (idempotent); the pool
    ends it anyway when the episode returns.
    """

    def __init__(self, sandbox_id: str, container_id: str, pool: "EpisodePoolClient") -> None:
        super().__init__(sandbox_id, pool.client)
        self.container_id = container_id
        self._pool = pool
        self._streams_files = False

    def __repr__(self) -> str:
        return f"ContainerInstance({self.sandbox_id!r}, {self.container_id!r})"

    async def _call(self, method: str, sub: str, body: Any = None) -> Any:
        if sub not in CONTAINER_CALLS:
            raise errors.UnsupportedOperation(
                f"`{sub}` is not available in an episode container (SandboxPool isolation='container'): "
                "containers offer exec and fs; use isolation='sandbox' for snapshots, ports and pause",
                sandbox_id=self.sandbox_id)
        return await self._client.aio.request(
            method, f"/sandboxes/{self.sandbox_id}/containers/{self.container_id}/{sub}", json=body)

    @synchronized
    async def terminate(self) -> None:
        """Ends the container: every process of it is killed and its files discarded. Idempotent."""
        if self.terminated:
            return
        self.terminated = True
        await self._pool.aend(self.container_id, "ok")


class EpisodePoolClient:
    """The client side of one daemon episode pool (POST /episode-pools).

    The pool is leased to this client: a daemon thread renews the lease every `lease_s / 3`
    seconds, and the daemon closes a pool it has not heard from for `lease_s` (so a dead
    trainer's pooled sandboxes end within ~a minute). Use `close()` when done."""

    def __init__(self, client: Client, snapshot_id: str, *, max_concurrency: int, sandboxes: int | None = None,
                 episodes_per_sandbox: int | None = None, keep_warm_seconds: float | None = 600,
                 tags: dict[str, str] | None = None, lease_s: float = 60.0) -> None:
        self.client = client
        body: dict[str, Any] = {"snapshot_id": snapshot_id, "max_concurrency": max_concurrency,
                                "sandboxes": sandboxes, "keep_warm_seconds": keep_warm_seconds, "tags": tags or {},
                                "lease_s": lease_s}
        if episodes_per_sandbox is not None:
            body["episodes_per_sandbox"] = episodes_per_sandbox
        self.pool_id = str(client.request("POST", "/episode-pools", json=body)["pool_id"])
        self._closed = threading.Event()
        threading.Thread(target=self._heartbeat, args=(lease_s / 3,), daemon=True,
                         name=f"rollbox-lease-{self.pool_id}").start()

    def _heartbeat(self, every_s: float) -> None:
        while not self._closed.wait(every_s):
            try:
                self.client.request("PUT", f"/episode-pools/{self.pool_id}/heartbeat")
            except errors.EpisodePoolNotFound:
                return
            except errors.RollboxError:
                continue  # a restarting daemon: the next beat may get through

    def begin(self) -> ContainerInstance:
        """A fresh container (waits for a free slot). Raises SandboxLost (retryable) or
        UnsupportedOperation (the snapshot's image cannot host containers)."""
        return PORTAL.run(self.abegin())

    async def abegin(self) -> ContainerInstance:
        """`begin`, awaitable (on the SDK's event loop)."""
        r = await self.client.aio.request("POST", f"/episode-pools/{self.pool_id}/containers", json={})
        return ContainerInstance(str(r["sandbox_id"]), str(r["container_id"]), self)

    def end(self, container_id: str, status: str) -> None:
        """Destroys the container; `status` (the episode's) tells the daemon whether to retire
        its pooled sandbox. An already ended container is not an error."""
        PORTAL.run(self.aend(container_id, status))

    async def aend(self, container_id: str, status: str) -> None:
        """`end`, awaitable (on the SDK's event loop)."""
        try:
            await self.client.aio.request("DELETE", f"/episode-pools/{self.pool_id}/containers/{container_id}",
                                          params={"status": status})
        except (errors.ContainerNotFound, errors.EpisodePoolNotFound):
            pass

    def describe(self) -> dict[str, Any]:
        return dict(self.client.request("GET", f"/episode-pools/{self.pool_id}"))

    def close(self) -> None:
        self._closed.set()
        try:
            self.client.request("DELETE", f"/episode-pools/{self.pool_id}")
        except errors.RollboxError:
            pass
