"""The sandbox service: one façade over the rooms that each do one job of the lifecycle.

    registry     live sandboxes, their locks, slots and in-use counts
    boot         starts: create boot, restore, resume, acquire (behind admission)
    create       create options: image config, volumes, GPUs, Docker, entrypoint
    checkpoints  memory snapshots, fork, pause, resume (and waking a paused sandbox)
    execfiles    exec and files through the agent
    teardown     terminate, host teardown, the death watch
    networking   network columns, /etc files, ports, policy changes
    usage        the usage ledger;  admission  concurrent starts;  artifacts  images/volumes

Every method runs on the daemon's event loop. Blocking host work (mount, copies) goes to a
thread; runsc runs as asyncio subprocesses. The routes, watchdog, warm pools, builder and
metrics use only this class's public names.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from ..config import Paths
from ..images.store import ImageStore
from ..network.manager import NetworkManager
from ..network.netns import Slot
from ..network.policy import NetworkSpec
from ..runtime import agentdir
from ..runtime.bundle import AGENT_DIR, DEFAULT_PIDS
from ..runtime.driver import Driver
from ..runtime.mounts import DiskTemplates
from ..runtime.reaper import Reaper
from ..runtime.runc import Runc
from ..runtime.runsc import Runsc
from ..snapshots.store import SnapshotStore
from ..types import SandboxInfo
from ..volumes.store import VolumeStore
from .admission import Admission, admission_limit
from .artifacts import Artifacts
from .autopause import AutoPause
from .boot import Booter
from .builder import Builder
from .checkpoints import Checkpoints
from .context import ServiceContext
from .create import Creator
from .execfiles import ExecFiles
from .metrics import Metrics
from .networking import Networking
from .registry import Live, Registry
from .store import Store
from .teardown import DeathWatch, Teardown
from .usage import Usage
from .validation import container_id
from .warm import WarmPools

__all__ = ["Live", "SandboxService", "container_id"]


class SandboxService:
    def __init__(self, paths: Paths, runsc: Runsc, store: Store, *, runc: Runc | None = None,
                 max_starts: int | None = None) -> None:
        self.paths = paths
        self.runsc = runsc
        # The agent new sandboxes boot from, pinned now: rebuilding the package's agent later
        # changes nothing for this daemon's sandboxes and snapshots (runtime/agentdir.py).
        # ROLLBOX_AGENT_DIR: another build's directory (rollbox-agent and/or agent.py).
        self.agent_src = agentdir.install(Path(os.environ.get("ROLLBOX_AGENT_DIR") or AGENT_DIR), paths.agents)
        self.runc = runc or Runc(paths.runc_root)
        self.drivers: dict[str, Driver] = {"gvisor": runsc, "runc": self.runc}
        self.store = store
        self.cg = paths.cgroup_parent
        self.images = ImageStore(paths.images)
        self.snapshots = SnapshotStore(paths.snapshots)
        self.reaper = Reaper()
        self.registry = Registry(store)
        self.live: dict[str, Live] = self.registry.live
        self.cgroup_leftovers: set[str] = self.registry.cgroup_leftovers
        self.volumes = VolumeStore(paths.volumes)
        self.net = NetworkManager(paths.home, read_file=self.read_bytes)
        self.warm = WarmPools(self)
        self.autopause = AutoPause(self)
        self.builder = Builder(self)
        # Before Metrics: its registry reads the gauges (admission limit included) at once.
        self.max_starts = max_starts or admission_limit()
        self.metrics = Metrics(self)
        self.admission = Admission(self.metrics, self.max_starts)
        ctx = self.ctx = ServiceContext(
            paths=paths, runsc=runsc, runc=self.runc, drivers=self.drivers, store=store, cg=self.cg,
            images=self.images, snapshots=self.snapshots, volumes=self.volumes, net=self.net, reaper=self.reaper,
            metrics=self.metrics, registry=self.registry, agent_src=self.agent_src,
            disk_templates=DiskTemplates(paths.home / "disk-templates"))
        self.usage = Usage(ctx)
        self.teardown = Teardown(ctx, self.usage)
        self.deathwatch = DeathWatch(ctx, self.teardown)
        self.networking = Networking(ctx, self._running)
        self.booter = Booter(ctx, self.admission, self.teardown, self.deathwatch, self.networking, self.warm)
        self.checkpoints = Checkpoints(ctx, self.booter, self.teardown, self.deathwatch, self.usage, self.warm)
        self.execfiles = ExecFiles(ctx, self.deathwatch, self._running)
        self.creator = Creator(ctx, self.booter, self.execfiles, self.teardown)
        self.artifacts = Artifacts(ctx, self.builder, self._running)

    async def _running(self, sandbox_id: str) -> Live:
        return await self.checkpoints.running(sandbox_id)

    # ---- registry ------------------------------------------------------------------------

    def upper_dir(self, sandbox_id: str) -> Path:
        """The sandbox's writable layer: everything it wrote (on a capped ext4 with `disk`)."""
        return self.ctx.upper_dir(sandbox_id)

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.ctx.sandbox_dir(sandbox_id)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Runs `coro` in the background, holding a reference until it ends."""
        self.registry.spawn(coro)

    def info(self, sandbox_id: str) -> SandboxInfo:
        """Raises SandboxNotFound for an unknown id."""
        return self.registry.info(sandbox_id)

    def list_sandboxes(self, all_states: bool = False) -> list[SandboxInfo]:
        return self.registry.list_sandboxes(all_states)

    def update_ttl(self, sandbox_id: str, keep_warm_seconds: float | None) -> SandboxInfo:
        """Sets keep_warm_seconds (None or <= 0: never expire) and counts as activity."""
        return self.registry.update_ttl(sandbox_id, keep_warm_seconds)

    def is_live(self, sandbox_id: str) -> bool:
        """Whether the sandbox is running in this daemon now."""
        return sandbox_id in self.live

    def touch(self, sandbox_id: str, at: float | None = None) -> None:
        """Counts as activity now (or at monotonic time `at`) for keep_warm: a warm pool in use
        keeps its spares."""
        self.registry.touch(sandbox_id, at)

    def take_idle(self, now: float) -> list[str]:
        """Ids idle past keep_warm_seconds at monotonic `now`, each disarmed to expire once."""
        return self.registry.take_idle(now)

    def adopt(self, lv: Live, slot_index: int | None = None) -> None:
        """Registers a sandbox a restarted daemon found running (with its network slot and its
        volume mounts, taken as they are) and watches it for dying."""
        if slot_index is not None:
            self.registry.slots[lv.sandbox_id] = self.net.slot(slot_index)
        self.live[lv.sandbox_id] = lv
        self.registry.mounts.claim(lv.sandbox_id, lv.runtime, lv.volumes, check=False)
        self.watch(lv)

    def network_slots(self) -> dict[str, Slot]:
        """Sandbox id -> network slot, of every networked live sandbox (a copy)."""
        return dict(self.registry.slots)

    def note_cgroup_leftover(self, cid: str) -> None:
        """Queues container `cid`'s cgroup for the watchdog's removal retries."""
        self.cgroup_leftovers.add(cid)

    # ---- starts --------------------------------------------------------------------------

    async def create(self, *, image_id: str, cpu: float = 1.0, memory_mib: int = 1024,
                     env: dict[str, str] | None = None, keep_warm_seconds: float | None = 600,
                     volumes: list[dict[str, Any]] | None = None, tags: dict[str, str] | None = None,
                     ports: list[int] | None = None, block_network: bool = True,
                     allow_list: list[str] | None = None, entrypoint: bool | None = None,
                     gpu: str | None = None, gpu_count: int = 1, docker_enabled: bool = False,
                     disk_mib: int | None = None, runtime: str = "gvisor", pids: int = DEFAULT_PIDS,
                     platform: str | None = None) -> SandboxInfo:
        """A fresh sandbox of `image_id` (see `Creator.create` for the options and errors)."""
        return await self.creator.create(
            image_id=image_id, cpu=cpu, memory_mib=memory_mib, env=env, keep_warm_seconds=keep_warm_seconds,
            volumes=volumes, tags=tags, ports=ports, block_network=block_network, allow_list=allow_list,
            entrypoint=entrypoint, gpu=gpu, gpu_count=gpu_count, docker_enabled=docker_enabled,
            disk_mib=disk_mib, runtime=runtime, pids=pids, platform=platform)

    async def acquire(self, snapshot_id: str, *, keep_warm_seconds: float | None = 600,
                      tags: dict[str, str] | None = None) -> SandboxInfo:
        """A sandbox from the snapshot: a warm spare when there is one, else a fresh restore."""
        return await self.booter.acquire(snapshot_id, keep_warm_seconds=keep_warm_seconds, tags=tags)

    async def restore(self, snapshot_id: str, *, keep_warm_seconds: float | None = 600,
                      fork_index: int | None = None, tags: dict[str, str] | None = None) -> SandboxInfo:
        """A new sandbox restored from the snapshot. Raises SnapshotNotFound for an unknown id."""
        return await self.booter.restore(snapshot_id, keep_warm_seconds=keep_warm_seconds,
                                         fork_index=fork_index, tags=tags)

    # ---- snapshots, fork, pause / resume ---------------------------------------------------

    async def pause(self, sandbox_id: str) -> str:
        """Checkpoints the sandbox and frees its CPU and memory; returns the snapshot id."""
        return await self.checkpoints.pause(sandbox_id)

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        """Brings a paused sandbox back exactly where it was, with the same id."""
        return await self.checkpoints.resume(sandbox_id)

    async def snapshot_memory(self, sandbox_id: str, *, internal: bool = False, kind: str = "memory",
                              leave_running: bool = True, ttl_s: float | None = None, lv: Live | None = None) -> str:
        """Captures memory, processes and files; returns the snapshot id (`Checkpoints`)."""
        return await self.checkpoints.snapshot_memory(sandbox_id, internal=internal, kind=kind,
                                                      leave_running=leave_running, ttl_s=ttl_s, lv=lv)

    def snapshot_in_use(self, snapshot_id: str) -> str | None:
        """Why the snapshot cannot be deleted now, or None."""
        return self.checkpoints.snapshot_in_use(snapshot_id)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot. Raises InvalidState while it is in use, SnapshotNotFound if unknown."""
        await self.checkpoints.delete_snapshot(snapshot_id)

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        """Removes a snapshot's files and row without checking whether it is in use."""
        await self.ctx.delete_snapshot_files(snapshot_id)

    def list_snapshots(self) -> list[dict[str, Any]]:
        return self.checkpoints.list_snapshots()

    async def fork(self, sandbox_id: str, count: int, keep_warm_seconds: float | None = 600) -> list[dict[str, Any]]:
        """`count` live copies from one capture; a failed copy is an error entry in its slot."""
        return await self.checkpoints.fork(sandbox_id, count, keep_warm_seconds)

    # ---- usage ---------------------------------------------------------------------------

    def sample_usage(self) -> None:
        """Copies cgroup counters and last-activity times into the ledger (survives restarts)."""
        self.usage.sample()

    # ---- death and teardown --------------------------------------------------------------

    def watch(self, lv: Live, find_pid: bool = True) -> None:
        """Notices the sandbox dying by itself: its channel closing or its process exiting."""
        self.deathwatch.watch(lv, find_pid)

    def driver_of(self, sandbox_id: str) -> Driver:
        """The driver that owns a sandbox's container (gVisor when nothing says otherwise)."""
        return self.teardown.driver_of(sandbox_id)

    async def terminate(self, sandbox_id: str, reason: str = "terminated") -> SandboxInfo:
        """Stops the sandbox and removes all it made on the host. Idempotent.

        Raises:
            SandboxNotFound: no such sandbox.
        """
        return await self.teardown.terminate(sandbox_id, reason)

    async def teardown_host(self, sandbox_id: str, *, failed_start: bool = False) -> list[str]:
        """Removes everything the sandbox holds on the host; safe to call twice. Returns what
        could not be removed (empty: nothing is left)."""
        return await self.teardown.teardown_host(sandbox_id, failed_start=failed_start)

    def retry_cgroup_leftovers(self) -> None:
        """Removes the cgroups teardown could not (their last processes have exited since)."""
        self.teardown.retry_cgroup_leftovers()

    # ---- exec and files ------------------------------------------------------------------

    async def exec(self, sandbox_id: str, argv: list[str], *, env: dict[str, str] | None = None,
                   cwd: str | None = None, stdin: str | None = None, timeout: float | None = None,
                   max_output: int | None = None, user: str | int | None = None) -> dict[str, Any]:
        """Runs `argv` in the sandbox (as `user`, default the image's); returns the wire form of ExecResult."""
        return await self.execfiles.exec(sandbox_id, argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                                         max_output=max_output, user=user)

    async def write_file(self, sandbox_id: str, path: str, data_b64: str, mode: int = 0o644) -> dict[str, Any]:
        return await self.execfiles.write_file(sandbox_id, path, data_b64, mode)

    async def read_file(self, sandbox_id: str, path: str) -> dict[str, Any]:
        return await self.execfiles.read_file(sandbox_id, path)

    async def read_bytes(self, sandbox_id: str, path: str, wait_s: float = 5.0) -> bytes:
        """A running sandbox's file, for the port proxy: never resumes one, nor ends a slow one."""
        reply = await self.registry.lookup(sandbox_id).channel.request("read_file", wait_s=wait_s, path=path)
        return base64.b64decode(reply["data"])

    async def list_files(self, sandbox_id: str, path: str) -> dict[str, Any]:
        return await self.execfiles.list_files(sandbox_id, path)

    async def remove_file(self, sandbox_id: str, path: str) -> dict[str, Any]:
        return await self.execfiles.remove_file(sandbox_id, path)

    # ---- networking ----------------------------------------------------------------------

    def net_columns(self, sandbox_id: str, net: NetworkSpec | None) -> dict[str, Any]:
        """The row's network columns: the slot (for recovery), the spec and the exposed URLs."""
        return self.networking.net_columns(sandbox_id, net)

    async def expose_port(self, sandbox_id: str, port: int) -> str:
        """The host URL that reaches `port` in the sandbox; the same URL for the same port."""
        return await self.networking.expose_port(sandbox_id, port)

    def list_urls(self, sandbox_id: str) -> dict[int, str]:
        """The exposed URLs of a running sandbox; none while it is paused or after it ended."""
        return self.networking.list_urls(sandbox_id)

    async def update_network_permissions(self, sandbox_id: str, block_network: bool,
                                         allow_list: list[str] | None) -> SandboxInfo:
        """Changes a networked sandbox's outbound policy at once (open connections included)."""
        return await self.networking.update_network_permissions(sandbox_id, block_network, allow_list)

    # ---- images and volumes --------------------------------------------------------------

    def delete_image(self, image_id: str) -> None:
        """Deletes an image; refused (InvalidState) while a sandbox, snapshot or image uses it."""
        self.artifacts.delete_image(image_id)

    def delete_volume(self, name: str) -> None:
        """Deletes a volume; refused (InvalidState) while a sandbox or snapshot mounts it."""
        self.artifacts.delete_volume(name)

    async def build_image(self, base: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
        """Resolves `base` to a stored image and builds `steps` on it."""
        return await self.artifacts.build_image(base, steps)

    async def resolve_base(self, base: dict[str, Any]) -> str:
        return await self.artifacts.resolve_base(base)

    async def create_image_from_filesystem(self, sandbox_id: str) -> str:
        return await self.artifacts.create_image_from_filesystem(sandbox_id)
