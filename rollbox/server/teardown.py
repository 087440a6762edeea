"""Ending sandboxes: terminate (idempotent, one teardown per sandbox at a time), removing what a
sandbox holds on the host, and the death watch that notices a sandbox ending by itself.

A sandbox's host resources are: a directory `sandboxes/<id>/` (bundle, overlay
upper/work/rootfs mount, FIFOs, runsc log), a runtime container, its cgroups, its processes
and, when networked, a network slot (two namespaces, veths, firewall rules) and the host
listeners of its exposed ports. `teardown_host` removes all of them and is safe to call twice;
`watchdog.recover` runs it for anything a crashed daemon left behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Iterable
from typing import Any

from .. import errors
from ..runtime import cgroups
from ..runtime.driver import Driver
from ..runtime.rootfs import remove_tree, unmount
from ..types import SandboxInfo
from .context import ServiceContext
from .registry import Live, ended_error
from .lifecycle import SandboxState
from .usage import Usage
from .validation import container_id

log = logging.getLogger("rollbox.service")


def kill_container_processes(driver: Driver, cid: str) -> None:
    for pid, _role in driver.processes(cid):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def retry_cgroup_leftovers(leftovers: set[str], live_ids: Iterable[str], cgroup_parent: str) -> None:
    """Removes the cgroups teardown could not (their last processes have exited since); drops
    from `leftovers` each one removed, gone, or reused by a live sandbox (`live_ids`)."""
    live = {container_id(s) for s in live_ids}
    for cid in list(leftovers):
        if cid in live or not cgroups.remove(cid, cgroup_parent):
            leftovers.discard(cid)


class Teardown:
    def __init__(self, ctx: ServiceContext, usage: Usage) -> None:
        self.ctx = ctx
        self.reg = ctx.registry
        self.usage = usage
        # Sandbox id -> (failed teardowns so far, monotonic time of the next try).
        self.pending: dict[str, tuple[int, float]] = {}

    def driver_of(self, sandbox_id: str) -> Driver:
        """The driver that owns a sandbox's container: from its directory's marker, its live
        handle or row, or runc's state root; gVisor otherwise."""
        ctx = self.ctx
        try:
            name = (ctx.sandbox_dir(sandbox_id) / "runtime").read_text().strip()
        except OSError:
            lv = self.reg.live.get(sandbox_id)
            row = None if lv is not None else ctx.store.get_row(sandbox_id)
            if lv is not None:
                name = lv.runtime
            elif row is not None and "runtime" in row.keys():
                name = row["runtime"]
            else:
                name = "runc" if (ctx.runc.root / container_id(sandbox_id) / "state.json").exists() else "gvisor"
        return ctx.drivers.get(name, ctx.runsc)

    async def terminate(self, sandbox_id: str, reason: str = "terminated") -> SandboxInfo:
        """Stops the sandbox and removes all it made on the host. Idempotent.

        Raises:
            SandboxNotFound: no such sandbox.
        """
        lv = self.reg.live.get(sandbox_id)
        if lv is None and self.ctx.store.get_row(sandbox_id) is None:
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
        task = self.reg.teardowns.get(sandbox_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._terminate(sandbox_id, reason))
            self.reg.teardowns[sandbox_id] = task
            task.add_done_callback(lambda _t: self.reg.teardowns.pop(sandbox_id, None))
        await asyncio.shield(task)
        return self.reg.info(sandbox_id)

    async def _terminate(self, sandbox_id: str, reason: str) -> None:
        async with self.reg.lock(sandbox_id):
            await self._terminate_locked(sandbox_id, reason)
        self.reg.locks.pop(sandbox_id, None)

    async def _terminate_locked(self, sandbox_id: str, reason: str) -> None:
        store = self.ctx.store
        if sandbox_id in self.reg.live:
            self.usage.record(sandbox_id)
        lv = self.reg.live.pop(sandbox_id, None)
        row = store.get_row(sandbox_id)
        state = None if row is None else SandboxState.of(row["state"], sandbox_id)
        if row is not None and state is SandboxState.PAUSED:
            # Nothing of it is on the host: it ends at once; only its paused state is removed.
            store.update_sandbox(sandbox_id, state=SandboxState.TERMINATED, ended_at=time.time(),
                                 exit_reason=reason, paused_snapshot_id=None)
            if row["paused_snapshot_id"]:
                await self.ctx.delete_snapshot_files(row["paused_snapshot_id"])
            return
        if lv is not None:
            reason = lv.exit_reason or reason
            lv.exit_reason = reason
            lv.channel.close(f"the sandbox was terminated ({reason})")
        # A row already terminating (a teardown cut short) keeps its first end time and reason.
        if state is not None and state is not SandboxState.TERMINATING and state.holds_host:
            store.update_sandbox(sandbox_id, state=SandboxState.TERMINATING, ended_at=time.time(), exit_reason=reason)
        left = await self.teardown_host(sandbox_id)
        if state is not None and state.holds_host:
            self.settle(sandbox_id, left)

    def settle(self, sandbox_id: str, left: list[str]) -> None:
        """Marks a torn-down sandbox terminated when nothing of it is left (`left` empty);
        otherwise it stays `terminating` and the watchdog retries its teardown (`retry_pending`)
        with backoff until everything is gone."""
        if not left:
            self.pending.pop(sandbox_id, None)
            self.ctx.store.update_sandbox(sandbox_id, state=SandboxState.TERMINATED)
            return
        tries = self.pending[sandbox_id][0] + 1 if sandbox_id in self.pending else 1
        delay = min(60.0, 0.5 * 2 ** tries)
        self.pending[sandbox_id] = (tries, time.monotonic() + delay)
        log.warning("teardown of %s incomplete (%s); it stays terminating, retry %d in %.0f s",
                    sandbox_id, "; ".join(left), tries, delay)

    async def retry_pending(self) -> list[str]:
        """The watchdog's duty: tears down again each sandbox whose teardown left something,
        once its backoff passed. Returns the ids now fully terminated."""
        done = []
        now = time.monotonic()
        for sid, (_tries, at) in list(self.pending.items()):
            if at > now or sid in self.reg.teardowns or sid in self.reg.live:
                continue
            async with self.reg.lock(sid):
                left = await self.teardown_host(sid)
                self.settle(sid, left)
            if not left:
                done.append(sid)
        return done

    async def teardown_host(self, sandbox_id: str, *, failed_start: bool = False) -> list[str]:
        """Removes everything the sandbox holds on the host; safe to call again. failed_start:
        its run/restore did not finish, so runsc may not know the container while its
        processes are up. Every step runs even when one before it failed; returns what could
        not be removed (empty: nothing of the sandbox is left)."""
        left: list[str] = []

        async def step(what: str, coro: Awaitable[Any]) -> None:
            try:
                await coro
            except Exception as e:  # noqa: BLE001 - each step is retried; none may stop the rest
                left.append(f"{what}: {type(e).__name__}: {e}")

        ctx = self.ctx
        cid = container_id(sandbox_id)
        d = ctx.sandbox_dir(sandbox_id)
        driver = self.driver_of(sandbox_id)
        # A frozen process cannot die, not even of SIGKILL: a warm spare (server/warm.py), or
        # one a crashed daemon left frozen, is thawed first.
        cgroups.thaw(cid, ctx.cg)
        # `runsc delete` waits for the sandbox process to be reaped, and we are its reaper:
        # keep reaping while it runs (the pidfd watch reaps the sandbox process itself).
        delete = asyncio.ensure_future(driver.delete(cid))
        while not delete.done():
            ctx.reaper.sweep(unless_within_s=0.025)
            await asyncio.wait({delete}, timeout=0.05)
        try:
            res = delete.result()
            # Classified from the runtime's state, not its message: a failed delete of a
            # container it has no state for had nothing to delete.
            unknown = res.returncode != 0 and not driver.known(cid)
            failed = res.returncode != 0 and not unknown
            detail = res.stderr.decode(errors="replace").strip()
        except errors.RollboxError as e:
            unknown, failed, detail = False, True, str(e)
        if failed:
            # Carry on whatever runsc says: kill what is left of the sandbox ourselves and
            # remove the rest, so a stuck runsc never leaks mounts, cgroups or directories.
            log.warning("%s delete %s failed (%s); killing its processes", driver.name, cid, detail)
            kill_container_processes(driver, cid)
            driver.forget(cid)
        if not failed and (unknown or failed_start):
            # A run/restore killed at its timeout may not have registered the container (or
            # delete could not reach a hung sandbox), but its sandbox and gofer processes may
            # be up, even spinning: find them by id.
            kill_container_processes(driver, cid)
        ctx.reaper.sweep()
        await step("port listeners", ctx.net.ports.close(sandbox_id))
        slot = self.reg.slots.get(sandbox_id)
        if slot is not None:
            n = len(left)
            await step("network slot (netns, veth, nft rules)", ctx.net.release(slot))
            if len(left) == n:  # released: forget it; otherwise the retry releases it again
                self.reg.slots.pop(sandbox_id, None)
        await step("rootfs mount", asyncio.to_thread(unmount, d / "rootfs"))
        await step("disk mount", asyncio.to_thread(unmount, d / "disk"))
        if await self._remove_cgroup(cid):
            left.append(f"cgroup {cid} (still busy)")
        n = len(left)
        await step("state directory", asyncio.to_thread(remove_tree, d))
        if len(left) == n and d.exists():
            left.append(f"state directory {d}")
        self.reg.mounts.release(sandbox_id)  # its processes are gone: nothing of it writes any more
        return left

    async def _remove_cgroup(self, cid: str) -> bool:
        """Removes the container's cgroups; True when they are still there (busy)."""
        # rmdir answers EBUSY while a killed process of the sandbox is still exiting or
        # unreaped: retry for a while, then leave it to the watchdog rather than leak it.
        for delay in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8):
            await asyncio.sleep(delay)
            self.ctx.reaper.sweep()
            if not cgroups.remove(cid, self.ctx.cg):
                self.reg.cgroup_leftovers.discard(cid)
                return False
        log.warning("cgroup of container %s still busy after teardown; the watchdog retries", cid)
        self.reg.cgroup_leftovers.add(cid)
        return True

    def retry_cgroup_leftovers(self) -> None:
        """Removes the cgroups teardown could not (their last processes have exited since)."""
        retry_cgroup_leftovers(self.reg.cgroup_leftovers, self.reg.live, self.ctx.cg)


class DeathWatch:
    """Notices a sandbox ending by itself (its channel closing, its process exiting, or it no
    longer answering) and terminates it with the reason that ending calls for."""

    def __init__(self, ctx: ServiceContext, teardown: Teardown) -> None:
        self.ctx = ctx
        self.reg = ctx.registry
        self.teardown = teardown

    def watch(self, lv: Live, find_pid: bool = True) -> None:
        """Notices the sandbox dying by itself: its channel closing or its process exiting."""
        sid = lv.sandbox_id
        lv.channel.on_lost = lambda reason: self._on_lost(sid, None, from_channel=True)
        if find_pid:
            procs = self.ctx.drivers.get(lv.runtime, self.ctx.runsc).processes(container_id(sid))
            lv.pid = next((pid for pid, role in procs if role == "sandbox"), None)
            # The gofer is our orphan too: a pidfd reaps it when it exits, so the reaper's sweep
            # never has to read /proc for it (that cost grew with every sandbox up).
            for pid, role in procs:
                if role == "gofer":
                    self.ctx.reaper.watch(pid, lambda _status: None)
        if lv.pid is not None:
            self.ctx.reaper.watch(lv.pid, lambda status: self._on_lost(sid, status))

    def _on_lost(self, sandbox_id: str, status: int | None, from_channel: bool = False) -> None:
        lv = self.reg.live.get(sandbox_id)
        if lv is None or lv.exit_reason is not None:
            return
        if from_channel and lv.channel.corrupted:
            lv.exit_reason = "channel_corrupted"
            log.warning("sandbox %s: %s; terminating it", sandbox_id, lv.channel.closed_reason)
            self.reg.spawn(self.teardown.terminate(sandbox_id, reason=lv.exit_reason))
            return
        if from_channel and lv.pid is not None and status is None:
            # The process watch tells how it ended; give it a moment before deciding blind.
            async def fallback() -> None:
                await asyncio.sleep(3.0)
                self._on_lost(sandbox_id, None)
            self.reg.spawn(fallback())
            lv.channel.fail("the sandbox closed its agent channel")
            return
        cid = container_id(sandbox_id)
        if cgroups.oom_killed(cid, self.ctx.cg):
            lv.exit_reason = "oom"
        elif lv.runtime == "gvisor" and cgroups.pids_max_count(cid, self.ctx.cg) > 0:
            # Its host cgroup refused gVisor a task: a sentry that cannot make one dies. On
            # ptrace every process that ever ran keeps a host thread (bundle.HOST_TASKS), so
            # repeated fork bombs get there (break-it trial: it was reported as init_exited).
            lv.exit_reason = "host_pids_limit"
        elif status is not None and os.WIFEXITED(status):
            # runsc-sandbox exits with a code when the container's init (our agent) ended:
            # something inside the sandbox killed it. A kill from outside leaves a signal.
            lv.exit_reason = "init_exited"
        else:
            lv.exit_reason = "exited"
        log.info("sandbox %s ended by itself (%s)", sandbox_id, lv.exit_reason)
        lv.channel.fail(f"the sandbox ended ({lv.exit_reason})")
        self.reg.spawn(self.teardown.terminate(sandbox_id, reason=lv.exit_reason))

    @staticmethod
    async def _await_ending(lv: Live, wait_s: float = 4.0) -> None:
        """Waits (briefly) for a sandbox that ended by itself to have its ending classified."""
        deadline = time.monotonic() + wait_s
        while lv.exit_reason is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def request(self, lv: Live, op: str, wait_s: float | None, **fields: Any) -> dict[str, Any]:
        """One agent request. A sandbox that stops answering (alive but wedged, e.g. by a fork
        bomb) is terminated rather than left never answering again; a request cut off by the
        sandbox ending raises the error that ending calls for (`ended_error`)."""
        try:
            return await lv.channel.request(op, wait_s=wait_s, **fields)
        except errors.SandboxLost as lost:
            sid = lv.sandbox_id
            if lv.channel.closed_reason is None:
                log.warning("sandbox %s did not answer %s in %s s; terminating it", sid, op, wait_s)
                self.reg.spawn(self.teardown.terminate(sid, reason="unresponsive"))
                raise errors.SandboxLost(f"sandbox {sid} stopped answering `{op}` within {wait_s} s; it is "
                                         "being terminated", sandbox_id=sid) from lost
            if lv.exit_reason is None and lv.pausing:
                # Paused under the request (e.g. a client following a process's output): not
                # an ending; the next call resumes it.
                raise errors.InvalidState(f"sandbox {sid} was paused during `{op}`; the next call on it resumes "
                                          "it", sandbox_id=sid) from None
            await self._await_ending(lv)
            raise ended_error(sid, lv.exit_reason) from None
