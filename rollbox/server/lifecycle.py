"""The sandbox lifecycle as a state machine: the states a sandbox row can be in, and the
only changes allowed between them (`TRANSITIONS`, read top to bottom).

Why each edge exists: a sandbox's row is written once it runs (`starting` is only in rows of
older daemons); pause and resume move it between running and paused; terminate goes through
terminating (host teardown in progress) to terminated, except for a paused sandbox, which
holds nothing on the host and ends at once; running -> terminated directly is crash
recovery's verdict on a sandbox that did not survive its daemon.

The store checks every state it writes against the table (an illegal change raises
`IllegalTransition`, naming both ends) and keeps the states' string values, so existing
databases load as they are and crash recovery (`watchdog.recover`) moves rows by the same
table.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from .. import errors


class SandboxState(StrEnum):
    """A sandbox row's `state` column; the values are what the SQLite store has always held."""

    STARTING = "starting"  # booting; no daemon writes it now, older databases may hold it
    RUNNING = "running"
    PAUSED = "paused"  # checkpointed to its paused snapshot; holds nothing on the host
    TERMINATING = "terminating"  # its host resources are being removed
    TERMINATED = "terminated"  # final

    @property
    def holds_host(self) -> bool:
        """Whether the sandbox may have a container, cgroups, mounts or a network slot on the
        host (what teardown and crash recovery must deal with)."""
        return self in LIVE_STATES

    @classmethod
    def of(cls, value: str, sandbox_id: str | None = None) -> "SandboxState":
        """The state a stored string names.

        Raises:
            InvalidState: the value is no state this rollbox knows (a newer daemon wrote it?).
        """
        try:
            return cls(value)
        except ValueError:
            raise errors.InvalidState(
                f"sandbox {sandbox_id or '?'} has state {value!r} in the database, which this rollbox does not "
                f"know (it knows {', '.join(s.value for s in cls)}); run the rollbox that wrote it, or terminate "
                "the sandbox with that one", sandbox_id=sandbox_id) from None


S = SandboxState
# Allowed changes; the key None is "no row yet" (what a row may be inserted as).
TRANSITIONS: Mapping[SandboxState | None, frozenset[SandboxState]] = {
    None: frozenset({S.STARTING, S.RUNNING}),
    S.STARTING: frozenset({S.RUNNING, S.TERMINATING, S.TERMINATED}),
    S.RUNNING: frozenset({S.PAUSED, S.TERMINATING, S.TERMINATED}),
    S.PAUSED: frozenset({S.RUNNING, S.TERMINATED}),
    S.TERMINATING: frozenset({S.TERMINATED}),
    S.TERMINATED: frozenset(),
}
# States with a host footprint (the store's usage ledger opens for them at insert).
LIVE_STATES: tuple[SandboxState, ...] = (S.STARTING, S.RUNNING, S.TERMINATING)
# Every state but the final one: what `rollbox ps` lists and what keeps images/volumes in use.
NOT_ENDED: tuple[SandboxState, ...] = (*LIVE_STATES, S.PAUSED)


class IllegalTransition(errors.InvalidState):
    """A state change the lifecycle table does not allow (reaches clients as InvalidState)."""

    def __init__(self, sandbox_id: str, current: SandboxState | None, target: SandboxState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (it has ended)"
        if current is None:
            msg = (f"sandbox {sandbox_id} cannot be recorded as {target.value}: a new sandbox starts only as "
                   f"{allowed} (a rollbox bug: report it)")
        else:
            msg = (f"sandbox {sandbox_id} is {current.value} and cannot become {target.value} (from "
                   f"{current.value} it may become {allowed}); another request changed it first: check "
                   f"its state with `rollbox ps -a` and retry if that still makes sense")
        super().__init__(msg, sandbox_id=sandbox_id)
        self.current = current
        self.target = target


def can_transition(current: SandboxState | None, target: SandboxState) -> bool:
    return target in TRANSITIONS[current]


def check_transition(sandbox_id: str, current: SandboxState | None, target: SandboxState) -> None:
    """Raises IllegalTransition unless the table allows `current` -> `target` (None: no row)."""
    if not can_transition(current, target):
        raise IllegalTransition(sandbox_id, current, target)
