"""`rollbox top`: the daemon's Prometheus metrics (`GET /metrics`), live in the terminal.

`MetricsSample.parse` turns one scrape into numbers; `render(prev, cur)` computes rates and
latency quantiles over the interval between two scrapes (from histogram bucket deltas).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.table import Table

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class MetricsSample:
    """One scrape: every sample by (name, sorted labels), and when it was taken (monotonic s)."""

    at: float
    values: dict[tuple[str, Labels], float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, at: float | None = None) -> "MetricsSample":
        values: dict[tuple[str, Labels], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                values[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
        return cls(time.monotonic() if at is None else at, values)

    def total(self, name: str, **match: str) -> float:
        """Sum of a metric's samples whose labels include `match`."""
        return sum(v for (n, labels), v in self.values.items()
                   if n == name and all(dict(labels).get(k) == want for k, want in match.items()))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, labels), v in self.values.items():
            if n == name:
                key = dict(labels).get(label, "")
                out[key] = out.get(key, 0.0) + v
        return out

    def buckets(self, name: str) -> dict[float, float]:
        """Cumulative counts per upper bound of a histogram, summed over its other labels."""
        out: dict[float, float] = {}
        for (n, labels), v in self.values.items():
            if n == name + "_bucket":
                le = float(dict(labels)["le"])
                out[le] = out.get(le, 0.0) + v
        return out


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of a cumulative histogram (the first bucket bound reaching it), or None
    when it is empty. Coarse by nature: as good as the buckets."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    want = q * buckets[bounds[-1]]
    for b in bounds:
        if buckets[b] >= want:
            return b
    return bounds[-1]


def delta_buckets(prev: MetricsSample | None, cur: MetricsSample, name: str) -> dict[float, float]:
    now = cur.buckets(name)
    if prev is None:
        return now
    before = prev.buckets(name)
    return {b: v - before.get(b, 0.0) for b, v in now.items()}


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "> 30 s" if seconds == float("inf") else f"<= {seconds * 1000:.0f} ms"


def render(prev: MetricsSample | None, cur: MetricsSample) -> Group:
    """Tables of the state now and the rates over the interval since `prev`."""
    dt = (cur.at - prev.at) if prev is not None else 0.0

    def rate(name: str, **match: str) -> str:
        if prev is None or dt <= 0:
            return "-"
        return f"{(cur.total(name, **match) - prev.total(name, **match)) / dt:.1f}/s"

    states = Table(title="sandboxes", title_justify="left")
    for col in ("running", "warm", "starting", "queued", "paused"):
        states.add_column(col, justify="right")
    st = cur.by_label("rollbox_sandboxes", "state")
    states.add_row(*(f"{st.get(c, 0):.0f}" for c in ("running", "warm", "starting", "queued", "paused")))

    activity = Table(title="activity" + (f" (last {dt:.1f} s)" if prev is not None else " (since start)"),
                     title_justify="left")
    for col in ("starts", "start p50", "start p99", "execs", "exec p50", "exec p99", "start failures",
                "warm hits", "admission limit"):
        activity.add_column(col, justify="right")
    sb = delta_buckets(prev, cur, "rollbox_start_seconds")
    eb = delta_buckets(prev, cur, "rollbox_exec_seconds")
    activity.add_row(
        rate("rollbox_starts_total"), _ms(quantile(sb, 0.5)), _ms(quantile(sb, 0.99)),
        rate("rollbox_exec_seconds_count"), _ms(quantile(eb, 0.5)), _ms(quantile(eb, 0.99)),
        rate("rollbox_start_failures_total"), rate("rollbox_warm_acquires_total", result="hit"),
        f"{cur.total('rollbox_admission_limit'):.0f}")

    pools = Table(title="warm pools", title_justify="left")
    for col in ("snapshot", "ready", "filling", "target"):
        pools.add_column(col, justify="right" if col != "snapshot" else "left")
    ready = cur.by_label("rollbox_warm_pool_ready", "snapshot_id")
    filling = cur.by_label("rollbox_warm_pool_filling", "snapshot_id")
    target = cur.by_label("rollbox_warm_pool_target", "snapshot_id")
    for sid in sorted(ready):
        pools.add_row(sid, f"{ready[sid]:.0f}", f"{filling.get(sid, 0):.0f}", f"{target.get(sid, 0):.0f}")
    return Group(states, activity, pools)


def run_top(fetch: Callable[[], str], interval_s: float = 1.0, once: bool = False) -> None:
    """Polls `fetch()` (the metrics text) every `interval_s` seconds and redraws; with `once`,
    prints one frame (two scrapes `interval_s` apart, so rates are real) and returns."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    prev = MetricsSample.parse(fetch())
    if once or not console.is_terminal:
        # Not a terminal (a pipe, a log): a frame per interval, appended, instead of a live
        # redraw that would only be written at exit.
        while True:
            time.sleep(interval_s)
            cur = MetricsSample.parse(fetch())
            console.print(render(prev, cur))
            if once:
                return
            console.file.flush()
            prev = cur
    with Live(render(None, prev), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval_s)
            cur = MetricsSample.parse(fetch())
            live.update(render(prev, cur))
            prev = cur
