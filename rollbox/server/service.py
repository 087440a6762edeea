"""Sandbox lifecycle: create, restore, fork, exec, files, snapshots, terminate, recover.

Every method runs on the daemon's event loop. Blocking host work (mount, copies) goes to a
thread; runsc runs as asyncio subprocesses. A sandbox's host resources are: a directory
`sandboxes/<id>/` (bundle, overlay upper/work/rootfs mount, FIFOs, runsc log), a runsc
container, its cgroups, its processes and, when networked, a network slot (two namespaces,
veths, firewall rules) and the host listeners of its exposed ports. `teardown_host` removes all
of them and is safe to call twice; `recover` runs it for anything a crashed daemon left behind.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from .. import errors
from ..config import Paths
from ..images.debian import DEBIAN_IMAGE_ID
from ..images.store import ImageStore
from ..network.manager import NetworkManager
from ..network.netns import Slot
from ..network.policy import NetworkPolicy, NetworkSpec, ResolvedPolicy, check_port
from ..runtime import cgroups
from ..runtime import agentdir
from ..runtime.bundle import AGENT_DIR, BundleSpec, default_agent, write_bundle
from ..runtime.gpu import Gpu, oci_devices as gpu_devices, select as select_gpus
from ..runtime.channel import AgentChannel, AgentError, make_fifos, open_for_sandbox
from ..runtime.reaper import Reaper
from ..runtime.rootfs import copy_tree, disk_free_bytes, mount_disk, mount_overlay, remove_tree, unmount
from ..runtime.driver import Driver, check_runtime, no_snapshots, start_failed
from ..runtime.runc import Runc
from ..runtime.runsc import DEFAULT_PLATFORM, PLATFORMS, Runsc
from ..snapshots.store import SnapshotMeta, SnapshotStore, new_snapshot_id
from ..types import SandboxInfo
from ..volumes.store import VolumeStore, check_mount_path, check_name
from .builder import Builder
from .store import LIVE_STATES, Store
from .metrics import Metrics
from .warm import WarmPools

log = logging.getLogger("rollbox.service")

# Output kept per stream of one exec, in bytes; the rest is counted and dropped (`truncated`).
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024
# Seconds a run/restore and the agent's first answer may take; ROLLBOX_BOOT_TIMEOUT_S overrides it.
BOOT_TIMEOUT_S = float(os.environ.get("ROLLBOX_BOOT_TIMEOUT_S") or 60.0)
MIN_FREE_DISK = 256 * 1024 * 1024
# The writable layer's cap (`disk`, MiB): at least room for the agent's files, at most 1 TiB.
MIN_DISK_MIB = 16
MAX_DISK_MIB = 1 << 20
AGENT_ERRORS: dict[str, type[errors.RollboxError]] = {
    "not_found": errors.FileNotFoundInSandbox,
    "is_a_directory": errors.InvalidArgument,
    "not_a_directory": errors.InvalidArgument,
    "permission_denied": errors.InvalidArgument,
    "invalid_argument": errors.InvalidArgument,
}


ARG_MAX = 1024 * 1024  # bytes of argv + env per exec (Linux's default ARG_MAX is 2 MiB)


@contextlib.contextmanager
def in_use(counts: dict[str, int], keys: list[str]) -> Iterator[None]:
    """Counts `keys` as in use for the duration (a reference count that deletes refuse on)."""
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    try:
        yield
    finally:
        for k in keys:
            counts[k] -= 1
            if not counts[k]:
                del counts[k]


def ended_error(sandbox_id: str, reason: str | None) -> errors.RollboxError:
    """The error for using a sandbox that ended for `reason`: retryable (`SandboxLost`) only when
    it died without cause from the workload or a request, final (`SandboxTerminated`) otherwise."""
    if reason == "channel_corrupted":
        return errors.SandboxTerminated(
            f"sandbox {sandbox_id} ended ({reason}): a process inside it wrote into the agent channel (a forged "
            "or corrupt reply); the workload ended the sandbox, create a new one", sandbox_id=sandbox_id)
    if reason == "init_exited":
        return errors.SandboxTerminated(
            f"sandbox {sandbox_id} ended ({reason}): a process inside it killed its init (the rollbox agent); "
            "the workload ended the sandbox, not a platform fault; create a new one", sandbox_id=sandbox_id)
    if reason in (None, "exited", "lost"):
        return errors.SandboxLost(f"sandbox {sandbox_id} died unexpectedly ({reason or 'unknown'}); retry on a new "
                                  "sandbox", sandbox_id=sandbox_id)
    return errors.SandboxTerminated(f"sandbox {sandbox_id} is no longer running ({reason}); create a new one",
                                    sandbox_id=sandbox_id)


def check_limits(cpu: float, memory_mib: int) -> None:
    max_cpu = (os.cpu_count() or 1) * 4
    if not (0.01 <= cpu <= max_cpu):  # also false for NaN
        raise errors.InvalidArgument(f"cpu={cpu} is out of range: give cores as a float in [0.01, {max_cpu}]")
    if memory_mib < 128:
        raise errors.InvalidArgument(f"memory={memory_mib} MiB is too small: gVisor itself needs ~100 MiB; give at least 128")
    host_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    if memory_mib > host_mib:
        raise errors.InvalidArgument(f"memory={memory_mib} MiB is more than this host has ({host_mib} MiB)")


def check_disk(disk_mib: int | None) -> None:
    if disk_mib is None:
        return
    if isinstance(disk_mib, bool) or not isinstance(disk_mib, int) or not (MIN_DISK_MIB <= disk_mib <= MAX_DISK_MIB):
        raise errors.InvalidArgument(f"disk={disk_mib!r} MiB is out of range: give an int in "
                                     f"[{MIN_DISK_MIB}, {MAX_DISK_MIB}], or None for no cap")


def check_env(env: dict[str, str]) -> None:
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise errors.InvalidArgument(f"environment variable name {k!r} is invalid: no '=', no NUL, not empty")


def admission_limit() -> int:
    """Concurrent boots/restores: `ROLLBOX_MAX_STARTS`, else 2 per CPU core (at least 2)."""
    raw = os.environ.get("ROLLBOX_MAX_STARTS", "")
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise errors.InvalidArgument(f"ROLLBOX_MAX_STARTS={raw!r} must be a positive integer")
        return n
    return max(2, 2 * (os.cpu_count() or 1))


def new_sandbox_id() -> str:
    # 24 hex digits, one fixed length: runsc accepts id prefixes, so no id may prefix another.
    return "sb-" + secrets.token_hex(12)


def write_hostname(upper: Path, lowers: list[Path], name: str) -> None:
    """Puts /etc/hostname (`name`) in a fresh sandbox's upper directory, its /etc keeping the
    image's owner and mode (an upper directory's attributes win in the merged view). Skipped
    when the image's /etc is not a directory."""
    etc = next((p / "etc" for p in lowers if os.path.lexists(p / "etc")), None)
    if etc is not None and (etc.is_symlink() or not etc.is_dir()):
        return
    (upper / "etc").mkdir(mode=0o755)
    if etc is not None:
        st = etc.stat()
        os.chown(upper / "etc", st.st_uid, st.st_gid)
        os.chmod(upper / "etc", st.st_mode & 0o7777)
    (upper / "etc" / "hostname").write_text(name + "\n")


def container_id(sandbox_id: str) -> str:
    return sandbox_id.removeprefix("sb-")


@dataclass
class Live:
    """A running sandbox's in-memory handles."""

    sandbox_id: str
    channel: AgentChannel
    image_id: str
    cpu: float
    memory_mib: int
    env: dict[str, str]
    keep_warm_seconds: float | None
    pid: int | None = None
    last_active: float = field(default_factory=time.monotonic)
    exit_reason: str | None = None
    busy: int = 0
    volumes: list[dict[str, str]] = field(default_factory=list)
    key: bytes = b""
    net: NetworkSpec | None = None
    # From the image's config: the default working directory and user of commands.
    workdir: str | None = None
    user: str | None = None
    disk_mib: int | None = None
    runtime: str = "gvisor"
    platform: str = ""  # gVisor platform it runs on (its checkpoints restore only there)


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
        # The runtime drivers by name (driver.RUNTIMES): gVisor is the default.
        self.drivers: dict[str, Driver] = {"gvisor": runsc, "runc": self.runc}
        self.store = store
        self.cg = paths.cgroup_parent
        self.images = ImageStore(paths.images)
        self.snapshots = SnapshotStore(paths.snapshots)
        self.reaper = Reaper()
        self.live: dict[str, Live] = {}
        self._teardowns: dict[str, asyncio.Task[None]] = {}
        # Per-sandbox lock: pause, resume and terminate of one sandbox never interleave.
        self._locks: dict[str, asyncio.Lock] = {}
        # Snapshot id -> restores in flight (a snapshot in use cannot be deleted).
        self._snapshot_users: dict[str, int] = {}
        # Volume name -> boots in flight that mount it (their rows do not exist yet).
        self._volume_users: dict[str, int] = {}
        self.volumes = VolumeStore(paths.volumes)
        self.net = NetworkManager(paths.home, read_file=self.read_bytes)
        # Sandbox id -> its network slot (the only record of which slot is whose).
        self._slots: dict[str, Slot] = {}
        # Container ids of ended sandboxes whose cgroup the kernel still called busy at teardown
        # (a process of theirs not yet reaped): the watchdog removes them when it can.
        self.cgroup_leftovers: set[str] = set()
        self.warm = WarmPools(self)
        self.builder = Builder(self)
        # Admission control. Restores and boots are CPU-bound: a bounded number at once keeps
        # each one fast and a fork(1024) or a map at 64 from starting them all together (they
        # queue here instead, and time out nowhere).
        self.max_starts = max_starts or admission_limit()
        self._boots = asyncio.Semaphore(self.max_starts)
        self.metrics = Metrics(self)
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- helpers -------------------------------------------------------------------------

    def upper_dir(self, sandbox_id: str) -> Path:
        """The sandbox's writable layer: everything it wrote (on a capped tmpfs with `disk`)."""
        return self.sandbox_dir(sandbox_id) / "disk" / "upper"

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.paths.sandboxes / sandbox_id

    def _live(self, sandbox_id: str) -> Live:
        lv = self.live.get(sandbox_id)
        if lv is not None and lv.channel.closed_reason is None:
            lv.last_active = time.monotonic()
            return lv
        row = self.store.get_row(sandbox_id)
        if row is None and lv is None:
            if not sandbox_id.startswith("sb-"):
                raise errors.SandboxNotFound(f"{sandbox_id!r} is not a sandbox id (expected 'sb-' + 24 hex digits)")
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found: list sandboxes with `rollbox ps`",
                                         sandbox_id=sandbox_id)
        reason = (lv.exit_reason if lv else None) or (row["exit_reason"] if row else None) or "terminated"
        raise ended_error(sandbox_id, reason)

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    async def _running(self, sandbox_id: str) -> Live:
        """The live sandbox, resuming it first if it is paused (it wakes on demand)."""
        lv = self.live.get(sandbox_id)
        if lv is None:
            lock = self._locks.get(sandbox_id)
            if lock is not None and lock.locked():
                async with lock:  # a pause/resume/terminate in progress: wait for its outcome
                    pass
            row = self.store.get_row(sandbox_id)
            if row is not None and row["state"] == "paused":
                await self.resume(sandbox_id)
        return self._live(sandbox_id)

    def spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def info(self, sandbox_id: str) -> SandboxInfo:
        row = self.store.get_row(sandbox_id)
        if row is None:
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found: list sandboxes with `rollbox ps -a`",
                                         sandbox_id=sandbox_id)
        return self.store.sandbox_info(row)

    def list_sandboxes(self, all_states: bool = False) -> list[SandboxInfo]:
        rows = self.store.list_rows(None if all_states else (*LIVE_STATES, "paused"))
        return [self.store.sandbox_info(r) for r in rows]

    # ---- boot ----------------------------------------------------------------------------

    async def _boot(self, *, sandbox_id: str, image_id: str, cpu: float, memory_mib: int,
                    env: dict[str, str], keep_warm_seconds: float | None,
                    snapshot: SnapshotMeta | None = None, fork_index: int | None = None,
                    volumes: list[dict[str, str]] | None = None, tags: dict[str, str] | None = None,
                    resume: bool = False, net: NetworkSpec | None = None,
                    host_ports: dict[int, int] | None = None, gpus: list[Gpu] | None = None,
                    privileged: bool = False, disk_mib: int | None = None, runtime: str = "gvisor") -> SandboxInfo:
        t0 = time.monotonic()
        check_limits(cpu, memory_mib)
        check_env(env)
        check_disk(disk_mib)
        if snapshot is not None:
            disk_mib = snapshot.disk_mib  # the captured files must fit the same cap
            volumes = snapshot.volumes  # a restore must mount exactly what was captured
            # ... and have the network it captured (its netstack expects the interface).
            net = NetworkSpec.from_wire(snapshot.network)
        volumes = list(volumes or [])
        # The sandbox's row exists only once it runs: count its volumes as in use meanwhile.
        with in_use(self._volume_users, [v["name"] for v in volumes]):
            binds = tuple((str(self.volumes.ensure(v["name"])), v["mount_path"]) for v in volumes)
            kind = "create" if snapshot is None else ("resume" if resume else "restore")
            with self.metrics.start(runtime, kind) as timer:
                async with self._boots:
                    timer.admitted()
                    return await self._start(sandbox_id=sandbox_id, image_id=image_id, cpu=cpu,
                                             memory_mib=memory_mib, env=env, keep_warm_seconds=keep_warm_seconds,
                                             snapshot=snapshot, fork_index=fork_index, volumes=volumes, tags=tags,
                                             resume=resume, binds=binds, t0=t0, net=net,
                                             host_ports=host_ports or {}, gpus=gpus or [], privileged=privileged,
                                             disk_mib=disk_mib, runtime=runtime)

    async def _start(self, *, sandbox_id: str, image_id: str, cpu: float, memory_mib: int,
                         env: dict[str, str], keep_warm_seconds: float | None, snapshot: SnapshotMeta | None,
                         fork_index: int | None, volumes: list[dict[str, str]], tags: dict[str, str] | None,
                         resume: bool, binds: tuple[tuple[str, str], ...], t0: float,
                         net: NetworkSpec | None, host_ports: dict[int, int], gpus: list[Gpu],
                         privileged: bool, disk_mib: int | None, runtime: str = "gvisor") -> SandboxInfo:
        if disk_free_bytes(self.paths.home) < MIN_FREE_DISK:
            raise errors.ResourceExhausted(
                f"less than {MIN_FREE_DISK >> 20} MiB free under {self.paths.home}: remove snapshots or images, or free disk")
        lowers = self.images.layers(image_id)  # raises ImageNotFound
        # A resume reuses its container id: the watchdog must not remove the new cgroup as the
        # pause's leftover.
        self.cgroup_leftovers.discard(container_id(sandbox_id))
        platform = "" if runtime != "gvisor" else (
            (snapshot.platform or DEFAULT_PLATFORM) if snapshot is not None else self.runsc.platform)
        agent_src = self._agent_source(snapshot, platform)
        cid = container_id(sandbox_id)
        d = self.sandbox_dir(sandbox_id)
        d.mkdir(parents=True)
        # Which runtime owns the container: teardown (also after a daemon crash) reads it here.
        (d / "runtime").write_text(runtime)
        driver = self.drivers[runtime]
        key = bytes.fromhex(snapshot.agent_key) if snapshot is not None else secrets.token_bytes(32)
        channel = AgentChannel(sandbox_id, d / "in", d / "out", key)
        slot: Slot | None = None
        resolved: ResolvedPolicy | None = None
        try:
            if net is not None:
                slot, resolved = await self.net.acquire(net.policy, strict=snapshot is None, ports=net.ports)
                self._slots[sandbox_id] = slot
            layer = d / "disk"
            if disk_mib is not None:
                await asyncio.to_thread(mount_disk, layer, disk_mib)
            else:
                layer.mkdir()
            upper = self.upper_dir(sandbox_id)
            if snapshot is not None:
                await asyncio.to_thread(copy_tree, self.snapshots.upper_dir(snapshot.snapshot_id), upper)
            else:
                # The agent reads its key from the root and deletes it before any command runs.
                upper.mkdir(mode=0o755)
                kf = upper / ".rollbox-key"
                kf.write_bytes(key)
                kf.chmod(0o600)
                # /etc/hostname names the sandbox, as the kernel's host name does (Docker's
                # convention); a restored copy's agent rewrites it with its own name.
                write_hostname(upper, lowers, sandbox_id)
            (d / "agent.key").write_bytes(key)
            await asyncio.to_thread(mount_overlay, lowers, upper, layer / "work", d / "rootfs")
            agent_dir = agentdir.link_into(agent_src, d / "agent")
            write_bundle(d, BundleSpec(rootfs=d / "rootfs", cgroup_path=cgroups.cgroup_path(cid, self.cg),
                                       agent_dir=agent_dir, agent=default_agent(agent_dir),
                                       cpu=cpu, memory_mib=memory_mib, env=env, binds=binds, hostname=sandbox_id,
                                       netns_path=slot.sandbox_ns_path if slot else None,
                                       devices=tuple(gpu_devices(gpus)) if gpus else (), privileged=privileged))
            fin, fout = make_fifos(d)
            sb_in, sb_out = open_for_sandbox(fin, fout)
            try:
                if snapshot is None:
                    res = await driver.start_detached("run", cid, d, stdin_fd=sb_in, stdout_fd=sb_out,
                                                          log_path=d / "runsc.log", timeout=BOOT_TIMEOUT_S,
                                                          networked=slot is not None, gpu=bool(gpus),
                                                          privileged=privileged)
                else:
                    ck = str(self.snapshots.checkpoint_dir(snapshot.snapshot_id))
                    res = await self.runsc.start_detached("restore", cid, d, stdin_fd=sb_in, stdout_fd=sb_out,
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
                    await self._write_net_files(channel, sandbox_id, resolved)
                await self.net.expose(sandbox_id, slot, net.ports, host_ports)
            ttfc_ms = (time.monotonic() - t0) * 1000
        except BaseException as exc:
            channel.close("the sandbox failed to start")
            await self.teardown_host(sandbox_id, failed_start=True)
            if isinstance(exc, errors.RollboxError) or not isinstance(exc, Exception):
                raise
            raise start_failed(sandbox_id, exc, BOOT_TIMEOUT_S) from exc
        cfg = self.images.meta(image_id).image_config
        lv = Live(sandbox_id, channel, image_id, cpu, memory_mib, env, keep_warm_seconds, volumes=volumes, key=key,
                  net=net, workdir=cfg.working_dir, user=cfg.user, disk_mib=disk_mib, runtime=runtime,
                  platform=platform)
        self.live[sandbox_id] = lv
        # What a restarted daemon needs to re-adopt this sandbox as it was (watchdog.recover).
        fd = os.open(d / "live.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"env": env, "workdir": lv.workdir, "user": lv.user, "disk_mib": disk_mib,
                       "platform": platform}, f)
        now = time.time()
        net_cols = self._net_columns(sandbox_id, net)
        if resume:
            self.store.update_sandbox(sandbox_id, state="running", paused_snapshot_id=None, **net_cols)
            self.store.open_interval(sandbox_id, now, boot_s=ttfc_ms / 1000)
        else:
            self.store.insert_sandbox(
                sandbox_id=sandbox_id, state="running", image_id=image_id, created_at=now, cpu=cpu,
                memory_mib=memory_mib, keep_warm_seconds=keep_warm_seconds,
                snapshot_id=snapshot.snapshot_id if snapshot else None, fork_index=fork_index, ttfc_ms=ttfc_ms,
                volumes=json.dumps(volumes), tags=json.dumps(tags or {}), runtime=runtime, **net_cols)
        self.watch(lv)
        return self.info(sandbox_id)

    def _net_columns(self, sandbox_id: str, net: NetworkSpec | None) -> dict[str, Any]:
        """The row's network columns: the slot (for recovery), the spec and the exposed URLs."""
        slot = self._slots.get(sandbox_id)
        return {"net_slot": slot.index if slot else None,
                "network": json.dumps(net.to_wire()) if net else None,
                "urls": json.dumps({str(p): u for p, u in self.net.ports.urls(sandbox_id).items()}),
                "host_ports": json.dumps({str(p): hp for p, hp in self.net.ports.host_ports(sandbox_id).items()})}

    async def _write_net_files(self, channel: AgentChannel, sandbox_id: str, resolved: ResolvedPolicy | None) -> None:
        """/etc/hosts (localhost and the allow list's names pinned to the addresses
        the firewall allows) and, with outbound access, /etc/resolv.conf (the host's
        nameservers), as Docker manages both."""
        # The host name resolves locally (servers such as http.server look it up at start).
        lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{sandbox_id}"]
        for name, addrs in (resolved.hosts if resolved else {}).items():
            lines += [f"{a}\t{name}" for a in addrs]
        files = {"/etc/hosts": "\n".join(lines) + "\n"}
        if resolved is not None and not resolved.policy.block_network and self.net.nameservers:
            files["/etc/resolv.conf"] = "".join(f"nameserver {n}\n" for n in self.net.nameservers)
        for path, text in files.items():
            await channel.request("write_file", wait_s=BOOT_TIMEOUT_S, path=path,
                                  data=base64.b64encode(text.encode()).decode(), mode=0o644)

    def _networked(self, sandbox_id: str, lv: Live) -> tuple[Slot, NetworkSpec]:
        slot = self._slots.get(sandbox_id)
        if slot is None or lv.net is None:
            raise errors.InvalidArgument(
                f"sandbox {sandbox_id} was created without networking (loopback only); create it with "
                "ports=[...] or block_network=False to expose ports or change its network", sandbox_id=sandbox_id)
        return slot, lv.net

    async def expose_port(self, sandbox_id: str, port: int) -> str:
        """The host URL that reaches `port` in the sandbox; the same URL for the same port."""
        check_port(port)
        lv = await self._running(sandbox_id)
        slot, net = self._networked(sandbox_id, lv)
        url = (await self.net.expose(sandbox_id, slot, [port]))[port]
        if port not in net.ports:
            lv.net = NetworkSpec(net.policy, (*net.ports, port))
        self.store.update_sandbox(sandbox_id, **self._net_columns(sandbox_id, lv.net))
        return url

    def list_urls(self, sandbox_id: str) -> dict[int, str]:
        """The exposed URLs of a running sandbox; none while it is paused or after it ended."""
        if sandbox_id in self.live:
            return self.net.ports.urls(sandbox_id)
        self.info(sandbox_id)  # SandboxNotFound
        return {}

    async def update_network_permissions(self, sandbox_id: str, block_network: bool,
                                         allow_list: list[str] | None) -> SandboxInfo:
        """Changes a networked sandbox's outbound policy at once (open connections included)."""
        policy = NetworkPolicy.parse(block_network, allow_list)
        lv = await self._running(sandbox_id)
        slot, net = self._networked(sandbox_id, lv)
        resolved = await self.net.update(slot, policy)
        lv.net = NetworkSpec(policy, net.ports)
        await self._write_net_files(lv.channel, sandbox_id, resolved)
        self.store.update_sandbox(sandbox_id, **self._net_columns(sandbox_id, lv.net))
        return self.info(sandbox_id)

    def _agent_source(self, snapshot: SnapshotMeta | None, platform: str) -> Path:
        """Where a sandbox's /.rollbox comes from: the daemon's pinned build for a new sandbox,
        the snapshot's own copy for a restore (its agent process runs that very binary).

        Raises:
            InvalidState: the snapshot names a platform this rollbox cannot run, or its agent
                copy is missing or empty (restoring over another build would hang).
        """
        if snapshot is None:
            return self.agent_src
        sid = snapshot.snapshot_id
        if platform and platform not in PLATFORMS:
            raise errors.InvalidState(f"snapshot {sid} was taken on gVisor platform {platform!r}, which this "
                                      f"rollbox does not run (it runs {', '.join(PLATFORMS)}); delete it with "
                                      f"`rollbox snapshot rm {sid}`")
        pinned = self.snapshots.dir(sid) / "agent"
        if not snapshot.agent_pinned:
            return pinned if pinned.is_dir() else self.agent_src  # made before agents were pinned
        if not any((pinned / n).is_file() for n in agentdir.AGENT_FILES):
            raise errors.InvalidState(f"snapshot {sid} lacks the copy of the agent its processes run "
                                      f"({pinned} is missing or empty), so it cannot be restored; delete it "
                                      f"with `rollbox snapshot rm {sid}` and take it again")
        return pinned

    @staticmethod
    def _kill_container_processes(driver: Driver, cid: str) -> None:
        for pid, _role in driver.processes(cid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass

    def driver_of(self, sandbox_id: str) -> Driver:
        """The driver that owns a sandbox's container: from its directory's marker, its live
        handle or row, or runc's state root; gVisor otherwise."""
        try:
            name = (self.sandbox_dir(sandbox_id) / "runtime").read_text().strip()
        except OSError:
            lv = self.live.get(sandbox_id)
            row = None if lv is not None else self.store.get_row(sandbox_id)
            if lv is not None:
                name = lv.runtime
            elif row is not None and "runtime" in row.keys():
                name = row["runtime"]
            else:
                name = "runc" if (self.runc.root / container_id(sandbox_id) / "state.json").exists() else "gvisor"
        return self.drivers.get(name, self.runsc)

    async def create(self, *, image_id: str, cpu: float = 1.0, memory_mib: int = 1024,
                     env: dict[str, str] | None = None, keep_warm_seconds: float | None = 600,
                     volumes: list[dict[str, str]] | None = None, tags: dict[str, str] | None = None,
                     ports: list[int] | None = None, block_network: bool = True,
                     allow_list: list[str] | None = None, entrypoint: bool | None = None,
                     gpu: str | None = None, gpu_count: int = 1, docker_enabled: bool = False,
                     disk_mib: int | None = None, runtime: str = "gvisor") -> SandboxInfo:
        """A fresh sandbox of `image_id`. The image's config applies: its Env under `env`, its
        WorkingDir and User for commands, and its Entrypoint + Cmd started as the main process
        when `entrypoint` is True, or None and the image declares one."""
        net = NetworkSpec.parse(ports, block_network, allow_list)  # validated before anything exists
        check_runtime(runtime)
        if runtime == "runc" and (gpu is not None or docker_enabled):
            raise errors.InvalidArgument("runtime='runc' supports neither gpu= nor docker_enabled=True (both need "
                                         "gVisor's nvproxy or its own kernel); use runtime='gvisor'")
        self.drivers[runtime].check()  # RuntimeMissing with the install hint
        cfg = self.images.meta(image_id).image_config  # raises ImageNotFound
        main = [*(cfg.entrypoint or []), *(cfg.cmd or [])] if (entrypoint or (entrypoint is None and cfg.entrypoint)) else []
        if entrypoint and not main:
            raise errors.InvalidArgument(f"image {image_id} declares no Entrypoint or Cmd to start")
        env = {**cfg.env_dict(), **(env or {})}
        if gpu is not None and (not isinstance(gpu, str) or not gpu.strip()):
            raise errors.InvalidArgument(f"gpu={gpu!r} must be 'any' or a GPU model such as 'H100', or None")
        gpus = select_gpus(gpu, gpu_count) if gpu else []  # ResourceUnavailable without one
        if gpus:
            env.setdefault("NVIDIA_VISIBLE_DEVICES", ",".join(str(g.index) for g in gpus))
        vols = []
        seen: set[str] = set()
        for v in volumes or []:
            mp = check_mount_path(v.get("mount_path", ""))
            if mp in seen:
                raise errors.InvalidArgument(f"two volumes are mounted at {mp}; give each its own mount_path")
            seen.add(mp)
            vols.append({"name": check_name(v.get("name", "")), "mount_path": mp})
        info = await self._boot(sandbox_id=new_sandbox_id(), image_id=image_id, cpu=cpu, memory_mib=memory_mib,
                                env=env, keep_warm_seconds=keep_warm_seconds, volumes=vols, tags=tags, net=net,
                                gpus=gpus, privileged=docker_enabled, disk_mib=disk_mib, runtime=runtime)
        if docker_enabled:
            # gVisor's documented Docker-in-gVisor set-up: no bridge or iptables (containers use
            # the sandbox's network), the vfs storage driver (no overlayfs inside).
            # The data root on the sandbox's /tmp (a tmpfs): on the gofer-backed root, `docker
            # run` failed with "bad file descriptor" creating the container's layer.
            try:
                await self._agent(info.sandbox_id, "spawn", argv=["dockerd", "--iptables=false", "--ip6tables=false",
                                                                  "--bridge=none", "--storage-driver=vfs",
                                                                  "--data-root=/tmp/docker"],
                                  env={}, log="/var/log/rollbox-dockerd.log")
            except errors.InvalidArgument as e:
                await self.terminate(info.sandbox_id, reason="docker did not start")
                raise errors.InvalidArgument(f"docker_enabled: {e}; the image needs Docker, e.g. "
                                             "Image.debian().apt_install('docker.io')", sandbox_id=info.sandbox_id) from None
            await self._wait_docker(info.sandbox_id)
        if main:
            try:
                await self._agent(info.sandbox_id, "spawn", argv=main, env={}, cwd=cfg.working_dir, user=cfg.user,
                                  log="/tmp/.rollbox-entrypoint.log")
            except errors.RollboxError:
                await self.terminate(info.sandbox_id, reason="entrypoint failed")
                raise
        return info

    async def acquire(self, snapshot_id: str, *, keep_warm_seconds: float | None = 600,
                      tags: dict[str, str] | None = None) -> SandboxInfo:
        """A sandbox from the snapshot: a warm spare when the snapshot has a warm pool, else a
        fresh restore. Either way nobody else has had it."""
        t0 = time.monotonic()
        sid = self.warm.take(snapshot_id)
        self.metrics.warm_acquires.labels(result="miss" if sid is None else "hit").inc()
        if sid is not None:
            lv = self.live[sid]
            lv.keep_warm_seconds = keep_warm_seconds
            lv.last_active = time.monotonic()
            merged = {**(tags or {}), "rollbox.warm": snapshot_id}
            self.store.update_sandbox(sid, keep_warm_seconds=keep_warm_seconds, tags=json.dumps(merged),
                                      ttfc_ms=(time.monotonic() - t0) * 1000)
            return self.info(sid)
        return await self.restore(snapshot_id, keep_warm_seconds=keep_warm_seconds, tags=tags)

    async def restore(self, snapshot_id: str, *, keep_warm_seconds: float | None = 600,
                      fork_index: int | None = None, tags: dict[str, str] | None = None) -> SandboxInfo:
        meta = self.snapshots.meta(snapshot_id)
        with in_use(self._snapshot_users, [snapshot_id]):
            return await self._boot(sandbox_id=new_sandbox_id(), image_id=meta.image_id, cpu=meta.cpu,
                                    memory_mib=meta.memory_mib, env=meta.env, keep_warm_seconds=keep_warm_seconds,
                                    snapshot=meta, fork_index=fork_index, tags=tags)

    # ---- pause / resume ------------------------------------------------------------------

    async def pause(self, sandbox_id: str) -> str:
        """Checkpoints memory, processes and files to the store and frees the sandbox's CPU and
        memory; returns the paused state's snapshot id (restorable into copies: branching)."""
        async with self._lock(sandbox_id):
            lv = self._live(sandbox_id)
            if not self.drivers[lv.runtime].supports_snapshots:
                raise no_snapshots(sandbox_id, "pause")
            if lv.busy:
                raise errors.InvalidState(f"sandbox {sandbox_id} has {lv.busy} command(s) running; pause it when "
                                          "they return (background processes are fine)", sandbox_id=sandbox_id)
            # Detach the death watch first: the sandbox stops by design after the checkpoint.
            self.live.pop(sandbox_id, None)
            lv.channel.on_lost = None
            if lv.pid is not None:
                self.reaper.unwatch(lv.pid)
            try:
                sid = await self.snapshot_memory(sandbox_id, kind="pause", leave_running=False, lv=lv)
            except BaseException:
                self.live[sandbox_id] = lv
                self.watch(lv, find_pid=False)
                raise
            lv.channel.close("the sandbox was paused")
            self._record_usage(sandbox_id)
            self.store.update_sandbox(sandbox_id, state="paused", paused_snapshot_id=sid)
            self.store.close_interval(sandbox_id, time.time())
            await self.teardown_host(sandbox_id)
            return sid

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        """Brings a paused sandbox back exactly where it was, with the same id."""
        async with self._lock(sandbox_id):
            row = self.store.get_row(sandbox_id)
            if row is None:
                raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
            if row["state"] == "running" and sandbox_id in self.live:
                return self.info(sandbox_id)
            if row["state"] != "paused":
                raise errors.InvalidState(f"sandbox {sandbox_id} is {row['state']}, not paused; only a paused "
                                          "sandbox can be resumed", sandbox_id=sandbox_id)
            snap_id = row["paused_snapshot_id"]
            meta = self.snapshots.meta(snap_id)
            # Listeners are taken again on the ports the sandbox had, when they are still free.
            host_ports = {int(p): hp for p, hp in json.loads(row["host_ports"] or "{}").items()}
            info = await self._boot(sandbox_id=sandbox_id, image_id=meta.image_id, cpu=meta.cpu,
                                    memory_mib=meta.memory_mib, env=meta.env,
                                    keep_warm_seconds=row["keep_warm_seconds"], snapshot=meta,
                                    fork_index=row["fork_index"], resume=True, host_ports=host_ports)
            await self.delete_snapshot_files(snap_id)
            return info

    def update_ttl(self, sandbox_id: str, keep_warm_seconds: float | None) -> SandboxInfo:
        """Sets keep_warm_seconds (None or <= 0: never expire) and counts as activity."""
        lv = self.live.get(sandbox_id)
        if lv is not None:
            lv.keep_warm_seconds = keep_warm_seconds
            lv.last_active = time.monotonic()
        elif self.store.get_row(sandbox_id) is None:
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
        self.store.update_sandbox(sandbox_id, keep_warm_seconds=keep_warm_seconds)
        return self.info(sandbox_id)

    def _record_usage(self, sandbox_id: str) -> None:
        cid = container_id(sandbox_id)
        self.store.record_resources(sandbox_id, cgroups.cpu_seconds(cid, self.cg),
                                    cgroups.peak_memory_bytes(cid, self.cg))

    def sample_usage(self) -> None:
        """Copies cgroup counters and last-activity times into the ledger (survives restarts)."""
        now_mono, now = time.monotonic(), time.time()
        for sid, lv in list(self.live.items()):
            self._record_usage(sid)
            self.store.update_sandbox(sid, last_active_at=now - (now_mono - lv.last_active))

    # ---- death and teardown --------------------------------------------------------------

    def watch(self, lv: Live, find_pid: bool = True) -> None:
        """Notices the sandbox dying by itself: its channel closing or its process exiting."""
        sid = lv.sandbox_id
        lv.channel.on_lost = lambda reason: self._on_lost(sid, None, from_channel=True)
        if find_pid:
            procs = self.drivers.get(lv.runtime, self.runsc).processes(container_id(sid))
            lv.pid = next((pid for pid, role in procs if role == "sandbox"), None)
            # The gofer is our orphan too: a pidfd reaps it when it exits, so the reaper's sweep
            # never has to read /proc for it (that cost grew with every sandbox up).
            for pid, role in procs:
                if role == "gofer":
                    self.reaper.watch(pid, lambda _status: None)
        if lv.pid is not None:
            self.reaper.watch(lv.pid, lambda status: self._on_lost(sid, status))

    def _on_lost(self, sandbox_id: str, status: int | None, from_channel: bool = False) -> None:
        lv = self.live.get(sandbox_id)
        if lv is None or lv.exit_reason is not None:
            return
        if from_channel and lv.channel.corrupted:
            lv.exit_reason = "channel_corrupted"
            log.warning("sandbox %s: %s; terminating it", sandbox_id, lv.channel.closed_reason)
            self.spawn(self.terminate(sandbox_id, reason=lv.exit_reason))
            return
        if from_channel and lv.pid is not None and status is None:
            # The process watch tells how it ended; give it a moment before deciding blind.
            async def fallback() -> None:
                await asyncio.sleep(3.0)
                self._on_lost(sandbox_id, None)
            self.spawn(fallback())
            lv.channel.fail("the sandbox closed its agent channel")
            return
        cid = container_id(sandbox_id)
        if cgroups.oom_killed(cid, self.cg):
            lv.exit_reason = "oom"
        elif status is not None and os.WIFEXITED(status):
            # runsc-sandbox exits with a code when the container's init (our agent) ended:
            # something inside the sandbox killed it. A kill from outside leaves a signal.
            lv.exit_reason = "init_exited"
        else:
            lv.exit_reason = "exited"
        log.info("sandbox %s ended by itself (%s)", sandbox_id, lv.exit_reason)
        lv.channel.fail(f"the sandbox ended ({lv.exit_reason})")
        self.spawn(self.terminate(sandbox_id, reason=lv.exit_reason))

    @staticmethod
    async def _await_ending(lv: Live, wait_s: float = 4.0) -> None:
        """Waits (briefly) for a sandbox that ended by itself to have its ending classified."""
        deadline = time.monotonic() + wait_s
        while lv.exit_reason is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def _request(self, lv: Live, op: str, wait_s: float | None, **fields: Any) -> dict[str, Any]:
        """One agent request. A sandbox that stops answering (alive but wedged, e.g. by a fork
        bomb) is terminated rather than left never answering again; a request cut off by the
        sandbox ending raises the error that ending calls for (`ended_error`)."""
        try:
            return await lv.channel.request(op, wait_s=wait_s, **fields)
        except errors.SandboxLost as lost:
            sid = lv.sandbox_id
            if lv.channel.closed_reason is None:
                log.warning("sandbox %s did not answer %s in %s s; terminating it", sid, op, wait_s)
                self.spawn(self.terminate(sid, reason="unresponsive"))
                raise errors.SandboxLost(f"sandbox {sid} stopped answering `{op}` within {wait_s} s; it is "
                                         "being terminated", sandbox_id=sid) from lost
            await self._await_ending(lv)
            raise ended_error(sid, lv.exit_reason) from None

    async def terminate(self, sandbox_id: str, reason: str = "terminated") -> SandboxInfo:
        """Stops the sandbox and removes all it made on the host. Idempotent."""
        lv = self.live.get(sandbox_id)
        if lv is None and self.store.get_row(sandbox_id) is None:
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
        task = self._teardowns.get(sandbox_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._terminate(sandbox_id, reason))
            self._teardowns[sandbox_id] = task
            task.add_done_callback(lambda _t: self._teardowns.pop(sandbox_id, None))
        await asyncio.shield(task)
        return self.info(sandbox_id)

    async def _terminate(self, sandbox_id: str, reason: str) -> None:
        async with self._lock(sandbox_id):
            await self._terminate_locked(sandbox_id, reason)
        self._locks.pop(sandbox_id, None)

    async def _terminate_locked(self, sandbox_id: str, reason: str) -> None:
        if sandbox_id in self.live:
            self._record_usage(sandbox_id)
        lv = self.live.pop(sandbox_id, None)
        row = self.store.get_row(sandbox_id)
        if row is not None and row["state"] == "paused":
            self.store.update_sandbox(sandbox_id, state="terminated", ended_at=time.time(), exit_reason=reason,
                                      paused_snapshot_id=None)
            if row["paused_snapshot_id"]:
                await self.delete_snapshot_files(row["paused_snapshot_id"])
            return
        if lv is not None:
            reason = lv.exit_reason or reason
            lv.exit_reason = reason
            lv.channel.close(f"the sandbox was terminated ({reason})")
        ending = row is not None and row["state"] in LIVE_STATES
        if ending:
            self.store.update_sandbox(sandbox_id, state="terminating", ended_at=time.time(), exit_reason=reason)
        try:
            await self.teardown_host(sandbox_id)
        finally:
            if ending:
                self.store.update_sandbox(sandbox_id, state="terminated")

    async def teardown_host(self, sandbox_id: str, *, failed_start: bool = False) -> None:
        """Removes everything the sandbox holds on the host. failed_start: its run/restore did
        not finish, so runsc may not know the container while its processes are up."""
        cid = container_id(sandbox_id)
        d = self.sandbox_dir(sandbox_id)
        driver = self.driver_of(sandbox_id)
        # `runsc delete` waits for the sandbox process to be reaped, and we are its reaper:
        # keep reaping while it runs (the pidfd watch reaps the sandbox process itself).
        delete = asyncio.ensure_future(driver.delete(cid))
        while not delete.done():
            self.reaper.sweep()
            await asyncio.wait({delete}, timeout=0.05)
        try:
            res = delete.result()
            unknown = res.returncode != 0 and (b"does not exist" in res.stderr or b"not found" in res.stderr)
            failed = res.returncode != 0 and not unknown
            detail = res.stderr.decode(errors="replace").strip()
        except errors.RollboxError as e:
            unknown, failed, detail = False, True, str(e)
        if failed:
            # Carry on whatever runsc says: kill what is left of the sandbox ourselves and
            # remove the rest, so a stuck runsc never leaks mounts, cgroups or directories.
            log.warning("%s delete %s failed (%s); killing its processes", driver.name, cid, detail)
            self._kill_container_processes(driver, cid)
            driver.forget(cid)
        if not failed and (unknown or failed_start):
            # A run/restore killed at its timeout may not have registered the container (or
            # delete could not reach a hung sandbox), but its sandbox and gofer processes may
            # be up, even spinning: find them by id.
            self._kill_container_processes(driver, cid)
        self.reaper.sweep()
        await self.net.ports.close(sandbox_id)
        slot = self._slots.pop(sandbox_id, None)
        if slot is not None:
            await self.net.release(slot)
        await asyncio.to_thread(unmount, d / "rootfs")
        await asyncio.to_thread(unmount, d / "disk")
        await self._remove_cgroup(cid)
        await asyncio.to_thread(remove_tree, d)

    async def _remove_cgroup(self, cid: str) -> None:
        # rmdir answers EBUSY while a killed process of the sandbox is still exiting or
        # unreaped: retry for a while, then leave it to the watchdog rather than leak it.
        for delay in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8):
            await asyncio.sleep(delay)
            self.reaper.sweep()
            if not cgroups.remove(cid, self.cg):
                self.cgroup_leftovers.discard(cid)
                return
        log.warning("cgroup of container %s still busy after teardown; the watchdog retries", cid)
        self.cgroup_leftovers.add(cid)

    def retry_cgroup_leftovers(self) -> None:
        """Removes the cgroups teardown could not (their last processes have exited since)."""
        live = {container_id(s) for s in self.live}
        for cid in list(self.cgroup_leftovers):
            if cid in live or not cgroups.remove(cid, self.cg):
                self.cgroup_leftovers.discard(cid)

    # ---- exec and files ------------------------------------------------------------------

    async def exec(self, sandbox_id: str, argv: list[str], *, env: dict[str, str] | None = None,
                   cwd: str | None = None, stdin: str | None = None, timeout: float | None = None,
                   max_output: int | None = None) -> dict[str, Any]:
        """Runs `argv` in the sandbox; returns the wire form of ExecResult."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise errors.InvalidArgument("exec needs a non-empty list of string arguments, e.g. exec('python3', '-c', 'print(1)')")
        if any("\0" in a for a in argv):
            raise errors.InvalidArgument("exec arguments cannot contain NUL bytes")
        if not argv[0]:
            raise errors.InvalidArgument("exec's command (its first argument) is empty")
        if sum(len(a) for a in argv) + sum(len(k) + len(v) for k, v in (env or {}).items()) > ARG_MAX:
            raise errors.InvalidArgument(f"exec arguments and environment exceed {ARG_MAX} bytes; pass large "
                                         "data as stdin or a file (sb.fs.write_file)")
        check_env(env or {})
        if stdin is not None:
            try:
                base64.b64decode(stdin, validate=True)
            except ValueError:
                raise errors.InvalidArgument("stdin must be base64-encoded bytes") from None
        if timeout is not None and timeout <= 0:
            raise errors.InvalidArgument(f"timeout={timeout} must be a positive number of seconds, or None for no limit")
        lv = await self._running(sandbox_id)
        started = time.monotonic()
        cid = container_id(sandbox_id)
        # On runc the kernel's counters are per sandbox and cumulative: what this exec did is
        # the difference (gVisor's own kernel reports its limits through the agent instead).
        before = (cgroups.oom_kill_count(cid, self.cg), cgroups.pids_max_count(cid, self.cg)) \
            if lv.runtime == "runc" else (0, 0)
        lv.busy += 1
        try:
            reply = await self._request(
                lv, "exec", None if timeout is None else timeout + 30.0, argv=argv, env=env or {}, cwd=cwd or lv.workdir,
                user=lv.user,
                stdin=stdin, timeout=timeout, max_output=DEFAULT_MAX_OUTPUT if max_output is None else max_output)
        except errors.RollboxError:
            # Running out of memory ends the whole sandbox: report it on the exec that did it.
            if lv.exit_reason == "oom" or cgroups.oom_killed(container_id(sandbox_id), self.cg):
                return {"exit_code": 137, "oom_killed": True, "stdout": "", "stderr": "", "timed_out": False,
                        "truncated": False, "duration_s": time.monotonic() - started}
            raise
        finally:
            lv.busy -= 1
            lv.last_active = time.monotonic()
            self.metrics.exec_seconds.observe(time.monotonic() - started)
        # On runc the kernel OOM-kills the process, not the sandbox (gVisor's limit covers its
        # kernel too): a SIGKILLed command during which the cgroup saw an OOM kill ran out of
        # memory; a command the pids limit refused forks during is a fork bomb's.
        if lv.runtime == "runc":
            reply["oom_killed"] = (reply.get("exit_code") in (-9, 137) or reply.get("signal") == 9) \
                and cgroups.oom_kill_count(cid, self.cg) > before[0]
            reply["pids_limited"] = bool(reply.get("pids_limited")) or cgroups.pids_max_count(cid, self.cg) > before[1]
        else:
            reply["oom_killed"] = False
        return reply

    async def _agent(self, sandbox_id: str, op: str, **fields: Any) -> dict[str, Any]:
        lv = await self._running(sandbox_id)
        try:
            return await self._request(lv, op, 120.0, **fields)
        except AgentError as e:
            cls = AGENT_ERRORS.get(e.kind, errors.RollboxError)
            raise cls(f"{op} in sandbox {sandbox_id}: {e.message}", sandbox_id=sandbox_id) from None

    async def write_file(self, sandbox_id: str, path: str, data_b64: str, mode: int = 0o644) -> dict[str, Any]:
        if not path.startswith("/"):
            raise errors.InvalidArgument(f"path {path!r} must be absolute, e.g. '/work/a.py'")
        return await self._agent(sandbox_id, "write_file", path=path, data=data_b64, mode=mode)

    async def read_file(self, sandbox_id: str, path: str) -> dict[str, Any]:
        return await self._agent(sandbox_id, "read_file", path=path)

    async def read_bytes(self, sandbox_id: str, path: str, wait_s: float = 5.0) -> bytes:
        """A running sandbox's file, for the port proxy: never resumes one, nor ends a slow one."""
        reply = await self._live(sandbox_id).channel.request("read_file", wait_s=wait_s, path=path)
        return base64.b64decode(reply["data"])

    async def list_files(self, sandbox_id: str, path: str) -> dict[str, Any]:
        return await self._agent(sandbox_id, "list_files", path=path)

    async def remove_file(self, sandbox_id: str, path: str) -> dict[str, Any]:
        return await self._agent(sandbox_id, "remove", path=path)

    # ---- snapshots, fork, images -----------------------------------------------------------

    async def snapshot_memory(self, sandbox_id: str, *, internal: bool = False, kind: str = "memory",
                              leave_running: bool = True, ttl_s: float | None = None, lv: Live | None = None) -> str:
        """Captures memory, processes and files; the sandbox keeps running unless
        `leave_running=False` (pause). `ttl_s`: seconds before the store deletes it (None: kept).
        Returns the snapshot id."""
        if ttl_s is not None and ttl_s <= 0:
            raise errors.InvalidArgument(f"ttl={ttl_s} must be a positive number of seconds, or None to keep it")
        if lv is None:
            lv = await self._running(sandbox_id)
        if not self.drivers[lv.runtime].supports_snapshots:
            raise no_snapshots(sandbox_id, "a memory snapshot")
        sid = new_snapshot_id()
        d = self.snapshots.dir(sid)
        d.mkdir(parents=True)
        try:
            ck = self.snapshots.checkpoint_dir(sid)
            ck.mkdir()
            if disk_free_bytes(self.paths.snapshots) < MIN_FREE_DISK:
                raise errors.ResourceExhausted(
                    f"less than {MIN_FREE_DISK >> 20} MiB free under {self.paths.snapshots}: delete snapshots "
                    "(`rollbox snapshot rm`) or free disk", sandbox_id=sandbox_id)
            res = await self.runsc.checkpoint(container_id(sandbox_id), ck, leave_running=leave_running)
            if res.returncode != 0:
                detail = res.stderr.decode(errors="replace").strip()[-800:]
                if "no space left" in detail.lower():
                    raise errors.ResourceExhausted(f"disk full while checkpointing sandbox {sandbox_id}: free space "
                                                   f"under {self.paths.snapshots}", sandbox_id=sandbox_id)
                raise errors.SandboxLost(f"checkpointing sandbox {sandbox_id} failed: {detail}",
                                         sandbox_id=sandbox_id)
            await asyncio.to_thread(copy_tree, self.upper_dir(sandbox_id), self.snapshots.upper_dir(sid))
            own = self.sandbox_dir(sandbox_id) / "agent"  # absent for a sandbox started before pinning
            agentdir.link_into(own if own.is_dir() else AGENT_DIR, d / "agent")
            self.snapshots.write_meta(SnapshotMeta(sid, sandbox_id, lv.image_id, lv.cpu, lv.memory_mib, lv.env,
                                                   time.time(), internal, lv.volumes, kind, lv.key.hex(),
                                                   lv.net.to_wire() if lv.net else None, lv.disk_mib,
                                                   lv.platform, agent_pinned=True))
            self.store.insert_snapshot(sid, sandbox_id, lv.image_id, internal, kind,
                                       None if ttl_s is None else time.time() + ttl_s)
        except BaseException:
            await asyncio.to_thread(self.snapshots.remove, sid)
            raise
        return sid

    def snapshot_in_use(self, snapshot_id: str) -> str | None:
        """Why the snapshot cannot be deleted now, or None."""
        if self._snapshot_users.get(snapshot_id):
            return f"{self._snapshot_users[snapshot_id]} restore(s) of it are in progress"
        if self.warm.in_use(snapshot_id):
            return "it has a warm pool (set its size to 0 first)"
        for row in self.store.list_rows(("paused",)):
            if row["paused_snapshot_id"] == snapshot_id:
                return f"it holds the paused state of sandbox {row['sandbox_id']} (resume or terminate that first)"
        return None

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot. Raises InvalidState while it is in use, SnapshotNotFound if unknown."""
        try:
            self.snapshots.meta(snapshot_id)
        except errors.InvalidState:
            pass  # an unreadable meta.json: deleting the snapshot is the way out
        why = self.snapshot_in_use(snapshot_id)
        if why:
            raise errors.InvalidState(f"snapshot {snapshot_id} is in use: {why}")
        await self.delete_snapshot_files(snapshot_id)

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        await asyncio.to_thread(self.snapshots.remove, snapshot_id)
        self.store.delete_snapshot(snapshot_id)

    def list_snapshots(self) -> list[dict[str, Any]]:
        rows = {r["snapshot_id"]: r for r in self.store.snapshot_rows()}
        out = []
        for meta in self.snapshots.list():
            r = rows.get(meta.snapshot_id)
            d = asdict(meta)
            d["expires_at"] = r["expires_at"] if r is not None else None
            d["in_use"] = self.snapshot_in_use(meta.snapshot_id)
            d["size_bytes"] = self.snapshots.size_bytes(meta.snapshot_id)
            out.append(d)
        return out

    def delete_image(self, image_id: str) -> None:
        """Deletes an image; refused (InvalidState) while a sandbox, snapshot or image uses it."""
        self.images.meta(image_id)
        users = [r["sandbox_id"] for r in self.store.list_rows((*LIVE_STATES, "paused")) if r["image_id"] == image_id]
        users += [m.snapshot_id for m in self.snapshots.list() if m.image_id == image_id]
        users += self.images.children(image_id)
        if users:
            raise errors.InvalidState(f"image {image_id} is used by {', '.join(users[:5])}"
                                      f"{' and more' if len(users) > 5 else ''}; remove those first")
        self.images.delete(image_id)

    def delete_volume(self, name: str) -> None:
        """Deletes a volume; refused while a sandbox (booting, running or paused) mounts it or a
        stored snapshot would mount it on restore."""
        if self._volume_users.get(name):
            raise errors.InvalidState(f"volume {name!r} is being mounted by a sandbox that is starting")
        snaps = [m.snapshot_id for m in self.snapshots.list() if any(v["name"] == name for v in m.volumes)]
        if snaps:
            raise errors.InvalidState(f"volume {name!r} is mounted by snapshot(s) {', '.join(snaps[:5])}; "
                                      "delete those first (`rollbox snapshot rm`)")
        for row in self.store.list_rows((*LIVE_STATES, "paused")):
            if any(v["name"] == name for v in json.loads(row["volumes"] or "[]")):
                raise errors.InvalidState(f"volume {name!r} is mounted by sandbox {row['sandbox_id']}; "
                                          "terminate it first")
        self.volumes.delete(name)

    async def fork(self, sandbox_id: str, count: int, keep_warm_seconds: float | None = 600) -> list[dict[str, Any]]:
        """`count` live copies from one capture; a failed copy is an error entry in its slot."""
        if count < 1 or count > 1024:
            raise errors.InvalidArgument(f"fork count={count} must be between 1 and 1024")
        sid = await self.snapshot_memory(sandbox_id, internal=True)
        try:
            results = await asyncio.gather(
                *(self.restore(sid, keep_warm_seconds=keep_warm_seconds, fork_index=i) for i in range(count)),
                return_exceptions=True)
        finally:
            await self.delete_snapshot_files(sid)
        out: list[dict[str, Any]] = []
        for r in results:
            if isinstance(r, errors.RollboxError):
                out.append({"error": r.to_wire()})
            elif isinstance(r, BaseException):
                out.append({"error": errors.ApiError(f"fork failed: {r}").to_wire()})
            else:
                out.append({"sandbox": r})
        return out

    async def _wait_docker(self, sandbox_id: str, wait_s: float = 60.0) -> None:
        """Waits until the sandbox's Docker daemon answers; terminates the sandbox and raises
        InvalidArgument when the image has no Docker or it does not come up."""
        deadline = time.monotonic() + wait_s
        last = ""
        while time.monotonic() < deadline:
            r = await self.exec(sandbox_id, ["docker", "version", "--format", "{{.Server.Version}}"], timeout=20)
            if r.get("exit_code") == 0:
                return
            last = base64.b64decode(r.get("stderr") or "").decode(errors="replace")[-300:]
            if r.get("exit_code") == 127:
                break
            await asyncio.sleep(0.3)
        await self.terminate(sandbox_id, reason="docker did not start")
        raise errors.InvalidArgument(f"docker_enabled: no Docker daemon came up in sandbox {sandbox_id} ({last.strip()}); "
                                     "the image needs Docker, e.g. Image.debian().apt_install('docker.io')",
                                     sandbox_id=sandbox_id)

    async def build_image(self, base: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
        """Resolves `base` to a stored image (the Debian base, an image id, a registry pull, a
        docker-save archive or an OCI layout, each imported once) and builds `steps` on it."""
        image_id = await self.resolve_base(base)
        final, reports = await self.builder.build(image_id, steps)
        return {"image_id": final, "base_image_id": image_id, "steps": [asdict(r) for r in reports]}

    async def resolve_base(self, base: dict[str, Any]) -> str:
        from ..images import archive, registry  # the OCI importers

        if base.get("registry"):
            cred = base.get("credentials")
            meta = await asyncio.to_thread(registry.pull, self.images, str(base["registry"]),
                                           tuple(cred) if cred else None, bool(base.get("insecure")))
            return meta.image_id
        if base.get("docker_archive"):
            meta = await asyncio.to_thread(archive.import_docker_archive, self.images, Path(str(base["docker_archive"])))
            return meta.image_id
        if base.get("oci_layout"):
            meta = await asyncio.to_thread(archive.import_oci_layout, self.images, Path(str(base["oci_layout"])),
                                           base.get("ref"))
            return meta.image_id
        image_id = str(base.get("image_id") or DEBIAN_IMAGE_ID)
        if image_id == DEBIAN_IMAGE_ID:
            await asyncio.to_thread(self.images.ensure_debian)
        self.images.meta(image_id)
        return image_id

    async def create_image_from_filesystem(self, sandbox_id: str) -> str:
        lv = await self._running(sandbox_id)
        meta = await asyncio.to_thread(self.images.create_from_upper, self.upper_dir(sandbox_id), lv.image_id)
        return meta.image_id
