"""The daemon as subreaper of its sandboxes.

`runsc run -detach` exits once the sandbox is up, so the sandbox and gofer processes are
re-parented. Made a child subreaper, the daemon gets them instead of PID 1 (which reaps
slowly here: `runsc delete` then took 1.4-1.8 s instead of ~120 ms; PLATFORM.md).

Only adopted orphans are reaped: a pid the daemon spawned itself is waited for by asyncio's
child watcher or by `subprocess`, and reaping it here would steal its exit status. So we reap
the pids the service registered (sandbox processes, via pidfd) and, on a sweep, adopted
orphans: runsc's re-executed processes (comm `exe`) at once, and any other child once it has
been a zombie for `ORPHAN_GRACE_S` seconds. That second rule catches what a killed runtime CLI
leaves: `runc run` killed at its timeout left `runc:[0:PARENT]`, `runc:[2:INIT]` and the
container's init as zombies of the daemon for good. Whoever waits on a child of its own does
so within milliseconds of its exit (a blocked waitpid reaps at once), so a zombie that old
has no waiter.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from typing import Callable

PR_SET_CHILD_SUBREAPER = 36
# Seconds a zombie child that is not runsc's must stay unreaped before a sweep takes it.
ORPHAN_GRACE_S = 2.0
# The comm of runsc's sandbox and gofer processes (kept while a zombie): runsc re-executes
# itself through /proc/self/exe. The runsc CLI and every tool the daemon spawns has its own.
RUNSC_COMM = "exe"


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except OSError:
        return False


def _children() -> set[int]:
    """This process's children, from the kernel's per-thread children lists: O(children),
    where psutil's Process.children() reads every process on the host (thousands of systrap
    stubs) on each teardown."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return pids


def _comm_state(pid: int) -> tuple[str, str] | None:
    """(comm, state letter: "Z" for a zombie), or None when it is gone: one read of
    /proc/PID/stat ("PID (COMM) STATE ..."; both readable in a zombie too), where psutil read
    it three times (a fifth of the daemon's teardown time at 8 sandboxes ending at once)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            head, _, rest = f.read(512).rpartition(b")")
    except OSError:
        return None
    comm = head.partition(b"(")[2].decode(errors="replace")
    state = rest.split(None, 1)[0].decode() if rest.strip() else ""
    return (comm, "Z" if state == "Z" else "R") if state else None


class Reaper:
    """Watches sandbox pids with pidfds and reaps adopted orphans."""

    def __init__(self) -> None:
        self._watched: dict[int, int] = {}  # pid -> pidfd
        self._zombies: dict[int, float] = {}  # other zombie children -> when first seen
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_sweep = 0.0  # monotonic time of the last sweep

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    def watch(self, pid: int, on_exit: Callable[[int | None], None]) -> bool:
        """Calls `on_exit(wait_status)` (on the loop) once `pid` exits, reaping it if it is our
        child; the status is None when it was not (then it cannot be known)."""
        assert self._loop is not None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        self._watched[pid] = fd

        def fire() -> None:
            assert self._loop is not None
            self._loop.remove_reader(fd)
            os.close(fd)
            self._watched.pop(pid, None)
            status: int | None = None
            try:
                got, st = os.waitpid(pid, os.WNOHANG)
                status = st if got else None
            except ChildProcessError:
                pass
            on_exit(status)

        self._loop.add_reader(fd, fire)
        return True

    def unwatch(self, pid: int) -> None:
        fd = self._watched.pop(pid, None)
        if fd is not None and self._loop is not None:
            self._loop.remove_reader(fd)
            os.close(fd)

    def sweep(self, unless_within_s: float = 0.0) -> int:
        """Reaps exited adopted orphans (see the module's docstring); returns how many.

        unless_within_s: do nothing when a sweep ran less than that many seconds ago (the
        teardowns that poll it while `runsc delete` waits, several at once, share one)."""
        n = 0
        now = time.monotonic()
        if unless_within_s > 0 and now - self._last_sweep < unless_within_s:
            return 0
        self._last_sweep = now
        zombies: dict[int, float] = {}
        for pid in _children():
            if pid in self._watched:
                continue
            got = _comm_state(pid)
            if got is None:
                continue
            comm, state = got
            if comm != RUNSC_COMM:
                if state != "Z":
                    continue
                zombies[pid] = self._zombies.get(pid, now)
                if now - zombies[pid] < ORPHAN_GRACE_S:
                    continue
            try:
                reaped, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            zombies.pop(pid, None)
            n += 1 if reaped else 0
        self._zombies = zombies
        return n
