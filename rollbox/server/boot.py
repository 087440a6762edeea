"""Starting sandboxes: a fresh boot, a restore from a snapshot, a resume of a paused one (the
same id again), and an acquire (a warm spare, else a restore). Every start passes admission
control, and a start that fails part-way removes all it made (`Teardown.teardown_host`)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import errors
from ..network.netns import Slot
from ..network.policy import NetworkSpec, ResolvedPolicy
from ..runtime import agentdir, cgroups
from ..runtime.bundle import DEFAULT_PIDS, BundleSpec, default_agent, tmpfs_mounts, write_bundle
from ..runtime.channel import AgentChannel, make_fifos, open_for_sandbox
from ..runtime.driver import start_failed
from ..runtime.gpu import Gpu, oci_devices as gpu_devices
from ..runtime.rootfs import copy_tree, disk_free_bytes, keep_tmp_on_disk, mount_disk, mount_overlay, write_hostname
from ..runtime.runsc import DEFAULT_PLATFORM, PLATFORMS
from ..snapshots.store import SnapshotMeta
from ..types import SandboxInfo
from .admission import Admission
from .context import ServiceContext
from .lifecycle import SandboxState
from .networking import Networking
from .registry import Live, in_use
from .teardown import DeathWatch, Teardown
from .validation import (BOOT_TIMEOUT_S, MIN_FREE_DISK, check_disk, check_env, check_limits, check_pids, container_id,
                         new_sandbox_id)

if TYPE_CHECKING:
    from .warm import WarmPools


class Booter:
    def __init__(self, ctx: ServiceContext, admission: Admission, teardown: Teardown, deathwatch: DeathWatch,
                 networking: Networking, warm: "WarmPools") -> None:
        self.ctx = ctx
        self.reg = ctx.registry
        self.admission = admission
        self.teardown = teardown
        self.deathwatch = deathwatch
        self.networking = networking
        self.warm = warm

    async def boot(self, *, sandbox_id: str, image_id: str, cpu: float, memory_mib: int,
                   env: dict[str, str], keep_warm_seconds: float | None,
                   snapshot: SnapshotMeta | None = None, fork_index: int | None = None,
                   volumes: list[dict[str, Any]] | None = None, tags: dict[str, str] | None = None,
                   resume: bool = False, net: NetworkSpec | None = None,
                   host_ports: dict[int, int] | None = None, gpus: list[Gpu] | None = None,
                   privileged: bool = False, disk_mib: int | None = None, runtime: str = "gvisor",
                   pids: int = DEFAULT_PIDS, files_from: SnapshotMeta | None = None,
                   containers: bool = False, platform: str | None = None) -> SandboxInfo:
        """Starts one sandbox (a fresh boot, or from `snapshot`) once admission lets it.

        files_from: a fresh boot that starts with this snapshot's files (its overlay upper),
        not its memory. containers: the sandbox hosts episode containers (BundleSpec's).
        platform: a fresh gVisor sandbox's platform (None: the daemon's); a restore always runs
        on its snapshot's.

        Raises:
            InvalidArgument: limits, environment, disk cap or pids out of range.
            VolumeBusy: a read-write volume mount beside another sandbox's (volumes/writers.py).
            ResourceExhausted: the disk under the state directory is nearly full.
            SandboxLost: the runtime could not start it, or it did not answer in time.
        """
        t0 = time.monotonic()
        check_limits(cpu, memory_mib)
        check_env(env)
        check_disk(disk_mib)
        check_pids(pids)
        if snapshot is not None:
            disk_mib = snapshot.disk_mib  # the captured files must fit the same cap
            pids = snapshot.pids or DEFAULT_PIDS  # its processes hold the captured RLIMIT_NPROC
            volumes = snapshot.volumes  # a restore must mount exactly what was captured
            # ... and have the network it captured (its netstack expects the interface).
            net = NetworkSpec.from_wire(snapshot.network)
        volumes = list(volumes or [])
        # From now to the end of its teardown (which releases it; its row may not exist yet).
        self.reg.mounts.claim(sandbox_id, runtime, volumes)
        try:
            binds = tuple((str(self.ctx.volumes.ensure(v["name"])), v["mount_path"], bool(v.get("read_only")))
                          for v in volumes)
            kind = "create" if snapshot is None else ("resume" if resume else "restore")
            async with self.admission.start(runtime, kind):
                return await self._start(sandbox_id=sandbox_id, image_id=image_id, cpu=cpu,
                                         memory_mib=memory_mib, env=env, keep_warm_seconds=keep_warm_seconds,
                                         snapshot=snapshot, fork_index=fork_index, volumes=volumes, tags=tags,
                                         resume=resume, binds=binds, t0=t0, net=net,
                                         host_ports=host_ports or {}, gpus=gpus or [], privileged=privileged,
                                         disk_mib=disk_mib, runtime=runtime, pids=pids,
                                         files_from=files_from, containers=containers, platform=platform)
        except BaseException:
            if sandbox_id not in self.reg.live:
                self.reg.mounts.release(sandbox_id)
            raise

    async def _start(self, *, sandbox_id: str, image_id: str, cpu: float, memory_mib: int,
                     env: dict[str, str], keep_warm_seconds: float | None, snapshot: SnapshotMeta | None,
                     fork_index: int | None, volumes: list[dict[str, Any]], tags: dict[str, str] | None,
                     resume: bool, binds: tuple[tuple[str, str, bool], ...], t0: float,
                     net: NetworkSpec | None, host_ports: dict[int, int], gpus: list[Gpu],
                     privileged: bool, disk_mib: int | None, runtime: str = "gvisor",
                     pids: int = DEFAULT_PIDS, files_from: SnapshotMeta | None = None,
                     containers: bool = False, platform: str | None = None) -> SandboxInfo:
        ctx = self.ctx
        if disk_free_bytes(ctx.paths.home) < MIN_FREE_DISK:
            raise errors.ResourceExhausted(
                f"less than {MIN_FREE_DISK >> 20} MiB free under {ctx.paths.home}: remove snapshots or images, or free disk")
        lowers = ctx.images.layers(image_id)  # raises ImageNotFound
        # A resume reuses its container id: the watchdog must not remove the new cgroup as the
        # pause's leftover.
        self.reg.cgroup_leftovers.discard(container_id(sandbox_id))
        # A checkpoint restores only on the platform it was taken on (a systrap image on ptrace
        # dies at once: measured with runsc 20240729).
        platform = "" if runtime != "gvisor" else (
            (snapshot.platform or DEFAULT_PLATFORM) if snapshot is not None else (platform or ctx.runsc.platform))
        agent_src = self.agent_source(snapshot, platform)
        cid = container_id(sandbox_id)
        d = ctx.sandbox_dir(sandbox_id)
        d.mkdir(parents=True)
        # Which runtime owns the container: teardown (also after a daemon crash) reads it here.
        (d / "runtime").write_text(runtime)
        driver = ctx.drivers[runtime]
        key = bytes.fromhex(snapshot.agent_key) if snapshot is not None else secrets.token_bytes(32)
        channel = AgentChannel(sandbox_id, d / "in", d / "out", key)
        slot: Slot | None = None
        resolved: ResolvedPolicy | None = None
        try:
            if net is not None:
                slot, resolved = await ctx.net.acquire(net.policy, strict=snapshot is None, ports=net.ports)
                self.reg.slots[sandbox_id] = slot
            layer = d / "disk"
            if disk_mib is not None:
                await asyncio.to_thread(mount_disk, layer, disk_mib, ctx.disk_templates)
            else:
                layer.mkdir()
            upper = ctx.upper_dir(sandbox_id)
            if snapshot is not None:
                # The restore's mounts must be the captured ones (None: from before they existed).
                tmpfs = dict(snapshot.tmpfs or {})
                await asyncio.to_thread(copy_tree, ctx.snapshots.upper_dir(snapshot.snapshot_id), upper)
            else:
                # The agent reads its key from the root and deletes it before any command runs.
                if files_from is not None:
                    await asyncio.to_thread(copy_tree, ctx.snapshots.upper_dir(files_from.snapshot_id), upper)
                else:
                    upper.mkdir(mode=0o755)
                kf = upper / ".rollbox-key"
                kf.write_bytes(key)
                kf.chmod(0o600)
                # /etc/hostname names the sandbox, as the kernel's host name does (Docker's
                # convention); a restored copy's agent rewrites it with its own name.
                write_hostname(upper, lowers, sandbox_id)
                # /tmp on the capped writable layer, except where Docker needs it in memory.
                tmpfs = dict(tmpfs_mounts(memory_mib, tmp_in_memory=privileged or not keep_tmp_on_disk(upper, lowers)))
            (d / "agent.key").write_bytes(key)
            await asyncio.to_thread(mount_overlay, lowers, upper, layer / "work", d / "rootfs")
            agent_dir = agentdir.link_into(agent_src, d / "agent")
            write_bundle(d, BundleSpec(rootfs=d / "rootfs", cgroup_path=cgroups.cgroup_path(cid, ctx.cg),
                                       agent_dir=agent_dir, agent=default_agent(agent_dir),
                                       cpu=cpu, memory_mib=memory_mib, env=env, binds=binds, hostname=sandbox_id,
                                       netns_path=slot.sandbox_ns_path if slot else None,
                                       devices=tuple(gpu_devices(gpus)) if gpus else (), privileged=privileged,
                                       pids=pids, platform=platform or DEFAULT_PLATFORM, tmpfs=tuple(tmpfs.items()),
                                       containers=containers),
                         driver.bundle_spec)
            fin, fout = make_fifos(d)
            sb_in, sb_out = open_for_sandbox(fin, fout)
            try:
                if snapshot is None:
                    res = await driver.start_detached("run", cid, d, stdin_fd=sb_in, stdout_fd=sb_out,
                                                      log_path=d / "runsc.log", timeout=BOOT_TIMEOUT_S,
                                                      networked=slot is not None, gpu=bool(gpus),
                                                      privileged=privileged, platform=platform or None)
                else:
                    ck = str(ctx.snapshots.checkpoint_dir(snapshot.snapshot_id))
                    res = await ctx.runsc.start_detached("restore", cid, d, stdin_fd=sb_in, stdout_fd=sb_out,
                                                         log_path=d / "runsc.log", timeout=BOOT_TIMEOUT_S,
                                                         extra=("--image-path", ck), networked=slot is not None,
                                                         platform=platform)
                channel.open()
            finally:
                os.close(sb_in)
                os.close(sb_out)
            if res.returncode != 0:
                raise errors.SandboxLost(
                    f"{'runsc' if runtime == 'gvisor' else runtime} could not start sandbox {sandbox_id} (exit {res.returncode}): "
                    f"{res.stderr.decode(errors='replace').strip()[-800:]}", sandbox_id=sandbox_id)
            if snapshot is None:
                await channel.wait_ready(BOOT_TIMEOUT_S)
            else:
                channel.resume_restored()  # captured quiesced (checkpoints.py): its output resumes
            identity = {"ROLLBOX_SANDBOX_ID": sandbox_id}
            if fork_index is not None:
                identity["ROLLBOX_FORK_INDEX"] = str(fork_index)
            if snapshot is not None:
                # Restored copies would otherwise share everything; give each its own identity,
                # host name and fresh entropy (gVisor's getrandom already reads host entropy).
                await channel.request("identity", wait_s=BOOT_TIMEOUT_S, env=identity, hostname=sandbox_id,
                                      entropy=base64.b64encode(os.urandom(64)).decode())
            else:
                await channel.request("identity", wait_s=BOOT_TIMEOUT_S, env=identity)
            if slot is not None and net is not None:
                if snapshot is None or (resolved is not None and resolved.hosts):
                    # A restored copy has the files its source had (same policy); only pinned
                    # names are looked up again.
                    await self.networking.write_net_files(channel, sandbox_id, resolved)
                await ctx.net.expose(sandbox_id, slot, net.ports, host_ports)
            ttfc_ms = (time.monotonic() - t0) * 1000
        except BaseException as exc:
            channel.close("the sandbox failed to start")
            await self.teardown.teardown_host(sandbox_id, failed_start=True)
            if isinstance(exc, errors.RollboxError) or not isinstance(exc, Exception):
                raise
            raise start_failed(sandbox_id, exc, BOOT_TIMEOUT_S) from exc
        cfg = ctx.images.meta(image_id).image_config
        lv = Live(sandbox_id, channel, image_id, cpu, memory_mib, env, keep_warm_seconds, volumes=volumes, key=key,
                  net=net, workdir=cfg.working_dir, user=cfg.user, disk_mib=disk_mib, runtime=runtime,
                  platform=platform, pids=pids, tmpfs=tmpfs)
        self.reg.live[sandbox_id] = lv
        # What a restarted daemon needs to re-adopt this sandbox as it was (watchdog.recover).
        fd = os.open(d / "live.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"env": env, "workdir": lv.workdir, "user": lv.user, "disk_mib": disk_mib,
                       "platform": platform, "pids": pids, "tmpfs": tmpfs}, f)
        now = time.time()
        net_cols = self.networking.net_columns(sandbox_id, net)
        if resume:
            row = ctx.store.get_row(sandbox_id)
            lv.auto_pause_seconds = row["auto_pause_seconds"] if row is not None else None
            ctx.store.update_sandbox(sandbox_id, state=SandboxState.RUNNING, paused_snapshot_id=None, **net_cols)
            ctx.store.open_interval(sandbox_id, now, boot_s=ttfc_ms / 1000)
        else:
            ctx.store.insert_sandbox(
                sandbox_id=sandbox_id, state=SandboxState.RUNNING, image_id=image_id, created_at=now, cpu=cpu,
                memory_mib=memory_mib, pids=pids, keep_warm_seconds=keep_warm_seconds,
                snapshot_id=snapshot.snapshot_id if snapshot else None, fork_index=fork_index, ttfc_ms=ttfc_ms,
                volumes=json.dumps(volumes), tags=json.dumps(tags or {}), runtime=runtime, platform=platform,
                **net_cols)
        self.deathwatch.watch(lv)
        return self.reg.info(sandbox_id)

    def agent_source(self, snapshot: SnapshotMeta | None, platform: str) -> Path:
        """Where a sandbox's /.rollbox comes from: the daemon's pinned build for a new sandbox,
        the snapshot's own copy for a restore (its agent process runs that very binary).

        Raises:
            InvalidState: the snapshot names a platform this rollbox cannot run, or its agent
                copy is missing or empty (restoring over another build would hang).
        """
        if snapshot is None:
            return self.ctx.agent_src
        sid = snapshot.snapshot_id
        if platform and platform not in PLATFORMS:
            raise errors.InvalidState(f"snapshot {sid} was taken on gVisor platform {platform!r}, which this "
                                      f"rollbox does not run (it runs {', '.join(PLATFORMS)}); delete it with "
                                      f"`rollbox snapshot rm {sid}`")
        pinned = self.ctx.snapshots.dir(sid) / "agent"
        if not snapshot.agent_pinned:
            return pinned if pinned.is_dir() else self.ctx.agent_src  # made before agents were pinned
        if not any((pinned / n).is_file() for n in agentdir.AGENT_FILES):
            raise errors.InvalidState(f"snapshot {sid} lacks the copy of the agent its processes run "
                                      f"({pinned} is missing or empty), so it cannot be restored; delete it "
                                      f"with `rollbox snapshot rm {sid}` and take it again")
        return pinned

    async def acquire(self, snapshot_id: str, *, keep_warm_seconds: float | None = 600,
                      tags: dict[str, str] | None = None) -> SandboxInfo:
        """A sandbox from the snapshot: a warm spare when the snapshot has a warm pool, else a
        fresh restore. Either way nobody else has had it."""
        t0 = time.monotonic()
        sid = self.warm.take(snapshot_id)
        self.ctx.metrics.warm_acquires.labels(result="miss" if sid is None else "hit").inc()
        if sid is not None:
            lv = self.reg.live[sid]
            lv.keep_warm_seconds = keep_warm_seconds
            lv.last_active = time.monotonic()
            merged = {**(tags or {}), "rollbox.warm": snapshot_id}
            self.ctx.store.update_sandbox(sid, keep_warm_seconds=keep_warm_seconds, tags=json.dumps(merged),
                                          ttfc_ms=(time.monotonic() - t0) * 1000)
            return self.reg.info(sid)
        return await self.restore(snapshot_id, keep_warm_seconds=keep_warm_seconds, tags=tags)

    async def boot_from_files(self, snapshot_id: str, *, runtime: str, keep_warm_seconds: float | None = 600,
                              tags: dict[str, str] | None = None) -> SandboxInfo:
        """A fresh sandbox on `runtime` with the snapshot's image, limits, environment,
        volumes, disk cap and files, but not its memory (runc has no memory snapshots here:
        processes it ran and files in its memory-backed mounts are not there), ready to
        host episode containers. Raises SnapshotNotFound for an unknown id."""
        meta = self.ctx.snapshots.meta(snapshot_id)
        with in_use(self.reg.snapshot_users, [snapshot_id]):
            return await self.boot(sandbox_id=new_sandbox_id(), image_id=meta.image_id, cpu=meta.cpu,
                                   memory_mib=meta.memory_mib, env=meta.env, keep_warm_seconds=keep_warm_seconds,
                                   volumes=meta.volumes, tags=tags, disk_mib=meta.disk_mib, runtime=runtime,
                                   pids=meta.pids or DEFAULT_PIDS, files_from=meta, containers=True)

    async def restore(self, snapshot_id: str, *, keep_warm_seconds: float | None = 600,
                      fork_index: int | None = None, tags: dict[str, str] | None = None) -> SandboxInfo:
        """A new sandbox restored from the snapshot. Raises SnapshotNotFound for an unknown id."""
        meta = self.ctx.snapshots.meta(snapshot_id)
        with in_use(self.reg.snapshot_users, [snapshot_id]):
            return await self.boot(sandbox_id=new_sandbox_id(), image_id=meta.image_id, cpu=meta.cpu,
                                   memory_mib=meta.memory_mib, env=meta.env, keep_warm_seconds=keep_warm_seconds,
                                   snapshot=meta, fork_index=fork_index, tags=tags)
