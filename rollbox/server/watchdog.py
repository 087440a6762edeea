"""The daemon's background duties: keep_warm expiry, snapshot TTLs, usage sampling, reaping,
and reconciling state after a (re)start. Functions over a SandboxService; no state of their own."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from .. import errors
from ..network.policy import NetworkSpec
from ..runtime import cgroups
from ..runtime.bundle import DEFAULT_PIDS
from ..runtime.channel import AgentChannel
from .registry import Live
from .service import SandboxService
from .validation import container_id
from .lifecycle import LIVE_STATES, SandboxState

log = logging.getLogger("rollbox.watchdog")


async def expire_idle(svc: SandboxService) -> list[str]:
    """Terminates sandboxes idle longer than their keep_warm_seconds (the leak backstop)."""
    expired = svc.take_idle(time.monotonic())  # each disarmed: it expires once
    for sid in expired:
        log.info("sandbox %s idle past keep_warm_seconds; terminating", sid)
        svc.spawn(svc.terminate(sid, reason="keep_warm_expired"))
    return expired



async def expire_snapshots(svc: SandboxService) -> list[str]:
    gone = []
    for sid in svc.store.expired_snapshots(time.time()):
        if svc.snapshot_in_use(sid) is None:
            await svc.delete_snapshot_files(sid)
            gone.append(sid)
    return gone



async def recover(svc: SandboxService) -> dict[str, int]:
    """After a daemon (re)start: re-attach live sandboxes, remove everything else.

    Rows move by the lifecycle table (`lifecycle.TRANSITIONS`, checked by the store): a paused
    sandbox whose snapshot is gone, a sandbox whose teardown was cut short, and one that did
    not survive the restart all become terminated."""
    svc.reaper.start()
    reattached = cleaned = 0
    keep_slots: dict[int, object] = {}
    running = set(await svc.runsc.list_ids()) | set(await svc.runc.list_ids())
    for row in svc.store.list_rows((SandboxState.PAUSED,)):
        try:
            svc.snapshots.meta(row["paused_snapshot_id"] or "sn-missing")
        except (errors.SnapshotNotFound, errors.InvalidArgument):
            svc.store.update_sandbox(row["sandbox_id"], state=SandboxState.TERMINATED, ended_at=time.time(),
                                      exit_reason="lost", paused_snapshot_id=None)
    for row in svc.store.list_rows(LIVE_STATES):
        sid = row["sandbox_id"]
        cid = container_id(sid)
        ok = False
        if SandboxState.of(row["state"], sid) is SandboxState.TERMINATING:
            svc.teardown.settle(sid, await svc.teardown_host(sid))  # retried until complete
            cleaned += 1
            continue
        if cid in running:
            cgroups.thaw(cid, svc.cg)  # a warm spare frozen by the previous daemon (server/warm.py)
            try:
                key = (svc.sandbox_dir(sid) / "agent.key").read_bytes()
            except OSError:
                key = b""
            ch = AgentChannel(sid, svc.sandbox_dir(sid) / "in", svc.sandbox_dir(sid) / "out", key)
            try:
                ch.open()
                # The previous daemon may have died during a checkpoint, the agent's output held.
                ch.resume_restored()
                await ch.request("ping", wait_s=5.0)
                ok = True
            except (errors.RollboxError, OSError):
                ch.close("unreachable after a daemon restart")
        if ok:
            try:  # env, image user/workdir and disk cap as the sandbox was started with
                saved = json.loads((svc.sandbox_dir(sid) / "live.json").read_text())
            except (OSError, ValueError):
                saved = {}
            lv = Live(sid, ch, row["image_id"], row["cpu"], row["memory_mib"], dict(saved.get("env") or {}),
                      row["keep_warm_seconds"], volumes=json.loads(row["volumes"] or "[]"), key=key,
                      runtime=row["runtime"], workdir=saved.get("workdir"), user=saved.get("user"),
                      disk_mib=saved.get("disk_mib"), platform=str(saved.get("platform") or ""),
                      pids=int(saved.get("pids") or DEFAULT_PIDS), tmpfs=dict(saved.get("tmpfs") or {}))
            # Idle time while the daemon was down counts towards keep_warm_seconds.
            lv.last_active = time.monotonic() - max(0.0, time.time() - row["last_active_at"])
            lv.auto_pause_seconds = row["auto_pause_seconds"]
            if row["net_slot"] is not None:
                lv.net = NetworkSpec.from_wire(json.loads(row["network"] or "null"))
                keep_slots[row["net_slot"]] = lv.net.policy if lv.net else None
            svc.adopt(lv, row["net_slot"])
            reattached += 1
        else:
            svc.store.update_sandbox(sid, state=SandboxState.TERMINATED, ended_at=time.time(), exit_reason="lost")
            await svc.teardown_host(sid)
            cleaned += 1
    live_cids = {container_id(s) for s in svc.live}
    stale = {"sb-" + cid for cid in running - live_cids}
    if svc.paths.sandboxes.is_dir():
        stale |= {d.name for d in svc.paths.sandboxes.iterdir() if d.name not in svc.live}
    # In parallel: each orphan's `runsc delete` waits on the slow PID-1 reaper.
    await asyncio.gather(*(svc.teardown_host(sid) for sid in stale))
    cleaned += len(stale)
    for cid in cgroups.leftover_ids(svc.cg) - live_cids:
        if cgroups.remove(cid, svc.cg):
            # Still busy (a process of the last daemon's sandbox still exiting): keep trying.
            svc.note_cgroup_leftover(cid)
    svc.images.remove_staging()  # no pull or build is in flight before the daemon serves
    for meta in svc.snapshots.list():
        if meta.internal:
            await svc.delete_snapshot_files(meta.snapshot_id)
    # Networks: keep the re-attached sandboxes' slots and rules, remove every other one, and
    # listen again for their exposed ports (on the same host ports when still free).
    net_cleaned = await svc.net.recover(keep_slots)  # type: ignore[arg-type]
    for sid, slot in svc.network_slots().items():
        nrow = svc.store.get_row(sid)
        nlv = svc.live.get(sid)
        if nrow is None or nlv is None or nlv.net is None:
            continue
        host_ports = {int(p): hp for p, hp in json.loads(nrow["host_ports"] or "{}").items()}
        await svc.net.expose(sid, slot, nlv.net.ports, host_ports)
        svc.store.update_sandbox(sid, **svc.net_columns(sid, nlv.net))
    return {"reattached": reattached, "cleaned": cleaned, "network_slots_cleaned": net_cleaned}


async def run(svc: SandboxService, interval_s: float = 1.0, sample_every: int = 5) -> None:
    """The watchdog loop: runs until cancelled; one failed pass never stops it."""
    n = 0
    while True:
        await asyncio.sleep(interval_s)
        n += 1
        try:  # first and on its own: no other duty's failure may leave zombies unreaped
            svc.reaper.sweep()
        except Exception:  # noqa: BLE001
            log.exception("reaper sweep failed")
        try:
            svc.warm.expire()
            await svc.net.expire()
            await expire_idle(svc)
            await svc.autopause.run_once()
            await svc.teardown.retry_pending()
            await expire_snapshots(svc)
            if n % sample_every == 0:
                svc.sample_usage()
            svc.retry_cgroup_leftovers()
        except Exception:  # noqa: BLE001 - the watchdog must outlive any one failure
            log.exception("watchdog pass failed")
