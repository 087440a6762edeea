"""The registry of live sandboxes: their in-memory handles, per-sandbox locks, teardowns in
flight, network slots, reference counts of what starts in flight use, and background tasks.

The one place this state lives; every other room of the service reads and changes it here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..network.netns import Slot
from ..network.policy import NetworkSpec
from ..runtime.bundle import HOST_TASKS
from ..runtime.bundle import DEFAULT_PIDS
from ..runtime.channel import AgentChannel
from ..types import SandboxInfo
from ..volumes.writers import MountRegistry
from .lifecycle import NOT_ENDED
from .store import Store


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
    volumes: list[dict[str, Any]] = field(default_factory=list)
    key: bytes = b""
    net: NetworkSpec | None = None
    # From the image's config: the default working directory and user of commands.
    workdir: str | None = None
    user: str | None = None
    disk_mib: int | None = None
    runtime: str = "gvisor"
    platform: str = ""  # gVisor platform it runs on (its checkpoints restore only there)
    # Auto-pause (server/autopause.py): idle seconds before it is paused (None: never), the
    # last CPU reading (monotonic s, CPU s) and when it last computed or ran a command.
    auto_pause_seconds: float | None = None
    cpu_probe: tuple[float, float] | None = None
    last_busy: float = 0.0
    streams: int = 0  # clients following a background process's output right now
    pausing: bool = False  # a pause() is checkpointing it: a request cut off now was not an ending
    pids: int = DEFAULT_PIDS
    tmpfs: dict[str, int] = field(default_factory=dict)  # its bounded memory-backed mounts {path: MiB}
    frozen: bool = False  # a warm spare held in the cgroup freezer until handed out (server/warm.py)


# Resolves a sandbox id to its live handle, resuming it first if it is paused
# (`Checkpoints.running`); the rooms below pause/resume get it as this callable.
Running = Callable[[str], Awaitable[Live]]


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
    if reason == "host_pids_limit":
        limits = "; ".join(f"{a} * pids + {b} on {p}" for p, (a, b) in HOST_TASKS.items())
        return errors.SandboxTerminated(
            f"sandbox {sandbox_id} ended ({reason}): its processes took gVisor to the host's task limit for it "
            f"(its host cgroup's pids.max: {limits}; ptrace keeps a host thread for every process that ever ran "
            "there, so repeated fork bombs add up); the workload ended the sandbox; create a new one (on "
            "systrap, or with a lower pids=)", sandbox_id=sandbox_id)
    if reason in (None, "exited", "lost"):
        return errors.SandboxLost(f"sandbox {sandbox_id} died unexpectedly ({reason or 'unknown'}); retry on a new "
                                  "sandbox", sandbox_id=sandbox_id)
    return errors.SandboxTerminated(f"sandbox {sandbox_id} is no longer running ({reason}); create a new one",
                                    sandbox_id=sandbox_id)


class Registry:
    """Live sandboxes by id and what goes with them. Event-loop only (no thread locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.live: dict[str, Live] = {}
        self.teardowns: dict[str, asyncio.Task[None]] = {}
        # Per-sandbox lock: pause, resume and terminate of one sandbox never interleave.
        self.locks: dict[str, asyncio.Lock] = {}
        # Snapshot id -> restores in flight (a snapshot in use cannot be deleted).
        self.snapshot_users: dict[str, int] = {}
        # Which sandbox mounts which volume how, from boot to teardown (their rows may not
        # exist yet): refuses read-write mounts that could lose data, and volume deletes.
        self.mounts = MountRegistry()
        # Sandbox id -> its network slot (the only record of which slot is whose).
        self.slots: dict[str, Slot] = {}
        # Container ids of ended sandboxes whose cgroup the kernel still called busy at teardown
        # (a process of theirs not yet reaped): the watchdog removes them when it can.
        self.cgroup_leftovers: set[str] = set()
        self.tasks: set[asyncio.Task[Any]] = set()

    def lookup(self, sandbox_id: str) -> Live:
        """The live handle, counted as activity.

        Raises:
            SandboxNotFound: no such sandbox.
            SandboxLost, SandboxTerminated: it ended (`ended_error` picks which).
        """
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
        if lv is not None and lv.exit_reason is None:
            # Its channel closed but how it ended is not classified yet (the process watch
            # comes a moment later): it died without a known cause, which is retryable.
            raise ended_error(sandbox_id, None)
        reason = (lv.exit_reason if lv else None) or (row["exit_reason"] if row else None) or "terminated"
        raise ended_error(sandbox_id, reason)

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self.locks.setdefault(sandbox_id, asyncio.Lock())

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Runs `coro` in the background, holding a reference until it ends."""
        t = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    def info(self, sandbox_id: str) -> SandboxInfo:
        """Raises SandboxNotFound for an unknown id."""
        row = self.store.get_row(sandbox_id)
        if row is None:
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found: list sandboxes with `rollbox ps -a`",
                                         sandbox_id=sandbox_id)
        return self.store.sandbox_info(row)

    def list_sandboxes(self, all_states: bool = False) -> list[SandboxInfo]:
        rows = self.store.list_rows(None if all_states else NOT_ENDED)
        return [self.store.sandbox_info(r) for r in rows]

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

    def touch(self, sandbox_id: str, at: float | None = None) -> None:
        """Counts as activity now (or at monotonic time `at`) for keep_warm; no-op if not live."""
        lv = self.live.get(sandbox_id)
        if lv is not None:
            lv.last_active = time.monotonic() if at is None else at

    def take_idle(self, now: float) -> list[str]:
        """Ids of sandboxes idle (no command running) past their keep_warm_seconds at monotonic
        `now`; each is disarmed so that it expires once."""
        expired = [lv.sandbox_id for lv in self.live.values()
                   if lv.keep_warm_seconds is not None and lv.keep_warm_seconds > 0 and lv.busy == 0
                   and now - lv.last_active > lv.keep_warm_seconds]
        for sid in expired:
            self.live[sid].keep_warm_seconds = None
        return expired
