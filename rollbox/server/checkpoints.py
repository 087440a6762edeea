"""Memory snapshots and what is built on them: capture, list, delete, fork (copies from one
capture), pause (capture, then free the sandbox's CPU and memory) and resume (restore with the
same id). A paused sandbox wakes on demand: `running` resumes it for the request at hand."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .. import errors
from ..runtime import agentdir, cgroups
from ..runtime.bundle import AGENT_DIR
from ..runtime.driver import no_snapshots
from ..runtime.rootfs import copy_tree, disk_free_bytes, disk_full
from ..snapshots.store import SnapshotMeta, new_snapshot_id
from ..types import SandboxInfo
from .boot import Booter
from .context import ServiceContext
from .lifecycle import SandboxState
from .registry import Live
from .teardown import DeathWatch, Teardown
from .usage import Usage
from .validation import MIN_FREE_DISK, container_id

if TYPE_CHECKING:
    from .warm import WarmPools

log = logging.getLogger("rollbox.service")
# Seconds the agent holds its output for a checkpoint at most: runsc checkpoint's own limit
# (runtime/runsc.py, 300 s) and some. Released at once when the checkpoint returns.
CHECKPOINT_HOLD_S = 330.0


class Checkpoints:
    def __init__(self, ctx: ServiceContext, booter: Booter, teardown: Teardown, deathwatch: DeathWatch,
                 usage: Usage, warm: "WarmPools") -> None:
        self.ctx = ctx
        self.reg = ctx.registry
        self.booter = booter
        self.teardown = teardown
        self.deathwatch = deathwatch
        self.usage = usage
        self.warm = warm

    async def running(self, sandbox_id: str) -> Live:
        """The live sandbox, resuming it first if it is paused (it wakes on demand).

        Raises:
            SandboxNotFound, SandboxLost, SandboxTerminated: as `Registry.lookup`.
        """
        lv = self.reg.live.get(sandbox_id)
        if lv is None:
            lock = self.reg.locks.get(sandbox_id)
            if lock is not None and lock.locked():
                async with lock:  # a pause/resume/terminate in progress: wait for its outcome
                    pass
            if self.ctx.store.state(sandbox_id) is SandboxState.PAUSED:
                await self.resume(sandbox_id)
        elif lv.frozen:
            # A warm spare asked for directly (by id, not through its pool): it runs again.
            cgroups.thaw(container_id(sandbox_id), self.ctx.cg)
            lv.frozen = False
        elif lv.channel.closed_reason is not None and lv.exit_reason is None:
            # It just died: give the death watch a moment to say how (oom, init killed, lost).
            deadline = time.monotonic() + 4.0
            while lv.exit_reason is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        return self.reg.lookup(sandbox_id)

    async def snapshot_memory(self, sandbox_id: str, *, internal: bool = False, kind: str = "memory",
                              leave_running: bool = True, ttl_s: float | None = None, lv: Live | None = None) -> str:
        """Captures memory, processes and files; the sandbox keeps running unless
        `leave_running=False` (pause). `ttl_s`: seconds before the store deletes it (None: kept).
        Returns the snapshot id.

        Raises:
            InvalidArgument: a non-positive ttl.
            UnsupportedOperation: the sandbox's runtime cannot checkpoint.
            ResourceExhausted: the disk under the snapshot store is (nearly) full.
            SandboxLost: the checkpoint failed.
        """
        ctx = self.ctx
        if ttl_s is not None and ttl_s <= 0:
            raise errors.InvalidArgument(f"ttl={ttl_s} must be a positive number of seconds, or None to keep it")
        if lv is None:
            lv = await self.running(sandbox_id)
        if not ctx.drivers[lv.runtime].supports_snapshots:
            raise no_snapshots(sandbox_id, "a memory snapshot")
        sid = new_snapshot_id()
        d = ctx.snapshots.dir(sid)
        d.mkdir(parents=True)
        try:
            ck = ctx.snapshots.checkpoint_dir(sid)
            ck.mkdir()
            if disk_free_bytes(ctx.paths.snapshots) < MIN_FREE_DISK:
                raise errors.ResourceExhausted(
                    f"less than {MIN_FREE_DISK >> 20} MiB free under {ctx.paths.snapshots}: delete snapshots "
                    "(`rollbox snapshot rm`) or free disk", sandbox_id=sandbox_id)
            # At a frame boundary both ways (gh-19): a frame cut by the checkpoint would garble
            # the channel of the copies and of the source.
            async with lv.channel.quiesced(CHECKPOINT_HOLD_S) as how:
                if how != "held":
                    # An agent pinned before quiesce existed (restored from an old snapshot), or
                    # one that did not answer in time (overloaded): checkpointed as before.
                    log.log(logging.INFO if how == "old_agent" else logging.WARNING,
                            "sandbox %s: checkpoint with its agent channel not quiesced (%s): a file "
                            "transfer in flight may garble it", sandbox_id, how)
                res = await ctx.runsc.checkpoint(container_id(sandbox_id), ck, leave_running=leave_running)
                if res.returncode == 0:
                    # Still quiesced: no upload of the daemon's adds or renames a file meanwhile
                    # (a streamed upload's temporary vanished under `cp`: an untyped error).
                    await asyncio.to_thread(copy_tree, ctx.upper_dir(sandbox_id), ctx.snapshots.upper_dir(sid))
            if res.returncode != 0:
                detail = res.stderr.decode(errors="replace").strip()[-800:]
                if disk_full(ck):
                    raise errors.ResourceExhausted(f"disk full while checkpointing sandbox {sandbox_id}: free space "
                                                   f"under {ctx.paths.snapshots}", sandbox_id=sandbox_id)
                raise errors.SandboxLost(f"checkpointing sandbox {sandbox_id} failed: {detail}",
                                         sandbox_id=sandbox_id)
            own = ctx.sandbox_dir(sandbox_id) / "agent"  # absent for a sandbox started before pinning
            agentdir.link_into(own if own.is_dir() else AGENT_DIR, d / "agent")
            ctx.snapshots.write_meta(SnapshotMeta(sid, sandbox_id, lv.image_id, lv.cpu, lv.memory_mib, lv.env,
                                                  time.time(), internal, lv.volumes, kind, lv.key.hex(),
                                                  lv.net.to_wire() if lv.net else None, lv.disk_mib,
                                                  lv.platform, agent_pinned=True, pids=lv.pids, tmpfs=lv.tmpfs))
            ctx.store.insert_snapshot(sid, sandbox_id, lv.image_id, internal, kind,
                                      None if ttl_s is None else time.time() + ttl_s)
        except BaseException:
            await asyncio.to_thread(ctx.snapshots.remove, sid)
            raise
        return sid

    def snapshot_in_use(self, snapshot_id: str) -> str | None:
        """Why the snapshot cannot be deleted now, or None."""
        if self.reg.snapshot_users.get(snapshot_id):
            return f"{self.reg.snapshot_users[snapshot_id]} restore(s) of it are in progress"
        if self.warm.in_use(snapshot_id):
            return "it has a warm pool (set its size to 0 first)"
        for row in self.ctx.store.list_rows((SandboxState.PAUSED,)):
            if row["paused_snapshot_id"] == snapshot_id:
                return f"it holds the paused state of sandbox {row['sandbox_id']} (resume or terminate that first)"
        return None

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot. Raises InvalidState while it is in use, SnapshotNotFound if unknown."""
        try:
            self.ctx.snapshots.meta(snapshot_id)
        except errors.InvalidState:
            pass  # an unreadable meta.json: deleting the snapshot is the way out
        why = self.snapshot_in_use(snapshot_id)
        if why:
            raise errors.InvalidState(f"snapshot {snapshot_id} is in use: {why}")
        await self.ctx.delete_snapshot_files(snapshot_id)

    def list_snapshots(self) -> list[dict[str, Any]]:
        rows = {r["snapshot_id"]: r for r in self.ctx.store.snapshot_rows()}
        out = []
        for meta in self.ctx.snapshots.list():
            r = rows.get(meta.snapshot_id)
            d = asdict(meta)
            del d["agent_key"]  # the sandbox channel's key: the daemon's alone (new-user trial)
            d["expires_at"] = r["expires_at"] if r is not None else None
            d["in_use"] = self.snapshot_in_use(meta.snapshot_id)
            d["size_bytes"] = self.ctx.snapshots.size_bytes(meta.snapshot_id)
            out.append(d)
        return out

    async def fork(self, sandbox_id: str, count: int, keep_warm_seconds: float | None = 600) -> list[dict[str, Any]]:
        """`count` live copies from one capture; a failed copy is an error entry in its slot.

        Raises:
            InvalidArgument: count outside 1..1024.
            VolumeBusy: the sandbox writes a volume, which its copies would all write beside it.
        """
        if count < 1 or count > 1024:
            raise errors.InvalidArgument(f"fork count={count} must be between 1 and 1024")
        # Every copy mounts what the source does, beside it: refuse before capturing anything.
        self.reg.mounts.check(None, "gvisor", (await self.running(sandbox_id)).volumes)
        sid = await self.snapshot_memory(sandbox_id, internal=True)
        try:
            results = await asyncio.gather(
                *(self.booter.restore(sid, keep_warm_seconds=keep_warm_seconds, fork_index=i) for i in range(count)),
                return_exceptions=True)
        finally:
            await self.ctx.delete_snapshot_files(sid)
        out: list[dict[str, Any]] = []
        for r in results:
            if isinstance(r, errors.RollboxError):
                out.append({"error": r.to_wire()})
            elif isinstance(r, BaseException):
                out.append({"error": errors.ApiError(f"fork failed: {r}").to_wire()})
            else:
                out.append({"sandbox": r})
        return out

    async def pause(self, sandbox_id: str) -> str:
        """Checkpoints memory, processes and files to the store and frees the sandbox's CPU and
        memory; returns the paused state's snapshot id (restorable into copies: branching).

        Raises:
            UnsupportedOperation: the runtime cannot checkpoint.
            InvalidState: commands are still running in it.
        """
        ctx = self.ctx
        async with self.reg.lock(sandbox_id):
            lv = self.reg.lookup(sandbox_id)
            if not ctx.drivers[lv.runtime].supports_snapshots:
                raise no_snapshots(sandbox_id, "pause")
            if lv.busy:
                raise errors.InvalidState(f"sandbox {sandbox_id} has {lv.busy} command(s) running; pause it when "
                                          "they return (background processes are fine)", sandbox_id=sandbox_id)
            # Detach the death watch first: the sandbox stops by design after the checkpoint.
            lv.pausing = True
            self.reg.live.pop(sandbox_id, None)
            lv.channel.on_lost = None
            if lv.pid is not None:
                ctx.reaper.unwatch(lv.pid)
            try:
                sid = await self.snapshot_memory(sandbox_id, kind="pause", leave_running=False, lv=lv)
            except BaseException:
                lv.pausing = False
                self.reg.live[sandbox_id] = lv
                self.deathwatch.watch(lv, find_pid=False)
                raise
            lv.channel.close("the sandbox was paused")
            self.usage.record(sandbox_id)
            ctx.store.update_sandbox(sandbox_id, state=SandboxState.PAUSED, paused_snapshot_id=sid)
            ctx.store.close_interval(sandbox_id, time.time())
            await self.teardown.teardown_host(sandbox_id)
            return sid

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        """Brings a paused sandbox back exactly where it was, with the same id.

        Raises:
            SandboxNotFound: no such sandbox.
            InvalidState: it is neither paused nor running.
        """
        async with self.reg.lock(sandbox_id):
            row = self.ctx.store.get_row(sandbox_id)
            if row is None:
                raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
            state = SandboxState.of(row["state"], sandbox_id)
            if state is SandboxState.RUNNING and sandbox_id in self.reg.live:
                return self.reg.info(sandbox_id)
            if state is not SandboxState.PAUSED:
                raise errors.InvalidState(f"sandbox {sandbox_id} is {state.value}, not paused; only a paused "
                                          "sandbox can be resumed", sandbox_id=sandbox_id)
            snap_id = row["paused_snapshot_id"]
            meta = self.ctx.snapshots.meta(snap_id)
            # Listeners are taken again on the ports the sandbox had, when they are still free.
            host_ports = {int(p): hp for p, hp in json.loads(row["host_ports"] or "{}").items()}
            info = await self.booter.boot(sandbox_id=sandbox_id, image_id=meta.image_id, cpu=meta.cpu,
                                          memory_mib=meta.memory_mib, env=meta.env,
                                          keep_warm_seconds=row["keep_warm_seconds"], snapshot=meta,
                                          fork_index=row["fork_index"], resume=True, host_ports=host_ports)
            await self.ctx.delete_snapshot_files(snap_id)
            return info
