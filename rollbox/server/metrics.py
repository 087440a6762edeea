"""Prometheus metrics of one daemon (`GET /metrics`, read live by `rollbox top`).

Counters and histograms are updated where things happen (admission, exec, acquire); the
gauges (sandboxes by state, warm pool depth, starts queued by admission control) are read from
the service when scraped, so they can never drift from the truth. One registry per daemon:
no process-global state (two services in one test process do not share numbers).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .lifecycle import SandboxState

if TYPE_CHECKING:
    from .service import SandboxService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: starts span ~20 ms (runc) to seconds (a queued restore under load).
START_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
EXEC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)


class _StateCollector(Collector):
    def __init__(self, metrics: "Metrics") -> None:
        self.m = metrics

    def collect(self) -> Iterable[Metric]:
        svc = self.m.svc
        by_state = GaugeMetricFamily("rollbox_sandboxes", "Sandboxes by state (and runtime while running); "
                                     "the states are disjoint: warm spares are not counted as running",
                                     labels=["state", "runtime"])
        warm_ids = {sid for p in svc.warm.pools.values() for sid in p.spares}
        running: dict[str, int] = {}
        for sid, lv in svc.live.items():
            if sid not in warm_ids:
                running[lv.runtime] = running.get(lv.runtime, 0) + 1
        for runtime, n in sorted(running.items()):
            by_state.add_metric([SandboxState.RUNNING.value, runtime], n)
        by_state.add_metric(["warm", "gvisor"], len(warm_ids))
        by_state.add_metric(["starting", ""], self.m.starting)  # admitted starts, no row yet
        by_state.add_metric(["queued", ""], self.m.queued)
        by_state.add_metric([SandboxState.PAUSED.value, "gvisor"], len(svc.store.list_rows((SandboxState.PAUSED,))))
        yield by_state
        depth = GaugeMetricFamily("rollbox_warm_pool_ready", "Warm spares ready per snapshot", labels=["snapshot_id"])
        target = GaugeMetricFamily("rollbox_warm_pool_target", "Warm pool target size per snapshot",
                                   labels=["snapshot_id"])
        filling = GaugeMetricFamily("rollbox_warm_pool_filling", "Warm restores in flight per snapshot",
                                    labels=["snapshot_id"])
        for sid, pool in svc.warm.pools.items():
            depth.add_metric([sid], len(pool.spares))
            target.add_metric([sid], 0 if pool.drained else pool.target)
            filling.add_metric([sid], pool.filling)
        yield depth
        yield target
        yield filling
        yield GaugeMetricFamily("rollbox_admission_limit", "Concurrent starts allowed (ROLLBOX_MAX_STARTS)",
                                value=svc.max_starts)


class Metrics:
    """The daemon's metrics. Safe on the event loop (no locks needed: one thread)."""

    def __init__(self, service: "SandboxService") -> None:
        self.svc = service
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.starts = Counter("rollbox_starts", "Sandbox starts that succeeded", ["runtime", "kind"], registry=r)
        self.start_failures = Counter("rollbox_start_failures", "Sandbox starts (creates, restores, resumes) "
                                      "that failed", ["runtime", "kind"], registry=r)
        self.start_seconds = Histogram("rollbox_start_seconds", "Start latency (queueing included), seconds",
                                       ["runtime", "kind"], buckets=START_BUCKETS, registry=r)
        self.exec_seconds = Histogram("rollbox_exec_seconds", "Exec latency in the daemon, seconds",
                                      buckets=EXEC_BUCKETS, registry=r)
        self.warm_acquires = Counter("rollbox_warm_acquires", "Acquires from a snapshot: hit = a warm spare, "
                                     "miss = a fresh restore", ["result"], registry=r)
        self.starting = 0  # admitted, in progress
        self.queued = 0  # waiting for admission
        r.register(_StateCollector(self))

    @contextlib.contextmanager
    def start(self, runtime: str, kind: str) -> Iterator["StartTimer"]:
        """Times one start (queueing included) and counts how it ended; call the yielded
        timer's `admitted()` once admission control lets it run."""
        timer = StartTimer(self)
        self.queued += 1
        try:
            yield timer
        except BaseException:
            self.start_failures.labels(runtime, kind).inc()
            raise
        else:
            self.starts.labels(runtime, kind).inc()
            self.start_seconds.labels(runtime, kind).observe(time.monotonic() - timer.t0)
        finally:
            if timer.is_admitted:
                self.starting -= 1
            else:
                self.queued -= 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StartTimer:
    """One start in flight: queued until `admitted()`."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics
        self.t0 = time.monotonic()
        self.is_admitted = False

    def admitted(self) -> None:
        if not self.is_admitted:
            self.is_admitted = True
            self.m.queued -= 1
            self.m.starting += 1
