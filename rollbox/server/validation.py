"""Sandbox ids, the daemon's fixed limits, and the checks a request's arguments pass before
anything is made on the host.

Pure functions: no state, no I/O beyond reading the host's CPU count and memory size.
"""

from __future__ import annotations

import os
import secrets

from .. import errors

# Seconds a run/restore and the agent's first answer may take; ROLLBOX_BOOT_TIMEOUT_S overrides it.
BOOT_TIMEOUT_S = float(os.environ.get("ROLLBOX_BOOT_TIMEOUT_S") or 60.0)
# Bytes that must stay free under the state directory for a start or a snapshot to begin.
MIN_FREE_DISK = 256 * 1024 * 1024
# The writable layer's cap (`disk`, MiB): at least room for the agent's files, at most 1 TiB.
MIN_DISK_MIB = 16
MAX_DISK_MIB = 1 << 20
# The task limit (`pids`): the agent's own ~7 tasks plus room for a command, at the least.
# The host cgroup allows 3x that on systrap (bundle.host_pids_max): at the top, one sandbox
# may hold ~12,000 host tasks, well under a stock kernel's pid_max of 32,768.
MIN_PIDS = 16
MAX_PIDS = 4096


def check_limits(cpu: float, memory_mib: int) -> None:
    """Raises InvalidArgument unless `cpu` (cores) and `memory_mib` (MiB) fit this host."""
    max_cpu = (os.cpu_count() or 1) * 4
    if not (0.01 <= cpu <= max_cpu):  # also false for NaN
        raise errors.InvalidArgument(f"cpu={cpu} is out of range: give cores as a float in [0.01, {max_cpu}]")
    if memory_mib < 128:
        raise errors.InvalidArgument(f"memory={memory_mib} MiB is too small: gVisor itself needs ~100 MiB; give at least 128")
    host_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    if memory_mib > host_mib:
        raise errors.InvalidArgument(f"memory={memory_mib} MiB is more than this host has ({host_mib} MiB)")


def check_disk(disk_mib: int | None) -> None:
    """Raises InvalidArgument unless `disk_mib` is None (no cap) or an int MiB in range."""
    if disk_mib is None:
        return
    if isinstance(disk_mib, bool) or not isinstance(disk_mib, int) or not (MIN_DISK_MIB <= disk_mib <= MAX_DISK_MIB):
        raise errors.InvalidArgument(f"disk={disk_mib!r} MiB is out of range: give an int in "
                                     f"[{MIN_DISK_MIB}, {MAX_DISK_MIB}], or None for no cap")


def check_pids(pids: int) -> None:
    """Raises InvalidArgument unless `pids` (tasks) is an int in [MIN_PIDS, MAX_PIDS]."""
    if isinstance(pids, bool) or not isinstance(pids, int) or not (MIN_PIDS <= pids <= MAX_PIDS):
        raise errors.InvalidArgument(f"pids={pids!r} is out of range: give the most processes and threads the "
                                     f"sandbox may hold at once as an int in [{MIN_PIDS}, {MAX_PIDS}]")


def check_env(env: dict[str, str]) -> None:
    """Raises InvalidArgument for a variable name that is empty or holds '=' or NUL."""
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise errors.InvalidArgument(f"environment variable name {k!r} is invalid: no '=', no NUL, not empty")


def new_sandbox_id() -> str:
    # 24 hex digits, one fixed length: runsc accepts id prefixes, so no id may prefix another.
    return "sb-" + secrets.token_hex(12)


def container_id(sandbox_id: str) -> str:
    return sandbox_id.removeprefix("sb-")
