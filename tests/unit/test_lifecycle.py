"""The sandbox lifecycle table (rollbox.server.lifecycle) and the store's check of it."""

from __future__ import annotations

import itertools
import sqlite3
import time

import pytest

from rollbox import errors
from rollbox.server.lifecycle import (LIVE_STATES, NOT_ENDED, TRANSITIONS, IllegalTransition, SandboxState,
                                      can_transition, check_transition)
from rollbox.server.store import Store

S = SandboxState
# The table, pinned edge by edge: changing the lifecycle means changing this on purpose.
EXPECTED = {
    (None, S.STARTING), (None, S.RUNNING),
    (S.STARTING, S.RUNNING), (S.STARTING, S.TERMINATING), (S.STARTING, S.TERMINATED),
    (S.RUNNING, S.PAUSED), (S.RUNNING, S.TERMINATING), (S.RUNNING, S.TERMINATED),
    (S.PAUSED, S.RUNNING), (S.PAUSED, S.TERMINATED),
    (S.TERMINATING, S.TERMINATED),
}


def test_values_are_the_strings_databases_hold() -> None:
    assert [s.value for s in S] == ["starting", "running", "paused", "terminating", "terminated"]
    assert S.of("paused") is S.PAUSED and S.PAUSED == "paused"


def test_table_is_exactly_the_expected_edges() -> None:
    assert set(TRANSITIONS) == {None, *S}
    edges = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges == EXPECTED


@pytest.mark.parametrize("current,target", list(itertools.product([None, *S], S)))
def test_every_pair_is_allowed_or_refused_with_a_typed_error(current: S | None, target: S) -> None:
    if (current, target) in EXPECTED:
        assert can_transition(current, target)
        check_transition("sb-x", current, target)
        return
    assert not can_transition(current, target)
    with pytest.raises(IllegalTransition) as ei:
        check_transition("sb-x", current, target)
    e = ei.value
    assert isinstance(e, errors.InvalidState) and e.code == "invalid_state" and e.sandbox_id == "sb-x"
    assert (e.current, e.target) == (current, target)
    assert target.value in str(e) and (current is None or current.value in str(e))


def test_no_self_loops_terminated_is_final_and_every_state_can_end() -> None:
    assert all(s not in TRANSITIONS[s] for s in S)
    assert TRANSITIONS[S.TERMINATED] == frozenset()
    for s in S:  # no dead end: every state reaches terminated
        seen, todo = {s}, [s]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert S.TERMINATED in seen


def test_derived_state_sets() -> None:
    assert set(LIVE_STATES) == {S.STARTING, S.RUNNING, S.TERMINATING}
    assert set(NOT_ENDED) == set(S) - {S.TERMINATED}
    assert [s for s in S if s.holds_host] == list(LIVE_STATES)


def test_unknown_stored_state_is_a_typed_error() -> None:
    with pytest.raises(errors.InvalidState, match="'hibernating'"):
        S.of("hibernating", "sb-x")


def _get(store: Store, sid: str) -> sqlite3.Row:
    row = store.get_row(sid)
    assert row is not None
    return row


def _row(sid: str, state: str) -> dict[str, object]:
    return dict(sandbox_id=sid, state=state, image_id="im-debian", created_at=time.time(), cpu=1.0,
                memory_mib=256, keep_warm_seconds=600.0)


def test_store_checks_every_state_it_writes(tmp_path) -> None:
    store = Store(tmp_path / "rollbox.db")
    try:
        store.insert_sandbox(**_row("sb-a", S.RUNNING))
        assert _get(store, "sb-a")["state"] == "running"  # the plain string, as before
        with pytest.raises(IllegalTransition):
            store.insert_sandbox(**_row("sb-b", "paused"))
        assert store.get_row("sb-b") is None
        store.update_sandbox("sb-a", state="paused", paused_snapshot_id="sn-1")
        with pytest.raises(IllegalTransition):
            store.update_sandbox("sb-a", state=S.TERMINATING, exit_reason="x")
        row = _get(store, "sb-a")  # a refused change writes nothing, not even its other columns
        assert (row["state"], row["exit_reason"]) == ("paused", None)
        store.update_sandbox("sb-a", state=S.RUNNING)
        store.update_sandbox("sb-a", state=S.TERMINATING, ended_at=time.time())
        store.update_sandbox("sb-a", state=S.TERMINATED)
        for target in S:
            with pytest.raises(IllegalTransition):
                store.update_sandbox("sb-a", state=target)
        store.update_sandbox("sb-a", exit_reason="done")  # other columns change freely
        assert store.state("sb-a") is S.TERMINATED and store.state("sb-none") is None
    finally:
        store.close()


def test_existing_database_rows_load_by_their_strings(tmp_path) -> None:
    """A database written before the enum (plain strings, rows in every state) loads, lists
    and moves on by the table."""
    p = tmp_path / "rollbox.db"
    old = Store(p)
    for i, state in enumerate(["starting", "running", "paused", "terminating", "terminated"]):
        old.db.execute("INSERT INTO sandboxes (sandbox_id, state, image_id, created_at, cpu, memory_mib, "
                       "last_active_at) VALUES (?,?,?,?,?,?,?)", (f"sb-{i}", state, "im-debian", i, 1.0, 256, i))
    old.close()
    store = Store(p)
    try:
        assert [r["sandbox_id"] for r in store.list_rows(LIVE_STATES)] == ["sb-0", "sb-1", "sb-3"]
        assert [r["sandbox_id"] for r in store.list_rows(NOT_ENDED)] == ["sb-0", "sb-1", "sb-2", "sb-3"]
        assert [store.state(f"sb-{i}") for i in range(5)] == list(S)
        assert store.sandbox_info(_get(store, "sb-2")).state == "paused"
        store.update_sandbox("sb-3", state=S.TERMINATED)
        store.update_sandbox("sb-0", state=S.TERMINATED)
    finally:
        store.close()
