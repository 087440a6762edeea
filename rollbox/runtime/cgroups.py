"""The sandbox cgroups runsc makes (cgroup v1 controllers beside a v2 mount on this host).

runsc creates them from the OCI spec's `cgroupsPath` but sometimes leaves the directories
behind after `delete -force` (PLATFORM.md), so removing them is ours to do, and the memory
controller's `oom_kill` counter is how we tell an out-of-memory death from any other.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "rollbox"


def cgroup_path(container_id: str, parent: str = PARENT) -> str:
    return f"/{parent}/{container_id}"


def controller_dirs(container_id: str, parent: str = PARENT) -> list[Path]:
    """Every existing directory of this sandbox's cgroup, across v1 controllers and v2, once
    each: `cpu` and `cpuacct` are links to `cpu,cpuacct` (and the like), so they are skipped."""
    out: list[Path] = []
    try:
        entries = sorted(os.scandir(CGROUP_ROOT), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        if e.is_symlink():
            continue
        d = CGROUP_ROOT / e.name / parent / container_id
        if d.is_dir():
            out.append(d)
    return out


def _read_int(path: Path, key: str | None = None) -> int | None:
    """A cgroup file's integer, or with `key` the value on its `key value` line; None if absent."""
    try:
        text = path.read_text()
        if key is None:
            return int(text)
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return None


def _event_count(container_id: str, parent: str, v1: tuple[str, str], v2_file: str, key: str) -> int:
    """A cumulative `key` counter of the sandbox's cgroup: the v1 controller's file, else v2's."""
    for f in (CGROUP_ROOT / v1[0] / parent / container_id / v1[1],
              CGROUP_ROOT / "unified" / parent / container_id / v2_file):
        n = _read_int(f, key)
        if n:
            return n
    return 0


def oom_kill_count(container_id: str, parent: str = PARENT) -> int:
    """How many processes the kernel OOM-killed in the sandbox's memory cgroup so far (v1 or v2)."""
    return _event_count(container_id, parent, ("memory", "memory.oom_control"), "memory.events", "oom_kill")


def oom_killed(container_id: str, parent: str = PARENT) -> bool:
    """True when the kernel OOM-killed anything in the sandbox's memory cgroup (v1 or v2)."""
    return oom_kill_count(container_id, parent) > 0


def pids_max_count(container_id: str, parent: str = PARENT) -> int:
    """How many forks the pids controller refused so far (`pids.events` "max"; v1 or v2)."""
    return _event_count(container_id, parent, ("pids", "pids.events"), "pids.events", "max")


def cpu_seconds(container_id: str, parent: str = PARENT) -> float | None:
    """CPU time the sandbox used so far (cgroup v1 cpuacct.usage, nanoseconds)."""
    ns = _read_int(CGROUP_ROOT / "cpuacct" / parent / container_id / "cpuacct.usage")
    return None if ns is None else ns / 1e9


# The lowest CPU weight each cgroup version takes: under contention such a cgroup gets
# ~1/512 (v1 cpu.shares, default 1024) or ~1/100 (v2 cpu.weight, default 100) of a sibling's
# share, and all it wants when the CPU is otherwise idle.
MIN_CPU_SHARES = 2
MIN_CPU_WEIGHT = 1


def _cpu_weight_files(container_id: str, parent: str) -> tuple[Path, Path]:
    return (CGROUP_ROOT / "cpu" / parent / container_id / "cpu.shares",
            CGROUP_ROOT / "unified" / parent / container_id / "cpu.weight")


def lower_cpu_weight(container_id: str, parent: str = PARENT) -> tuple[int | None, int | None]:
    """Gives the sandbox the lowest CPU weight (v1 cpu.shares, v2 cpu.weight); returns the
    weights it had (None: no such file), for `restore_cpu_weight`."""
    old: list[int | None] = []
    for f, low in zip(_cpu_weight_files(container_id, parent), (MIN_CPU_SHARES, MIN_CPU_WEIGHT)):
        old.append(_read_int(f))
        if old[-1] is not None:
            try:
                f.write_text(str(low))
            except OSError:
                pass  # the cgroup went away (the sandbox ended): nothing to weigh
    return old[0], old[1]


def restore_cpu_weight(container_id: str, weights: tuple[int | None, int | None], parent: str = PARENT) -> None:
    """Puts back the weights `lower_cpu_weight` returned (a pause that did not happen)."""
    for f, w in zip(_cpu_weight_files(container_id, parent), weights):
        if w is not None:
            try:
                f.write_text(str(w))
            except OSError:
                pass


def _freeze_files(container_id: str, parent: str) -> list[tuple[Path, str, str]]:
    """(file, frozen value, thawed value) of the sandbox's freezer: cgroup v1's freezer
    controller, and v2's cgroup.freeze where runsc made a unified directory."""
    return [(CGROUP_ROOT / "freezer" / parent / container_id / "freezer.state", "FROZEN", "THAWED"),
            (CGROUP_ROOT / "unified" / parent / container_id / "cgroup.freeze", "1", "0")]


def freeze(container_id: str, parent: str = PARENT) -> bool:
    """Freezes every process of the sandbox (sentry, gofer, systrap stubs) in the kernel's
    cgroup freezer: an idle systrap sandbox spins ~3-5% of a core (google/gvisor#10793), a
    frozen one uses none, and it goes on from where it was on `thaw`. One write, ~0.4 ms, no
    runsc call (unlike `runsc pause`). A frozen process cannot die, not even of SIGKILL:
    whatever kills the sandbox must `thaw` it first. True when a freezer took it."""
    done = False
    for f, frozen, _thawed in _freeze_files(container_id, parent):
        try:
            f.write_text(frozen)
            done = True
        except OSError:
            pass
    return done


def thaw(container_id: str, parent: str = PARENT) -> None:
    """Undoes `freeze`; a no-op for a sandbox that is not frozen or has no cgroup."""
    for f, _frozen, thawed in _freeze_files(container_id, parent):
        try:
            f.write_text(thawed)
        except OSError:
            pass


def is_frozen(container_id: str, parent: str = PARENT) -> bool:
    """Whether a freezer holds (or is freezing) the sandbox."""
    for f, frozen, _thawed in _freeze_files(container_id, parent):
        try:
            v = f.read_text().strip()
        except OSError:
            continue
        if v in (frozen, "FREEZING"):
            return True
    return False


def peak_memory_bytes(container_id: str, parent: str = PARENT) -> int | None:
    return _read_int(CGROUP_ROOT / "memory" / parent / container_id / "memory.max_usage_in_bytes")


def remove(container_id: str, parent: str = PARENT) -> list[Path]:
    """Removes the sandbox's cgroup directories (children first); returns those still there."""
    left = []
    for d in controller_dirs(container_id, parent):
        try:
            d.rmdir()  # the usual case: no child cgroups
            continue
        except FileNotFoundError:
            continue
        except OSError:
            pass
        # Children first (os.walk bottom-up lists directories by d_type: no stat of the
        # dozens of control files in each, which the rglob this replaces paid for).
        for root, dirs, _files in os.walk(d, topdown=False):
            for name in dirs:
                try:
                    os.rmdir(os.path.join(root, name))
                except OSError:
                    pass
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(d)
    return left


def leftover_ids(parent: str = PARENT) -> set[str]:
    """Container ids that still have a cgroup directory under any controller."""
    ids: set[str] = set()
    if not CGROUP_ROOT.exists():
        return ids
    for ctl in os.listdir(CGROUP_ROOT):
        d = CGROUP_ROOT / ctl / parent
        if d.is_dir():
            ids.update(p.name for p in d.iterdir() if p.is_dir())
    return ids


def remove_parent(parent: str = PARENT) -> list[Path]:
    """Removes a daemon's own parent directories (one per controller) when no sandbox cgroup
    is left in them; returns those still there (a sandbox outlives its daemon's stop)."""
    left: list[Path] = []
    if not CGROUP_ROOT.exists():
        return left
    for ctl in os.listdir(CGROUP_ROOT):
        d = CGROUP_ROOT / ctl / parent
        if d.is_dir():
            try:
                d.rmdir()
            except OSError:
                left.append(d)
    return left
