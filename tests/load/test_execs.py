"""Many small execs at once through one SDK client (gh-19, item 5): 256 `echo 1` at concurrency
64 across 8 sandboxes, every one answered, and no zombie of the daemon living more than a few
seconds meanwhile. (2,000 at 64 across 32 once gave `DaemonUnavailable ... Bad file
descriptor`; tests/unit/test_connections.py checks the cause directly. The full-size row is
the benchmark's exec fan-out, bench/execs.py.)"""

from __future__ import annotations

import pytest

from bench.execs import fanout

pytestmark = pytest.mark.system


def test_small_execs_at_64_across_8_sandboxes_all_succeed_gh19() -> None:
    res = fanout(sandboxes=8, concurrency=64, n=256)
    assert res["failed"] == 0, res["failures"]
    assert res["max_zombie_s"] < 5.0, res
