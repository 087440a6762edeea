"""Auto-pause: idle sandboxes stop costing CPU (gh-19, "idle sandboxes cost ~nothing").

With runsc 20240729 every idle systrap sandbox spins at ~5% of a core (google/gvisor#10793):
~40 idle sandboxes fill 2 cores. A sandbox created with `auto_pause_seconds=N` (or under a
daemon whose ROLLBOX_AUTO_PAUSE_SECONDS sets a default) is paused to disk (the same
checkpoint as `pause()`) once it has been idle for N seconds: no API call and no command in
flight, and below CPU_BUSY of a core over the last watchdog pass (a background job that
computes is not idle, however quiet the API is). The next call on it resumes it
transparently (Checkpoints.running), with the same id, files, memory and processes.

Not auto-paused: runc sandboxes (no checkpoints), sandboxes with exposed ports (traffic to a
port does not go through the API and would find nothing listening), GPU and Docker sandboxes,
and pooled/leased sandboxes (their clients keep them busy or end them). keep_warm_seconds
stays the backstop: an auto-paused sandbox still ends after that long without a call.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import TYPE_CHECKING

from .. import errors
from ..runtime import cgroups
from .lifecycle import SandboxState
from .registry import Live
from .validation import container_id

if TYPE_CHECKING:
    from .service import SandboxService

log = logging.getLogger("rollbox.autopause")

ENV_DEFAULT = "ROLLBOX_AUTO_PAUSE_SECONDS"
CPU_BUSY = 0.15  # cores: an idle systrap sandbox spins at ~0.05; a working process uses more
MAX_PAUSING = 2  # checkpoints in flight at once (each costs CPU; the watchdog pass must stay cheap)
# Seconds between looks at the paused sandboxes' keep_warm_seconds: a query over every paused
# row, which need not run on every 1 s watchdog pass when hundreds are paused.
EXPIRY_SCAN_S = 5.0


def resolve(seconds: float | None) -> float | None:
    """The auto-pause delay a new sandbox gets: `seconds` when given (0 turns it off), else the
    daemon's ROLLBOX_AUTO_PAUSE_SECONDS (unset: off).

    Raises:
        InvalidArgument: a negative, non-finite or sub-second value (from either source).
    """
    source = "auto_pause_seconds"
    if seconds is None:
        raw = os.environ.get(ENV_DEFAULT, "").strip()
        if not raw:
            return None
        source = ENV_DEFAULT
        try:
            seconds = float(raw)
        except ValueError:
            raise errors.InvalidArgument(f"{ENV_DEFAULT}={raw!r} must be a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0 or 0 < seconds < 1:
        raise errors.InvalidArgument(f"{source}={seconds} must be 0 (off) or at least 1 second")
    return seconds or None


def eligible(lv: Live, tags: dict[str, str]) -> bool:
    """Whether a sandbox may be auto-paused at all (module docstring: what is left out)."""
    return (lv.auto_pause_seconds is not None and lv.runtime == "gvisor"
            and not (lv.net is not None and lv.net.ports) and "NVIDIA_VISIBLE_DEVICES" not in lv.env
            and "rollbox.pool" not in tags)


class AutoPause:
    """The watchdog's auto-pause duty over one service."""

    def __init__(self, svc: "SandboxService") -> None:
        self.svc = svc
        self.pausing: set[str] = set()
        self.ending: set[str] = set()  # auto-paused sandboxes being ended by keep_warm_seconds
        self._next_expiry_scan = 0.0

    def arm(self, sandbox_id: str, seconds: float | None) -> None:
        """Sets a live sandbox's auto-pause delay (None: off) and records it in its row, so a
        resume and a daemon restart keep it."""
        lv = self.svc.live.get(sandbox_id)
        if lv is not None:
            lv.auto_pause_seconds = seconds
        self.svc.store.update_sandbox(sandbox_id, auto_pause_seconds=seconds)

    def rearm(self, sandbox_id: str) -> None:
        """After a resume or a daemon restart: the delay from the sandbox's row."""
        row = self.svc.store.get_row(sandbox_id)
        lv = self.svc.live.get(sandbox_id)
        if row is not None and lv is not None:
            lv.auto_pause_seconds = row["auto_pause_seconds"]

    def _cpu_busy(self, lv: Live, now: float) -> bool:
        used = cgroups.cpu_seconds(container_id(lv.sandbox_id), self.svc.cg)
        prev, lv.cpu_probe = lv.cpu_probe, (now, used) if used is not None else None
        if used is None or prev is None or now <= prev[0]:
            return True  # no reading yet: not known to be idle
        return (used - prev[1]) / (now - prev[0]) > CPU_BUSY

    def due(self, now: float) -> list[str]:
        """Ids of sandboxes idle past their auto-pause delay at monotonic `now`."""
        out = []
        for sid, lv in list(self.svc.live.items()):
            if lv.auto_pause_seconds is None or sid in self.pausing:
                continue
            busy_cpu = self._cpu_busy(lv, now)
            if lv.busy or lv.streams or busy_cpu:
                lv.last_busy = now
                continue
            idle_since = max(lv.last_active, lv.last_busy)
            if now - idle_since > lv.auto_pause_seconds:
                row = self.svc.store.get_row(sid)
                if row is not None and eligible(lv, _tags(row)):
                    out.append(sid)
        return out

    async def pause(self, sandbox_id: str) -> None:
        """Pauses one idle sandbox, its checkpoint at the lowest CPU weight: the sentry does
        the checkpoint's work inside the sandbox's cgroup, and at full weight the pauses of
        hundreds of idle sandboxes took the CPU that restores and commands were waiting for
        (bench idle density: restore p50 310 -> 622 ms at 225 kept). Idle CPU is still theirs."""
        self.pausing.add(sandbox_id)
        cid, weights = container_id(sandbox_id), None
        try:
            lv = self.svc.live.get(sandbox_id)
            async with self.svc.registry.lock(sandbox_id):
                # A call may have arrived since `due` looked: it counts as activity.
                if lv is None or lv.busy or lv.streams or \
                        time.monotonic() - lv.last_active <= (lv.auto_pause_seconds or 0):
                    return
                weights = cgroups.lower_cpu_weight(cid, self.svc.cg)
            await self.svc.pause(sandbox_id)
            weights = None  # its cgroup is gone with its runsc
            log.info("sandbox %s idle for %.0f s: auto-paused (the next call resumes it)", sandbox_id,
                     lv.auto_pause_seconds or 0)
        except errors.RollboxError as e:
            # Ended, busy again or a failed checkpoint: it stays as it is; try again later.
            log.info("auto-pause of %s skipped: %s", sandbox_id, e)
            lv = self.svc.live.get(sandbox_id)
            if lv is not None:
                lv.last_busy = time.monotonic()
        finally:
            if weights is not None and sandbox_id in self.svc.live:
                cgroups.restore_cpu_weight(cid, weights, self.svc.cg)  # still running: full weight again
            self.pausing.discard(sandbox_id)

    async def run_once(self) -> list[str]:
        """One watchdog pass: starts pauses that are due (at most MAX_PAUSING in flight) and,
        every EXPIRY_SCAN_S, ends auto-paused sandboxes past keep_warm_seconds. Returns the ids
        it started pausing."""
        started = []
        for sid in self.due(time.monotonic()):
            if len(self.pausing) >= MAX_PAUSING:
                break
            self.pausing.add(sid)
            self.svc.spawn(self.pause(sid))
            started.append(sid)
        if time.monotonic() < self._next_expiry_scan:
            return started
        self._next_expiry_scan = time.monotonic() + EXPIRY_SCAN_S
        now = time.time()
        for row in self.svc.store.list_rows((SandboxState.PAUSED,)):
            ttl = row["keep_warm_seconds"]
            sid = row["sandbox_id"]
            if row["auto_pause_seconds"] is not None and ttl is not None and ttl > 0 \
                    and now - row["last_active_at"] > ttl and sid not in self.ending:
                log.info("auto-paused sandbox %s idle past keep_warm_seconds; terminating", sid)
                self.ending.add(sid)
                self.svc.spawn(self._end(sid))
        return started

    async def _end(self, sandbox_id: str) -> None:
        try:
            await self.svc.terminate(sandbox_id, reason="keep_warm_expired")
        finally:
            self.ending.discard(sandbox_id)


def _tags(row: object) -> dict[str, str]:
    import json
    try:
        raw = row["tags"]  # type: ignore[index]
        tags = json.loads(raw or "{}")
    except (KeyError, TypeError, ValueError):
        return {}
    return tags if isinstance(tags, dict) else {}
