"""The daemon as subreaper of its sandboxes.

`runsc run -detach` exits once the sandbox is up, so the sandbox and gofer processes are
re-parented. Made a child subreaper, the daemon gets them instead of PID 1 (which reaps
slowly here: `runsc delete` then took 1.4-1.8 s instead of ~120 ms; PLATFORM.md).

Only adopted orphans are reaped: a pid the daemon spawned itself is waited for by asyncio's
child watcher, and reaping it here would steal its exit status. So we reap the pids the
service registered (sandbox processes, via pidfd) and, on a sweep, any child that is not a
process asyncio is waiting on.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from typing import Callable

import psutil

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
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


def _runsc_orphan(pid: int) -> bool:
    """True for runsc's sandbox/gofer processes (re-parented to us), never our own spawns.

    runsc re-executes itself through /proc/self/exe, so those processes' comm is `exe` (kept
    while a zombie); the runsc CLI and every other tool the daemon spawns has its own name.
    """
    try:
        return psutil.Process(pid).name() == "exe"  # the comm, readable in a zombie too
    except psutil.Error:
        return False


class Reaper:
    """Watches sandbox pids with pidfds and reaps adopted orphans."""

    def __init__(self) -> None:
        self._watched: dict[int, int] = {}  # pid -> pidfd
        self._loop: asyncio.AbstractEventLoop | None = None

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

    def sweep(self) -> int:
        """Reaps exited runsc orphans; returns how many."""
        n = 0
        for pid in _children():
            if pid in self._watched or not _runsc_orphan(pid):
                continue
            try:
                got, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            n += 1 if got else 0
        return n
