"""Warm pools: spares restored ahead of demand, each handed out once, drained when idle."""

from __future__ import annotations

import time

import pytest

import rollbox
from rollbox import Sandbox, SandboxPool
from rollbox.sdk.sandbox import default_client


def _wait_ready(snap: str, n: int) -> None:
    deadline = time.monotonic() + 60
    while default_client().request("GET", f"/snapshots/{snap}/warm")["ready"] < n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert default_client().request("GET", f"/snapshots/{snap}/warm")["ready"] >= n


def test_warm_pool_hands_out_fresh_spares_and_drains() -> None:
    c = default_client()
    src = Sandbox(memory=256).create()
    src.fs.write_file("/work/state", b"captured")
    snap = src.snapshot_memory()
    src.terminate()
    try:
        c.request("PUT", f"/snapshots/{snap}/warm", json={"count": 2, "idle_seconds": 3})
        _wait_ready(snap, 2)
        with pytest.raises(rollbox.InvalidState, match="warm pool"):
            c.request("DELETE", f"/snapshots/{snap}")
        got = []
        for _ in range(4):
            sb = Sandbox().create_from_memory_snapshot(snap)
            assert sb.fs.read_file("/work/state") == b"captured"
            sb.fs.write_file("/work/state", b"dirty")  # must never reach another episode
            got.append(sb.sandbox_id)
            sb.terminate()
        assert len(set(got)) == 4
        # Unused for idle_seconds: drained to zero, no spare left running.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st = c.request("GET", f"/snapshots/{snap}/warm")
            spares = [s for s in c.request("GET", "/sandboxes") if s["tags"].get("rollbox.warm") == snap]
            if st["drained"] and not spares:
                break
            time.sleep(0.5)
        assert st["drained"] and spares == []
        # The pool API of SandboxPool: warm while open, removed on close.
        with SandboxPool(snap, max_concurrency=2, warm=2) as pool:
            res = list(pool.map(lambda sb, t: sb.fs.read_file("/work/state") == b"captured", range(6),
                                progress=False))
        assert [r.reward for r in res] == [1.0] * 6
        assert c.request("GET", f"/snapshots/{snap}/warm")["target"] == 0
    finally:
        c.request("PUT", f"/snapshots/{snap}/warm", json={"count": 0})
        c.request("DELETE", f"/snapshots/{snap}")
