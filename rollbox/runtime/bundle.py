"""OCI runtime bundles: a pure function from a sandbox's settings to `config.json`.

Spec: https://github.com/opencontainers/runtime-spec/blob/main/config.md (version 1.0).
"""

from __future__ import annotations

import json
from collections.abc import Callable
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_DIR = Path(__file__).parent / "agent"
AGENT_MOUNT = "/.rollbox"
# The native agent (agent/native, built by `make agent`): a static binary, so images need no
# Python. Without it (no Debian cargo on this machine) sandboxes run agent.py under the image's python3.
NATIVE_AGENT = "rollbox-agent"
AGENTS = ("native", "python")


def default_agent(agent_dir: Path = AGENT_DIR) -> str:
    """"native" when the built binary is in `agent_dir`, else "python". `ROLLBOX_AGENT`
    (native|python) in the daemon's environment overrides it, e.g. to compare the two."""
    forced = os.environ.get("ROLLBOX_AGENT", "")
    if forced in AGENTS:
        return forced
    return "native" if os.access(agent_dir / NATIVE_AGENT, os.X_OK) else "python"


def agent_argv(agent: str) -> list[str]:
    """The sandbox's init command for `agent` ("native" or "python").

    Raises:
        ValueError: an unknown agent name.
    """
    if agent == "native":
        return [f"{AGENT_MOUNT}/{NATIVE_AGENT}"]
    if agent == "python":
        return ["/usr/bin/python3", "-u", "-S", f"{AGENT_MOUNT}/agent.py"]
    raise ValueError(f"agent={agent!r} must be one of {AGENTS}")
# Docker's default capability set: root in the sandbox can chown, bind low ports, etc.
DEFAULT_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]
DEFAULT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
CPU_PERIOD_US = 100_000
# The most tasks (processes + threads) in a sandbox by default: RLIMIT_NPROC inside gVisor,
# whose kernel counts every task of the sandbox's uid 0 (the agent's ~7 tasks included; the
# agent itself, holding CAP_SYS_ADMIN, is never refused). At 1024 a bash fork bomb starved
# the agent on one core, at 512 it did not.
DEFAULT_PIDS = 512
# The host cgroup's pids.max for `pids` tasks inside, per gVisor platform: (per task, base).
# A sentry that cannot make a host task dies with its whole sandbox (measured: pids.max 120
# under 100 sleeps ended it), while RLIMIT_NPROC refuses a fork with EAGAIN inside; so the
# host limit sits above what `pids` tasks inside need, a backstop that bounds the host side.
# - systrap: every address space inside has a stub process on the host, pooled and never
#   freed while the sandbox lives; fork bombs peaked at 2.1-2.25 host tasks per task inside
#   plus ~22 of the idle sandbox's own (166 at pids=64, 570 at 256, 1,075 at 512), the same
#   after 6 bombs in a row.
# - ptrace: a host thread per address space and sentry thread that ran it, none freed: each
#   fork bomb at pids=64 added ~300-400 (583 after one, 2,238 after six), so this limit ends a
#   ptrace sandbox that keeps bombing rather than let it grow without bound.
HOST_TASKS = {"systrap": (3, 64), "ptrace": (16, 1024)}


def host_pids_max(pids: int, platform: str = "systrap") -> int:
    """The host cgroup pids.max of a gVisor sandbox allowed `pids` tasks inside (HOST_TASKS)."""
    per_task, base = HOST_TASKS.get(platform, HOST_TASKS["systrap"])
    return per_task * pids + base


# Headroom of the host memory limit over the sandbox's own (`host_memory_limit_mib`), MiB.
# Measured (4 allocations of 3x the limit in a row, each SIGKILLed by the agent's watcher):
# the host cgroup peaked at 534-619 MiB for memory=512 (host limit 768) and 2,065-2,068 MiB
# for memory=2048 (host limit 3,072); gVisor gave the pages back within 1 s each time.
OOM_HEADROOM_MIB = 256


def tmpfs_mounts(memory_mib: int, *, tmp_in_memory: bool) -> tuple[tuple[str, int], ...]:
    """The sandbox's memory-backed mounts and their bounds in MiB: /dev/shm, and /tmp when it
    is not on the writable layer (Docker sandboxes: their vfs storage failed on the gofer).

    Without an explicit mount gVisor makes /dev (and so /dev/shm) and an empty /tmp tmpfs
    sized at half the *host's* memory (runsc boot: tmpfs.SetDefaultSizeLimit(TotalHostMem/2)),
    so filling one ended the whole sandbox as `oom` instead of failing with ENOSPC. Their
    pages count against the sandbox's memory limit: each gets a quarter of it, so both
    together fill at most half.
    """
    quarter = max(1, memory_mib // 4)
    return (("/dev/shm", quarter), *((("/tmp", quarter),) if tmp_in_memory else ()))


# Every capability, for `docker_enabled` sandboxes (a Docker daemon inside gVisor needs them;
# they are the sandbox kernel's capabilities, not the host's).
ALL_CAPS = [*DEFAULT_CAPS, "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_RESOURCE", "CAP_IPC_LOCK",
            "CAP_SYS_NICE", "CAP_SYS_TIME", "CAP_DAC_READ_SEARCH", "CAP_LINUX_IMMUTABLE", "CAP_NET_BROADCAST",
            "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_PACCT", "CAP_SYS_BOOT", "CAP_LEASE",
            "CAP_SYS_TTY_CONFIG", "CAP_AUDIT_CONTROL", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
            "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ"]


@dataclass(frozen=True)
class BundleSpec:
    """What a sandbox's OCI spec depends on.

    cpu: CPU cores (CFS quota = cpu * 100 ms per 100 ms period); memory_mib: the whole sandbox's
    memory limit in MiB, gVisor's own kernel included (PLATFORM.md); pids: the most tasks
    (processes and threads, the agent's included) inside, RLIMIT_NPROC; the host cgroup's
    pids.max is derived from it (`host_pids_max`).
    """

    rootfs: Path
    cgroup_path: str
    cpu: float
    memory_mib: int
    hostname: str = "rollbox"
    env: dict[str, str] = field(default_factory=dict)
    agent_dir: Path = AGENT_DIR
    pids: int = DEFAULT_PIDS
    platform: str = "systrap"  # gVisor's, for the host pids limit (runc's spec sets its own)
    # (host directory, path in the sandbox, read-only): named volumes, bind-mounted.
    binds: tuple[tuple[str, str, bool], ...] = ()
    # (path in the sandbox, MiB): memory-backed tmpfs mounts with a size bound (`tmpfs_mounts`).
    tmpfs: tuple[tuple[str, int], ...] = ()
    # A prepared network namespace (/run/netns/NAME) for gVisor's netstack; None: loopback only.
    netns_path: str | None = None
    # OCI device entries (NVIDIA GPUs for nvproxy); empty: none.
    devices: tuple[dict[str, object], ...] = ()
    # Docker inside the sandbox: every capability for its commands, and cgroupfs mounted.
    privileged: bool = False
    # The init process: "native" (static binary, any image) or "python" (agent.py, needs python3).
    agent: str = field(default_factory=default_agent)
    # It hosts episode containers (server/episodes.py) on runc: its zygote may mount and make
    # namespaces (runtime/runc.py relaxes the spec for it; gVisor needs nothing).
    containers: bool = False


def host_memory_limit_mib(memory_mib: int) -> int:
    """The host cgroup's memory limit for a gVisor sandbox of `memory_mib` MiB: above the
    user's limit by gVisor's own overhead (its kernel's heap, page tables) plus room for the
    agent's OOM watcher to act (it SIGKILLs the biggest exec once the sandbox's processes use
    `memory_mib`; a fast allocator grows on meanwhile). Reaching it ends the whole sandbox:
    the last line of defence (measured: OOM_HEADROOM_MIB)."""
    return memory_mib + max(OOM_HEADROOM_MIB, memory_mib // 2)


def oci_spec(spec: BundleSpec) -> dict[str, object]:
    env = dict(DEFAULT_ENV)
    env.update(spec.env)
    # The agent's OOM watcher kills the biggest exec at this limit (memwatch.rs, agent.py).
    env["ROLLBOX_MEMORY_MIB"] = str(spec.memory_mib)
    if spec.privileged:
        env["ROLLBOX_PRIVILEGED"] = "1"  # the agent then keeps CAP_SYS_ADMIN in the bounding set
    if spec.containers:
        env["ROLLBOX_CONTAINERS"] = "1"  # read (and removed) by the runtime's bundle_spec
    # CAP_SYS_ADMIN for the agent alone: it drops it from the bounding set at start.
    caps = ALL_CAPS if spec.privileged else [*DEFAULT_CAPS, "CAP_SYS_ADMIN"]
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": agent_argv(spec.agent),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            # NPROC bounds a fork bomb inside gVisor (DEFAULT_PIDS). No CAP_SYS_RESOURCE, so a
            # command cannot raise it.
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536},
                        {"type": "RLIMIT_NPROC", "hard": spec.pids, "soft": spec.pids}],
        },
        "root": {"path": str(spec.rootfs), "readonly": False},
        "hostname": spec.hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            *([{"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"}] if spec.privileged else []),
            {"destination": AGENT_MOUNT, "type": "bind", "source": str(spec.agent_dir),
             "options": ["rbind", "ro"]},
            *({"destination": dest, "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777", f"size={mib}m"]} for dest, mib in spec.tmpfs),
            *({"destination": dest, "type": "bind", "source": src,
               "options": ["rbind", "ro" if ro else "rw", "nosuid", "nodev"]} for src, dest, ro in spec.binds),
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
            + [{"type": "network", "path": spec.netns_path} if spec.netns_path else {"type": "network"}],
            "cgroupsPath": spec.cgroup_path,
            "resources": {
                "memory": {"limit": host_memory_limit_mib(spec.memory_mib) * 1024 * 1024},
                "cpu": {"quota": int(spec.cpu * CPU_PERIOD_US), "period": CPU_PERIOD_US},
                "pids": {"limit": host_pids_max(spec.pids, spec.platform)},
            },
            **({"devices": list(spec.devices)} if spec.devices else {}),
        },
    }


def write_bundle(bundle_dir: Path, spec: BundleSpec,
                 finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Path:
    """Writes `bundle_dir/config.json`: `oci_spec(spec)`, passed through `finish` (the
    runtime's own changes: Driver.bundle_spec) first. Compact JSON: `indent` would take the
    json module's pure-Python encoder (a runc sandbox's start wrote and re-read it twice)."""
    doc = oci_spec(spec)
    path = bundle_dir / "config.json"
    path.write_text(json.dumps(finish(doc) if finish is not None else doc))
    return path
