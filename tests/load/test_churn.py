"""Churn without leaks: create -> exec -> terminate at concurrency 16, then nothing a sandbox
made is left: mounts, loop devices, cgroups, namespaces, veths, firewall elements, processes,
state-directory entries, live rows. CI runs 120 cycles; `make soak` runs 2,000 (bench/soak.py)."""

from __future__ import annotations

import os

from bench.soak import churn

CYCLES = int(os.environ.get("ROLLBOX_CHURN_CYCLES", "120"))


def test_churn_leaves_nothing() -> None:
    res = churn(CYCLES, concurrency=16)
    assert res["failed"] == 0, res["failures"]
    assert res["total_leaked"] == 0, res["leaked"]
