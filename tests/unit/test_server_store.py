from __future__ import annotations

import time

import pytest

from rollbox.server.lifecycle import IllegalTransition
from rollbox.server.store import Store
from rollbox.types import SandboxInfo


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "rollbox.db")
    yield s
    s.close()


def row(sid, state="running", created_at=None, **kw):
    d = dict(sandbox_id=sid, state=state, image_id="im-debian", created_at=created_at or time.time(),
             cpu=2.0, memory_mib=256, keep_warm_seconds=600.0)
    d.update(kw)
    return d


def test_insert_get_info(store):
    store.insert_sandbox(**row("sb-1", snapshot_id="sn-1", ttfc_ms=12.5, pid=42))
    r = store.get_row("sb-1")
    assert r is not None
    assert r["state"] == "running"
    assert r["pid"] == 42
    info = store.sandbox_info(r)
    assert isinstance(info, SandboxInfo)
    assert info.sandbox_id == "sb-1"
    assert info.snapshot_id == "sn-1"
    assert info.ttfc_ms == 12.5
    assert info.memory_mib == 256
    assert store.get_row("sb-missing") is None


def test_update_and_list(store):
    t = time.time()
    store.insert_sandbox(**row("sb-a", created_at=t))
    store.insert_sandbox(**row("sb-b", state="starting", created_at=t + 1))
    store.insert_sandbox(**row("sb-c", created_at=t + 2))
    store.update_sandbox("sb-a", state="terminated", ended_at=t + 5, exit_reason="terminated")
    assert [r["sandbox_id"] for r in store.list_rows()] == ["sb-a", "sb-b", "sb-c"]
    assert [r["sandbox_id"] for r in store.list_rows(("starting", "running"))] == ["sb-b", "sb-c"]
    assert [r["sandbox_id"] for r in store.list_rows(("terminated",))] == ["sb-a"]
    a = store.get_row("sb-a")
    assert a["exit_reason"] == "terminated"
    assert a["ended_at"] == t + 5


def test_usage(store):
    t = time.time() - 100
    store.insert_sandbox(**row("sb-done", created_at=t))
    store.insert_sandbox(**row("sb-live", created_at=t + 50))
    with pytest.raises(IllegalTransition):  # a row is never born ended (and no usage row appears)
        store.insert_sandbox(**row("sb-dead", state="terminated", created_at=t))
    store.update_sandbox("sb-done", state="terminated", ended_at=t + 10)
    # A second ended_at does not move the usage end.
    store.update_sandbox("sb-done", ended_at=t + 99)
    u = {x["sandbox_id"]: x for x in store.usage()}
    assert set(u) == {"sb-done", "sb-live"}
    done = u["sb-done"]
    assert done["running"] is False
    assert done["wall_s"] == pytest.approx(10)
    assert done["run_s"] == pytest.approx(10)
    assert done["reserved_cpu_seconds"] == pytest.approx(20)
    assert done["reserved_gib_seconds"] == pytest.approx(2.5)
    live = u["sb-live"]
    assert live["running"] is True
    assert live["wall_s"] == pytest.approx(50, abs=5)
    assert live["run_s"] == pytest.approx(50, abs=5)
    assert [x["sandbox_id"] for x in store.usage()] == ["sb-done", "sb-live"]


def test_snapshots(store):
    store.insert_snapshot("sn-1", "sb-1", "im-debian", internal=False)
    store.insert_snapshot("sn-2", "sb-1", "im-debian", internal=True)
    rows = list(store.db.execute("SELECT * FROM snapshots ORDER BY snapshot_id"))
    assert [(r["snapshot_id"], r["internal"]) for r in rows] == [("sn-1", 0), ("sn-2", 1)]
    store.delete_snapshot("sn-1")
    rows = list(store.db.execute("SELECT snapshot_id FROM snapshots"))
    assert [r["snapshot_id"] for r in rows] == ["sn-2"]


def test_persists_across_reopen(tmp_path):
    p = tmp_path / "db.sqlite"
    s = Store(p)
    s.insert_sandbox(**row("sb-1"))
    s.close()
    s2 = Store(p)
    try:
        assert s2.get_row("sb-1")["state"] == "running"
        assert len(s2.usage()) == 1
    finally:
        s2.close()
