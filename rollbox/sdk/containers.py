"""Episode containers: the `sb` a SandboxPool(isolation="container") episode function gets.

A container is a fresh set of namespaces and a copy-on-write root inside a pooled gVisor
sandbox (see rollbox/server/episodes.py); it has the sandbox API an episode needs (`exec`,
`fs.*`) and is discarded when the episode ends. What it shares with other episodes of the
same pooled sandbox is gVisor's kernel (never the host's): the README's threat model.
"""

from __future__ import annotations

import asyncio
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
# Seconds an episode's end waits to ride on the next begin's request (one request fewer per
# episode when episodes follow each other) before it is sent on its own.
END_FLUSH_S = 0.05


class ContainerInstance(SandboxInstance):
    """One episode's container. `sandbox_id` is the pooled sandbox; `container_id` its own id.

    Thread-safe like SandboxInstance. `terminate()` ends the container (idempotent); the pool
    ends it anyway when the episode returns.
    """

    # Other episodes' containers run in the same pooled sandbox: a whole-sandbox OOM may be
    # theirs (SandboxPool._classify).
    shares_sandbox = True

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
    trainer's pooled sandboxes end within ~a minute). Use `close()` when done.

    runtime: "gvisor" (pooled sandboxes restored from the snapshot) or "runc" (pooled runc
    sandboxes booted with the snapshot's files; the containers share the host kernel)."""

    def __init__(self, client: Client, snapshot_id: str, *, max_concurrency: int, sandboxes: int | None = None,
                 episodes_per_sandbox: int | None = None, keep_warm_seconds: float | None = 600,
                 tags: dict[str, str] | None = None, lease_s: float = 60.0, runtime: str = "gvisor") -> None:
        self.client = client
        body: dict[str, Any] = {"snapshot_id": snapshot_id, "max_concurrency": max_concurrency,
                                "sandboxes": sandboxes, "keep_warm_seconds": keep_warm_seconds, "tags": tags or {},
                                "lease_s": lease_s, "runtime": runtime}
        if episodes_per_sandbox is not None:
            body["episodes_per_sandbox"] = episodes_per_sandbox
        self._body = body
        self.pool_id = str(client.request("POST", "/episode-pools", json=body)["pool_id"])
        self._reopening: asyncio.Future[None] | None = None
        # Ends not yet sent, with the futures their `aend` callers wait on (SDK loop only).
        self._ends: list[tuple[dict[str, str], asyncio.Future[None]]] = []
        self._flush_pending = False
        self._flushes: set[asyncio.Task[None]] = set()
        self._closed = threading.Event()
        threading.Thread(target=self._heartbeat, args=(lease_s / 3,), daemon=True,
                         name=f"rollbox-lease-{self.pool_id}").start()

    def _heartbeat(self, every_s: float) -> None:
        while not self._closed.wait(every_s):
            try:
                self.client.request("PUT", f"/episode-pools/{self.pool_id}/heartbeat")
            except errors.RollboxError:
                # A restarting daemon, or one that restarted and forgot the pool (the next
                # begin opens it again, and this loop beats for the new id).
                continue

    def begin(self) -> ContainerInstance:
        """A fresh container (waits for a free slot). Raises SandboxLost (retryable) or
        UnsupportedOperation (the snapshot's image cannot host containers)."""
        return PORTAL.run(self.abegin())

    async def abegin(self) -> ContainerInstance:
        """`begin`, awaitable (on the SDK's event loop). Carries the ends queued by `aend`.

        A daemon that restarted has forgotten its episode pools (their sandboxes ended with
        it; the snapshot is on disk): the pool is opened again, once per restart, with the
        same arguments and the begin retried, instead of every later episode failing with
        EpisodePoolNotFound. Raises EpisodePoolNotFound after `close()`."""
        pool_id = self.pool_id
        try:
            return await self._abegin()
        except errors.EpisodePoolNotFound:
            if self._closed.is_set():
                raise
        await self._reopen(pool_id)
        return await self._abegin()

    async def _reopen(self, stale_id: str) -> None:
        """Opens the pool again unless another begin already did (or is doing) it."""
        while self._reopening is not None:
            await asyncio.shield(self._reopening)
        if self.pool_id != stale_id:
            return
        self._reopening = asyncio.get_running_loop().create_future()
        try:
            r = await self.client.aio.request("POST", "/episode-pools", json=self._body)
            self.pool_id = str(r["pool_id"])
            # Ends queued for the forgotten pool's containers: those went with its sandboxes.
            ends, self._ends = self._ends, []
            for _e, fut in ends:
                if not fut.done():
                    fut.set_result(None)
        finally:
            self._reopening.set_result(None)
            self._reopening = None

    async def _abegin(self) -> ContainerInstance:
        ends, self._ends = self._ends, []
        body: dict[str, Any] = {"end": [e for e, _f in ends]} if ends else {}
        request = asyncio.ensure_future(
            self.client.aio.request("POST", f"/episode-pools/{self.pool_id}/containers", json=body))
        try:
            r = await asyncio.shield(request)
        except asyncio.CancelledError:
            # Cancelled while the daemon may still make the container (leaving `map` early):
            # end whatever it makes, or its slot stays taken for the life of the pool.
            PORTAL.track(asyncio.ensure_future(self._end_when_made(request)))
            self._ends[:0] = ends
            self._schedule_flush()
            raise
        except BaseException:
            # The ends may not have reached the daemon: they go again (ending twice is harmless).
            self._ends[:0] = ends
            self._schedule_flush()
            raise
        if ends and r.get("ended") != len(ends):
            # A daemon that does not know the field ignored it: the ends go on their own.
            self._ends[:0] = ends
            self._schedule_flush()
        else:
            for _e, fut in ends:
                if not fut.done():
                    fut.set_result(None)
        return ContainerInstance(str(r["sandbox_id"]), str(r["container_id"]), self)

    async def _end_when_made(self, request: "asyncio.Future[Any]") -> None:
        try:
            r = await request
        except errors.RollboxError:
            return
        await self.aend(str(r["container_id"]), "ok")

    def end(self, container_id: str, status: str) -> None:
        """Destroys the container; `status` (the episode's) tells the daemon whether to retire
        its pooled sandbox. An already ended container is not an error."""
        PORTAL.run(self.aend(container_id, status))

    async def aend(self, container_id: str, status: str) -> None:
        """`end`, awaitable (on the SDK's event loop): the end rides on the next `abegin`'s
        request, or goes on its own after END_FLUSH_S; returns once it was sent."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ends.append(({"container_id": container_id, "status": status}, fut))
        self._schedule_flush()
        await asyncio.shield(fut)

    def _schedule_flush(self) -> None:
        # The flag drops when the timer fires, before the flush takes the queue: an end queued
        # while that flush's requests are out gets a timer of its own.
        if self._ends and not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(END_FLUSH_S, self._flush_now)

    def _flush_now(self) -> None:
        self._flush_pending = False
        if self._ends:
            task = asyncio.ensure_future(self.aflush())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def aflush(self) -> None:
        """Sends the queued ends now (each its own DELETE)."""
        ends, self._ends = self._ends, []

        async def one(end: dict[str, str], fut: asyncio.Future[None]) -> None:
            try:
                await self.client.aio.request(
                    "DELETE", f"/episode-pools/{self.pool_id}/containers/{end['container_id']}",
                    params={"status": end["status"]})
            except errors.RollboxError:
                pass  # ended already, the pool closed, or the daemon is gone (its sandboxes with it)
            finally:
                if not fut.done():
                    fut.set_result(None)
        await asyncio.gather(*(one(e, f) for e, f in ends))

    def describe(self) -> dict[str, Any]:
        return dict(self.client.request("GET", f"/episode-pools/{self.pool_id}"))

    def close(self) -> None:
        self._closed.set()
        try:
            PORTAL.run(self.aflush())
        except errors.RollboxError:
            pass
        try:
            self.client.request("DELETE", f"/episode-pools/{self.pool_id}")
        except errors.RollboxError:
            pass
