"""One daemon's sandbox networking: a pool of prepared slots, the firewall, exposed ports.

Preparing a slot (two namespaces, two veth pairs, NAT) takes tens of milliseconds, so a few
are kept ready once networking is first used; a create with networking then only takes one.
The pool refills in the background and empties after `idle_s` without demand (scale to zero).
A finished sandbox's slot goes back to the pool (its policy reset to "blocked", eth0's address
restored) while the pool is short, and is destroyed otherwise: recycling costs ~10 ms against
~80 ms to make a slot and ~45 ms to remove one, work that would otherwise compete with the
next restores for the CPU. What a slot keeps between sandboxes is kernel bookkeeping in its
router namespace (connection-tracking entries of finished flows, which expire), never data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import tenacity
from pyroute2.netlink.exceptions import NetlinkError

from .. import errors
from . import firewall
from .netns import MAX_SLOTS, NetLayout, Slot, create_slot, destroy_slot, existing_slots, open_ports, reset_slot
from .policy import NetworkPolicy, ResolvedPolicy, resolve
from .proxy import PortForwarder, ReadFile

log = logging.getLogger("rollbox.network")
SLOT_RETRY_WAIT_S = 0.2  # seconds before the second try of a slot; 0.4 before the third, ...


class NetworkManager:
    """prepared: slots kept ready; idle_s: seconds without a networked create before the
    ready slots are removed."""

    def __init__(self, home: Path, *, prepared: int = 4, idle_s: float = 120.0,
                 read_file: ReadFile | None = None) -> None:
        """read_file: reads a file in a sandbox (the port proxy says why a connection failed)."""
        self.layout = NetLayout.for_home(home)
        self.prepared = prepared
        self.idle_s = idle_s
        self.ports = PortForwarder(mark=self.layout.mark, read_file=read_file)
        self.nameservers = firewall.host_nameservers()
        self._started = False
        self._start_lock = asyncio.Lock()
        self._ready: list[Slot] = []
        self._in_use: dict[int, ResolvedPolicy | None] = {}
        # Slot index -> the ports its router forwards (as last applied by this daemon), and
        # the latest update of them under way (updates of one slot run one after the other).
        self._open: dict[int, frozenset[int]] = {}
        self._opening: dict[int, asyncio.Future[None]] = {}
        self._creating: set[int] = set()
        # Indexes whose namespaces are being removed: not free until they are gone.
        self._releasing: set[int] = set()
        self._refill: asyncio.Task[None] | None = None
        self._last_demand = 0.0
        self._closing = False

    # ---- lifecycle -----------------------------------------------------------------------

    async def recover(self, keep: dict[int, NetworkPolicy | None]) -> int:
        """After a daemon (re)start: keeps the slots of re-attached sandboxes (and their
        rules), removes every other slot and rule this daemon's layout made. Returns how many
        slots were removed."""
        stale = await asyncio.to_thread(existing_slots, self.layout)
        stale -= set(keep)
        await asyncio.gather(*(asyncio.to_thread(destroy_slot, self.layout.slot(i)) for i in stale))
        if keep:
            resolved = {i: await self._resolve_quiet(p) for i, p in keep.items()}
            await self._ensure_started()
            await asyncio.to_thread(firewall.reset, self.layout, self.nameservers,
                                    {self.layout.slot(i): r for i, r in resolved.items()})
            self._in_use.update(resolved)
        else:
            try:
                await asyncio.to_thread(firewall.drop, self.layout)
            except errors.RuntimeMissing:
                pass  # no nft on this host: nothing of ours can be there either
        return len(stale)

    async def _resolve_quiet(self, policy: NetworkPolicy | None) -> ResolvedPolicy | None:
        if policy is None:
            return None
        try:
            return await asyncio.to_thread(resolve, policy)
        except errors.InvalidArgument:
            return ResolvedPolicy(NetworkPolicy(True, None))  # a name gone since: block, not open

    async def _ensure_started(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            await asyncio.to_thread(firewall.enable_forwarding)
            await asyncio.to_thread(firewall.reset, self.layout, self.nameservers, {})
            self._started = True

    async def close(self) -> None:
        """Daemon shutdown: removes the ready slots and stops the port listeners. Slots in use
        stay (their sandboxes outlive the daemon; the next daemon re-attaches them)."""
        self._closing = True
        if self._refill is not None:
            self._refill.cancel()
        ready, self._ready = self._ready, []
        await asyncio.gather(*(self._destroy(s) for s in ready))
        await self.ports.close_all()
        if self._started and not self._in_use:
            await asyncio.to_thread(firewall.drop, self.layout)

    # ---- slots ---------------------------------------------------------------------------

    def _next_index(self) -> int:
        taken = set(self._in_use) | self._creating | self._releasing | {s.index for s in self._ready}
        for i in range(MAX_SLOTS):
            if i not in taken:
                return i
        raise errors.ResourceExhausted(f"all {MAX_SLOTS} network slots are in use: end some networked sandboxes")

    async def _make(self, attempts: int = 3) -> Slot:
        """A new slot. Retried: on a saturated host pyroute2's namespace helper process can
        miss its reply deadline ("no response from the child")."""
        slot = self.layout.slot(self._next_index())
        self._creating.add(slot.index)

        async def once() -> Slot:
            try:
                await asyncio.to_thread(create_slot, slot)
                await asyncio.to_thread(firewall.nft, firewall.slot_rules(slot, None))
                self._open[slot.index] = frozenset()  # its router forwards nothing yet
                return slot
            except BaseException:  # cancelled too: nothing half-made is left
                await asyncio.to_thread(destroy_slot, slot)
                raise

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_incrementing(start=SLOT_RETRY_WAIT_S, increment=SLOT_RETRY_WAIT_S),
            retry=tenacity.retry_if_exception_type((OSError, NetlinkError, errors.RollboxError)),
            before_sleep=lambda state: log.info("preparing network slot %d failed (%s); retrying", slot.index,
                                                state.outcome.exception() if state.outcome else None),
            reraise=True)
        try:
            return await retrying(once)
        except (OSError, NetlinkError, errors.RollboxError) as e:
            raise errors.ResourceExhausted(f"preparing network slot {slot.index} failed {attempts} times: {e}") from e
        finally:
            self._creating.discard(slot.index)

    async def _destroy(self, slot: Slot) -> None:
        self._releasing.add(slot.index)
        self._open.pop(slot.index, None)
        try:
            try:
                await asyncio.to_thread(firewall.nft, firewall.remove_slot_rules(slot))
            except errors.RuntimeMissing as e:
                log.warning("removing rules of slot %d: %s", slot.index, e)
            await asyncio.to_thread(destroy_slot, slot)
        finally:
            self._releasing.discard(slot.index)

    async def acquire(self, policy: NetworkPolicy, strict: bool = True,
                      ports: Iterable[int] = ()) -> tuple[Slot, ResolvedPolicy]:
        """A ready slot with `policy` applied, its router set to forward `ports` in the
        background (while the sandbox starts; `expose` waits for it). Raises InvalidArgument (a
        name that does not resolve; with strict=False, for restores and resumes, such a policy
        blocks outbound traffic instead, so a paused sandbox can always come back),
        RuntimeMissing (nft or iproute2 absent), ResourceExhausted."""
        self._last_demand = time.monotonic()
        if strict:
            resolved = await asyncio.to_thread(resolve, policy)
        else:
            resolved = await self._resolve_quiet(policy) or ResolvedPolicy(NetworkPolicy())
        await self._ensure_started()
        slot = self._ready.pop() if self._ready else await self._make()
        self._in_use[slot.index] = resolved
        # Refill only once the pool runs low: at a steady pace the slots that sandboxes give
        # back (recycled in release) keep it full without making or removing any.
        if len(self._ready) < max(1, self.prepared // 2):
            self._kick()
        if ports:
            self._forward(slot, ports)
        try:
            if not policy.block_network:
                await asyncio.to_thread(firewall.nft, firewall.policy_rules(slot, resolved))
        except BaseException:
            await self.release(slot)
            raise
        return slot, resolved

    async def update(self, slot: Slot, policy: NetworkPolicy) -> ResolvedPolicy:
        resolved = await asyncio.to_thread(resolve, policy)
        await asyncio.to_thread(firewall.nft, firewall.policy_rules(slot, resolved))
        self._in_use[slot.index] = resolved
        return resolved

    def _forward(self, slot: Slot, ports: Iterable[int]) -> asyncio.Future[None]:
        """Makes the slot's router forward `ports` too (one nft transaction, ~15 ms, when that
        changes anything), after the update of it under way; a failed update is tried again
        by the next one, whose waiter sees the error."""
        prev, ports = self._opening.get(slot.index), frozenset(ports)

        async def update() -> None:
            if prev is not None:
                with contextlib.suppress(Exception):
                    await prev
            want = self._open.get(slot.index, frozenset()) | ports
            if want != self._open.get(slot.index):
                await asyncio.to_thread(open_ports, slot, want)
                self._open[slot.index] = want

        task = self._opening[slot.index] = asyncio.ensure_future(update())
        return task

    async def expose(self, sandbox_id: str, slot: Slot, ports: Iterable[int],
                     host_ports: dict[int, int] | None = None) -> dict[int, str]:
        """Opens `ports` of the slot's sandbox to rollbox's listeners, and only to them (the
        router forwards just these ports, from the host end), and listens for each on the
        host (on `host_ports[port]` when still free). Returns {port: URL}. Raises RuntimeMissing."""
        ports = tuple(ports)
        await self._forward(slot, ports)
        return {p: await self.ports.expose(sandbox_id, p, slot.uplink_ip, (host_ports or {}).get(p, 0))
                for p in ports}

    async def release(self, slot: Slot) -> None:
        """Called once the slot's sandbox is gone: recycles or destroys the slot."""
        pending = self._opening.pop(slot.index, None)
        if pending is not None:  # an update still under way must not land after the reset
            with contextlib.suppress(Exception):
                await pending
        self._in_use.pop(slot.index, None)  # then at once into _releasing or _destroy: never free meanwhile
        opened = self._open.pop(slot.index, None)  # None: opened by an earlier daemon, unknown
        if not self._closing and len(self._ready) + len(self._creating) + len(self._releasing) < self.prepared:
            self._releasing.add(slot.index)
            try:
                await asyncio.to_thread(firewall.nft, firewall.policy_rules(slot, None))
                if opened != frozenset():
                    await asyncio.to_thread(open_ports, slot, ())
                await asyncio.to_thread(reset_slot, slot)
            except Exception as e:  # noqa: BLE001 - a slot that cannot be reset is destroyed instead
                log.warning("recycling network slot %d failed (%s); removing it", slot.index, e)
            else:
                self._open[slot.index] = frozenset()
                self._ready.append(slot)
                return
            finally:
                self._releasing.discard(slot.index)
        await self._destroy(slot)

    def slot(self, index: int) -> Slot:
        return self.layout.slot(index)

    def _kick(self) -> None:
        if self._refill is None or self._refill.done():
            self._refill = asyncio.get_running_loop().create_task(self._fill())

    async def _fill(self) -> None:
        while len(self._ready) + len(self._creating) < self.prepared:
            try:
                self._ready.append(await self._make())
            except Exception as e:  # noqa: BLE001 - a background refill must never die silently
                log.warning("preparing a network slot failed: %s", e)
                return

    async def expire(self) -> None:
        """Called by the watchdog: empties the ready pool after `idle_s` without demand."""
        if self._ready and time.monotonic() - self._last_demand > self.idle_s:
            ready, self._ready = self._ready, []
            await asyncio.gather(*(self._destroy(s) for s in ready))

    def stats(self) -> dict[str, int]:
        return {"ready": len(self._ready), "in_use": len(self._in_use), "ports": self.ports.count()}
