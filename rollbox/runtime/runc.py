"""The `runc` driver: the lighter isolation tier (namespaces + seccomp + cgroups, no gVisor).

For trusted, lightweight environments (classic simulators) where a ~10-50 ms start and the
host kernel's speed matter more than gVisor's user-space kernel. The sandbox's processes run on
the host kernel: a kernel bug reachable through the allowed syscalls is a host compromise.
The bundle is the same (host overlay rootfs, the agent as init on its stdio); `runc_spec`
hardens it: no CAP_SYS_ADMIN, no new privileges, a Docker-default-style seccomp denylist,
Docker's masked and read-only /proc paths, and the pids cgroup (not RLIMIT_NPROC, which on
the host kernel counts every process of the host's root) at the sandbox's `pids` against fork
bombs.
No memory snapshots: `runc checkpoint` needs CRIU, which fails on this kernel (PLATFORM.md).
A networked sandbox joins its slot's namespace directly (runc needs none of runsc's tricks).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
from pathlib import Path
from typing import Any

from ..errors import RuntimeMissing
from .driver import RunResult, run_command, spawn_detached, wait_exited

# The fields rollbox reads from runc's `<root>/<id>/state.json` (~10 KB, Go's compact JSON,
# the whole OCI config included): found by pattern, a full parse only if one is missing.
_STATE_FIELDS = re.compile(rb'"(init_process_pid|init_process_start)":(\d+)|"pids":"((?:[^"\\]|\\.)*)"')


def read_state(path: Path) -> tuple[int, int, str] | None:
    """(init pid, init start time in clock ticks, pids cgroup directory) from runc's state
    file; None when it is missing or unreadable. Zeros and "" for absent fields."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    found: dict[bytes, bytes] = {}
    for m in _STATE_FIELDS.finditer(raw):
        if m.group(1):
            found.setdefault(m.group(1), m.group(2))
        else:
            found.setdefault(b"pids", m.group(3))
    if len(found) == 3 and b"\\" not in found[b"pids"]:
        return int(found[b"init_process_pid"]), int(found[b"init_process_start"]), found[b"pids"].decode()
    try:
        state = json.loads(raw)
        return (int(state.get("init_process_pid") or 0), int(state.get("init_process_start") or 0),
                str((state.get("cgroup_paths") or {}).get("pids") or ""))
    except (ValueError, TypeError, AttributeError):
        return None


INSTALL_HINT = "install runc (`apt-get install runc`, or run `make setup`)"

# Syscalls Docker's default profile refuses to a container without extra capabilities
# (moby/profiles/seccomp/default.json), denied with EPERM; clone3 gets ENOSYS so that libc
# falls back to clone, filtered below.
DENIED_SYSCALLS = [
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module",
    "finit_module", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "get_mempolicy",
    "init_module", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie",
    "mbind", "mount", "mount_setattr", "move_mount", "move_pages", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev",
    "ptrace", "query_module", "quotactl", "reboot", "request_key", "set_mempolicy", "setns", "settimeofday",
    "stime", "swapoff", "swapon", "sysfs", "_sysctl", "syslog", "umount", "umount2", "unshare", "uselib",
    "userfaultfd", "ustat", "vm86", "vm86old", "io_uring_setup", "io_uring_enter", "io_uring_register",
]
CLONE_NEWUSER = 0x10000000
MASKED_PATHS = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                "/sys/devices/virtual/powercap"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


# What a pooled sandbox's zygote needs to make episode containers (agent/nsutil.py: its own
# mount namespace, overlays, clone into new namespaces, pivot_root); each container's init
# denies them again with the same list before any command runs (agent/seccomp.py).
CONTAINER_SYSCALLS = ("mount", "umount", "umount2", "pivot_root", "unshare", "setns")


def seccomp_profile(containers: bool = False) -> dict[str, Any]:
    """A denylist in the spirit of Docker's default profile (EPERM for the refused syscalls).
    containers: for a sandbox that hosts episode containers: CONTAINER_SYSCALLS allowed."""
    eperm = 1  # errnoRet
    denied = [n for n in DENIED_SYSCALLS if not (containers and n in CONTAINER_SYSCALLS)]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": eperm},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},  # ENOSYS
            # clone with CLONE_NEWUSER (the other namespace flags already need CAP_SYS_ADMIN,
            # which the sandbox lacks): (flags & CLONE_NEWUSER) == CLONE_NEWUSER.
            {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": eperm,
             "args": [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}]},
        ],
    }


def runc_spec(spec: dict[str, Any], copy: bool = True) -> dict[str, Any]:
    """The gVisor bundle's OCI spec, hardened for a sandbox on the host kernel (changed in
    place when not `copy`)."""
    if copy:
        spec = json.loads(json.dumps(spec))  # a deep copy
    proc = spec["process"]
    # A sandbox hosting episode containers keeps CAP_SYS_ADMIN for its agent, which drops it
    # from the bounding set at start (so no exec has it); only the zygote's launcher keeps it.
    containers = "ROLLBOX_CONTAINERS=1" in proc["env"]
    caps = [c for c in proc["capabilities"]["bounding"] if containers or c != "CAP_SYS_ADMIN"]
    proc["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    proc["noNewPrivileges"] = True
    # runc sets rlimits from the host side: no higher than the daemon's own hard limit
    # (raising it needs a capability this host may withhold).
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The sandbox's task limit (`pids`) is the pids cgroup here: each task is one host task.
    pids = next(r["hard"] for r in proc["rlimits"] if r["type"] == "RLIMIT_NPROC")
    proc["rlimits"] = [
        {**r, "hard": min(r["hard"], hard), "soft": min(r["soft"], hard)} if r["type"] == "RLIMIT_NOFILE" else r
        for r in proc["rlimits"] if r["type"] != "RLIMIT_NPROC"]
    # The host kernel OOM-kills a runc sandbox's biggest process itself: its memory limit is
    # the user's, without the headroom gVisor's kernel and the agent's watcher need.
    memory_mib = next((int(e.split("=", 1)[1]) for e in proc["env"] if e.startswith("ROLLBOX_MEMORY_MIB=")), None)
    # ROLLBOX_RUNTIME tells the agent (no cgroup mounts: these would be the host's) and the
    # zygote (mask /proc, install the containers' seccomp filter) they run on the host kernel.
    proc["env"] = [e for e in proc["env"] if not e.startswith(
        ("ROLLBOX_PRIVILEGED=", "ROLLBOX_MEMORY_MIB=", "ROLLBOX_CONTAINERS=", "ROLLBOX_RUNTIME="))] + [
        "ROLLBOX_RUNTIME=runc"]
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/sys/fs/cgroup"] + [
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    ]
    linux = spec["linux"]
    linux["seccomp"] = seccomp_profile(containers)
    if containers:
        # Its own cgroup as the root of what its zygote mounts: a pids cgroup per container
        # (agent/nsutil.py), and nothing of the host's hierarchy in view.
        linux["namespaces"] = [*linux["namespaces"], {"type": "cgroup"}]
    linux["maskedPaths"] = MASKED_PATHS
    linux["readonlyPaths"] = READONLY_PATHS
    linux.pop("devices", None)
    linux["resources"]["pids"] = {"limit": pids}
    if memory_mib is not None:
        linux["resources"]["memory"] = {"limit": memory_mib * 1024 * 1024}
    return spec


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (/proc/PID/stat's state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(512).rpartition(b")")[2].split(None, 1)[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class Runc:
    """Runs runc verbs against one state root (`--root`). Safe to share between tasks."""

    name = "runc"
    supports_snapshots = False

    def __init__(self, root: Path, *, binary: str | None = None) -> None:
        self.root = root
        self.binary = binary or shutil.which("runc") or ""

    def check(self) -> None:
        if not self.binary or not os.access(self.binary, os.X_OK):
            raise RuntimeMissing(f"runc is not installed: {INSTALL_HINT}")

    @staticmethod
    def bundle_spec(spec: dict[str, Any]) -> dict[str, Any]:
        """The bundle's spec hardened for the host kernel (`runc_spec`), in place."""
        return runc_spec(spec, copy=False)

    def argv(self, *verb: str) -> list[str]:
        self.check()
        return [self.binary, "--root", str(self.root), *verb]

    async def run(self, *verb: str, timeout: float = 60.0) -> RunResult:
        return await run_command(self.argv(*verb), what=f"runc {' '.join(verb)}", timeout=timeout)

    async def start_detached(self, verb: str, container_id: str, bundle: Path, *, stdin_fd: int, stdout_fd: int,
                             log_path: Path, extra: tuple[str, ...] = (), networked: bool = False,
                             gpu: bool = False, privileged: bool = False, platform: str | None = None,
                             timeout: float = 60.0) -> RunResult:
        """`runc run -d`: the container's init inherits stdin/stdout (pass-through stdio).

        Only `run`: runc has no restore here. The bundle's spec is `bundle_spec`'s. networked: the spec already names the namespace
        to join. gpu and privileged are refused earlier (the service validates them); platform
        is gVisor's (runc has none: ignored).
        """
        if verb != "run":
            raise ValueError(f"runc driver cannot {verb!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        return await spawn_detached(self.argv("run", "-d", "--bundle", str(bundle), container_id), stdin_fd=stdin_fd,
                                    stdout_fd=stdout_fd, log_path=log_path, what=f"runc run of {container_id}",
                                    timeout=timeout)

    async def delete(self, container_id: str) -> RunResult:
        """Kills the container's init ourselves and waits (up to 2 s) for it to exit, then
        removes runc's state of it. The init is the pid namespace's: its death ends every
        process of the container, so what `runc delete` would still do is remove the state
        directory (`forget`; the cgroups are the teardown's): one fewer Go binary start per
        episode (3.5 ms of CPU for a no-op `runc delete` here, `perf stat`). Given a running container, runc's own force-delete also sends SIGKILL and
        sleeps 100 ms before its first look (libcontainer's killContainer): ~110 ms of every
        teardown's latency here, measured. `runc delete --force` when there is no live init
        (runc knows the container's other states) or it would not die."""
        init = self._init_pid(container_id)
        if init and _running(init):
            try:
                os.kill(init, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if await wait_exited([init], 2.0):
                self.forget(container_id)
                return RunResult(0, b"", b"")
        return await self.run("delete", "--force", container_id, timeout=20)

    def _init_pid(self, container_id: str) -> int:
        """The container's init pid from runc's state file (0: none known, or the pid now
        names another process: its start time is not the one runc recorded)."""
        state = read_state(self.root / container_id / "state.json")
        if state is None:
            return 0
        pid, start, _ = state
        if pid and start:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read(1024).rpartition(b")")[2].split()
                if int(fields[19]) != start:  # field 22 of stat: starttime (clock ticks)
                    return 0
            except (OSError, IndexError, ValueError):
                return 0
        return pid

    def forget(self, container_id: str) -> None:
        shutil.rmtree(self.root / container_id, ignore_errors=True)

    def known(self, container_id: str) -> bool:
        """runc keeps `<id>/state.json` under its root for every container it knows."""
        return (self.root / container_id / "state.json").is_file()

    async def list_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "state.json").is_file())

    def processes(self, container_id: str) -> list[tuple[int, str]]:
        """The container's init ("sandbox", from runc's state file) and every other process in
        its pids cgroup ("process")."""
        out: list[tuple[int, str]] = []
        state = read_state(self.root / container_id / "state.json")
        if state is None:
            return out
        init, _, pids_dir = state
        if init and os.path.exists(f"/proc/{init}"):
            out.append((init, "sandbox"))
        procs = Path(pids_dir) / "cgroup.procs"
        try:
            out += [(int(p), "process") for p in procs.read_text().split() if int(p) != init]
        except (OSError, ValueError):
            pass
        return out
