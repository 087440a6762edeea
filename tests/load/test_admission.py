"""Admission control under load: 128 episodes (ROLLBOX_ADMISSION_EPISODES; 200 in the issue) at max_concurrency=64 on a 2-core host queue in
the daemon (a bounded number of restores at once) instead of timing out.

Needs root and runsc like the system tests; a few minutes on 2 cores. The 1,000 @ 64 run is in
the benchmark's full mode (bench/scale.py `admission`).
"""

from __future__ import annotations

import os
import shutil

import pytest

from rollbox import Image, Sandbox, SandboxPool
from rollbox.cli.top import MetricsSample
from rollbox.sdk.sandbox import default_client

if os.geteuid() != 0 or shutil.which("runsc") is None:
    pytest.skip("load tests need root and gVisor runsc (run `make setup`)", allow_module_level=True)

pytestmark = pytest.mark.system


EPISODES = int(os.environ.get("ROLLBOX_ADMISSION_EPISODES", "128"))  # 200 is the hardening issue's size


def test_episodes_at_64_have_no_infra_error() -> None:
    base = Sandbox(image=Image.debian(), memory=256).create()
    try:
        assert base.exec("true").ok
        snap = base.snapshot_memory()
    finally:
        base.terminate()
    client = default_client()
    limit = MetricsSample.parse(client.get_text("/metrics")).total("rollbox_admission_limit")
    assert 2 <= limit <= 64
    try:
        with SandboxPool(snap, max_concurrency=64) as pool:
            results = list(pool.map(lambda sb, _t: sb.exec("true").exit_code == 0, range(EPISODES), progress=False,
                                    timeout=300))
        statuses = {r.status for r in results}
        assert [r for r in results if r.status == "infra_error"] == []
        assert statuses == {"ok"}, statuses
        assert len({r.sandbox_id for r in results}) == EPISODES  # a fresh sandbox per episode
        after = MetricsSample.parse(client.get_text("/metrics"))
        assert after.total("rollbox_sandboxes", state="queued") == 0
    finally:
        client.request("DELETE", f"/snapshots/{snap}")
