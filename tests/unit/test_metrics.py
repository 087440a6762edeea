"""The daemon's metrics text and `rollbox top`'s reading of it (a stub service: no sandboxes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollbox.cli.top import MetricsSample, delta_buckets, quantile, render
from rollbox.server.metrics import Metrics
from rollbox.server.warm import WarmPool


class _Store:
    def list_rows(self, states: tuple[str, ...]) -> list[object]:
        return [object()] if states == ("paused",) else []


def _service() -> SimpleNamespace:
    pool = WarmPool("sn-abc", target=4, idle_seconds=60)
    pool.spares.extend(["sb-1", "sb-2"])
    pool.filling = 2
    live = {"sb-1": SimpleNamespace(runtime="gvisor"), "sb-2": SimpleNamespace(runtime="gvisor"),
            "sb-3": SimpleNamespace(runtime="runc")}
    return SimpleNamespace(live=live, warm=SimpleNamespace(pools={"sn-abc": pool}), store=_Store(), max_starts=4)


def test_metrics_text_parses_and_carries_state() -> None:
    m = Metrics(_service())  # type: ignore[arg-type]
    with m.start("gvisor", "restore") as t:
        assert (m.queued, m.starting) == (1, 0)
        t.admitted()
        assert (m.queued, m.starting) == (0, 1)
    with pytest.raises(RuntimeError):
        with m.start("runc", "create"):
            raise RuntimeError("boom")
    m.exec_seconds.observe(0.004)
    m.warm_acquires.labels(result="hit").inc()
    s = MetricsSample.parse(m.render().decode())
    assert s.total("rollbox_sandboxes", state="running", runtime="gvisor") == 0  # both are warm spares
    assert s.total("rollbox_sandboxes", state="running", runtime="runc") == 1
    assert s.total("rollbox_sandboxes", state="warm") == 2
    assert s.total("rollbox_sandboxes", state="paused") == 1
    assert s.total("rollbox_sandboxes", state="queued") == 0 and s.total("rollbox_sandboxes", state="starting") == 0
    assert s.total("rollbox_starts_total", runtime="gvisor", kind="restore") == 1
    assert s.total("rollbox_start_failures_total", runtime="runc", kind="create") == 1
    assert s.total("rollbox_start_seconds_count") == 1
    assert s.total("rollbox_exec_seconds_count") == 1
    assert s.total("rollbox_warm_acquires_total", result="hit") == 1
    assert s.total("rollbox_warm_pool_ready", snapshot_id="sn-abc") == 2
    assert s.total("rollbox_warm_pool_filling", snapshot_id="sn-abc") == 2
    assert s.total("rollbox_warm_pool_target", snapshot_id="sn-abc") == 4
    assert s.total("rollbox_admission_limit") == 4
    assert quantile(s.buckets("rollbox_exec_seconds"), 0.5) == 0.005


def test_registries_are_per_service() -> None:
    a, b = Metrics(_service()), Metrics(_service())  # type: ignore[arg-type]
    a.exec_seconds.observe(1.0)
    assert MetricsSample.parse(b.render().decode()).total("rollbox_exec_seconds_count") == 0


def test_quantile_and_deltas() -> None:
    assert quantile({}, 0.5) is None
    assert quantile({0.1: 0.0, float("inf"): 0.0}, 0.5) is None
    cum = {0.01: 1.0, 0.1: 9.0, 1.0: 10.0, float("inf"): 10.0}
    assert quantile(cum, 0.5) == 0.1 and quantile(cum, 0.99) == 1.0 and quantile(cum, 0.05) == 0.01
    text0 = 'x_bucket{le="0.1"} 1\nx_bucket{le="+Inf"} 1\n'
    text1 = 'x_bucket{le="0.1"} 1\nx_bucket{le="+Inf"} 5\n'
    d = delta_buckets(MetricsSample.parse(text0, at=0), MetricsSample.parse(text1, at=1), "x")
    assert d == {0.1: 0.0, float("inf"): 4.0}


def test_render_has_rates() -> None:
    from rich.console import Console

    m = Metrics(_service())  # type: ignore[arg-type]
    prev = MetricsSample.parse(m.render().decode(), at=0.0)
    for _ in range(4):
        with m.start("gvisor", "restore") as t:
            t.admitted()
    cur = MetricsSample.parse(m.render().decode(), at=2.0)
    console = Console(record=True, width=160)
    console.print(render(prev, cur))
    out = console.export_text()
    assert "2.0/s" in out and "sn-abc" in out
