"""Idle memory and CPU of sandboxes for bench.bench: PSS of their runsc processes and
descendants, the memory cgroup's usage, and CPU over an idle window."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass


from .common import CGROUP_ROOT

IDLE_WAIT_S = 2.0  # seconds idle before measuring
IDLE_CPU_WINDOW_S = 5.0  # seconds over which idle CPU is measured (bench --quick sets 3)

# ---- memory ------------------------------------------------------------------------------------

def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _ppid(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def _pss_kib(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def sandbox_pids(cids: Iterable[str]) -> set[str]:
    """runsc-sandbox/-gofer pids whose cmdline names a cid, plus all sandbox descendants."""
    want = [c.encode() for c in cids]
    procs = [p for p in os.listdir("/proc") if p.isdigit()]
    parent = {p: _ppid(p) for p in procs}
    found = set()
    for p in procs:
        cmd = _cmdline(p)
        if cmd.startswith((b"runsc-sandbox", b"runsc-gofer")) and any(c in cmd for c in want):
            found.add(p)
    grew = True
    while grew:
        kids = {p for p, pp in parent.items() if pp in found and p not in found}
        found |= kids
        grew = bool(kids)
    return found


def host_sandbox_count() -> int:
    """runsc sandboxes running on this host (anyone's): a hint of competing load."""
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).startswith(b"runsc-sandbox"))


def cgroup_usage_bytes(parent: str, cid: str) -> int:
    try:
        return int((CGROUP_ROOT / "memory" / parent / cid / "memory.usage_in_bytes").read_text())
    except (OSError, ValueError):
        return 0


def _cpu_ticks(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass(frozen=True)
class Memory:
    pss_mib: float
    cgroup_mib: float
    procs: int
    cpu_pct: float = 0.0  # % of one core per idle sandbox (utime+stime over IDLE_CPU_WINDOW_S)


def idle_memory(cids: list[str], cgroup_parent: str) -> Memory:
    pids = sandbox_pids(cids)
    t0 = sum(_cpu_ticks(p) for p in pids)
    time.sleep(IDLE_CPU_WINDOW_S)
    used_s = (sum(_cpu_ticks(p) for p in pids) - t0) / os.sysconf("SC_CLK_TCK")
    pss = sum(_pss_kib(p) for p in pids) / 1024 / len(cids)
    cg = sum(cgroup_usage_bytes(cgroup_parent, c) for c in cids) / 2**20 / len(cids)
    return Memory(pss, cg, len(pids), 100 * used_s / IDLE_CPU_WINDOW_S / len(cids))
