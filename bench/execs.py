"""Many small execs at once: `echo 1` at high concurrency across a fleet of sandboxes.

The benchmark's exec fan-out row (bench/bench.py: 256 at once across 32 sandboxes in full mode)
and, small, a load test (tests/load/test_execs.py: 400 at 64 across 8). Every exec goes
through the process's one SDK client, so this measures its connection handling (a pooled
connection per call in flight, no per-call set-up) as much as the daemon. 2,000 execs at 64
once failed with `Bad file descriptor` there (gh-19).

While it runs, a sampler watches the daemon's children: `max_zombie_s` is the longest any of
them stayed a zombie (the daemon reaps what it spawns and adopts within seconds).

`cpu_ms_per_exec` says where the CPU went (daemon, this client, the sandboxes' cgroups) and
`host_busy_cores` how busy the host was: with a closed loop of `concurrency` calls, the mean
latency is concurrency / execs_per_s (Little's law), so once the host is saturated the p99 is
bounded by the CPU each exec costs. Measured here (2 cores, 2026-12-03, 32 sandboxes, 256 at
once, 2,000 execs): 62.8 execs/s, p50 4.0 s, p99 6.0 s; per exec ~29 ms inside the sandboxes
(gVisor's spawn of /bin/echo alone ~14-18 ms, plus systrap's spinning under contention),
1.7 ms daemon, 1.2 ms client. Before the SDK's own connection pool (client/unixpool.py) the
client's httpcore pool walk, O(connections^2), held the same run to 10-12 execs/s with a p99
of 75 s.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from typing import Any

from rollbox.config import Paths
from rollbox.errors import RollboxError
from rollbox.runtime import cgroups
from rollbox.sdk.sandbox import Sandbox, SandboxInstance, default_client

from .stats import pct


def zombie_children(pid: int) -> set[int]:
    """Pids of `pid`'s children that are zombies now."""
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = f.read().split()
        except OSError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2:].startswith("Z"):
                out.add(int(kid))
    return out


class ZombieWatch:
    """Samples a process's zombie children every `interval_s`; `max_age_s` is the longest any
    stayed one (a pid seen in consecutive samples)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid, self.interval_s, self.max_age_s = pid, interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "ZombieWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        first: dict[int, float] = {}
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            first = {p: first.get(p, now) for p in zombie_children(self.pid)}
            self.max_age_s = max([self.max_age_s, *(now - t for t in first.values())])


_HZ = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """A process's own CPU seconds (user + system), not its children's."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ


def _host_busy_s() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / _HZ


class CpuSplit:
    """CPU seconds over a `with` block: the daemon's own, this process's, the sandboxes'
    cgroups', and the whole host's busy time."""

    def __init__(self, daemon: int, sandbox_ids: list[str]) -> None:
        self.daemon, self.ids, self.parent = daemon, sandbox_ids, Paths.from_env().cgroup_parent
        self.used: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        t = os.times()
        boxes = (cgroups.cpu_seconds(s.removeprefix("sb-"), self.parent) for s in self.ids)
        return {"daemon": _proc_cpu_s(self.daemon), "client": t.user + t.system,
                "sandboxes": sum(x or 0.0 for x in boxes), "host": _host_busy_s(), "wall": time.monotonic()}

    def __enter__(self) -> "CpuSplit":
        self._t0 = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        t1 = self._now()
        self.used = {k: t1[k] - self._t0[k] for k in t1}


def fanout(sandboxes: int, concurrency: int, n: int, memory: int = 256) -> dict[str, Any]:
    """`n` execs of `echo 1`, `concurrency` at once, spread over `sandboxes` fresh sandboxes.

    Returns execs/s, p50/p99 latency in ms, the failures (a wrong result counts) and the
    daemon's longest-lived zombie; the sandboxes are terminated at the end.
    """
    made: list[SandboxInstance] = []
    try:
        with cf.ThreadPoolExecutor(min(8, sandboxes)) as ex:
            made += ex.map(lambda _i: Sandbox(memory=memory).create(), range(sandboxes))
        default_client().ensure_daemon()
        daemon = int(Paths.from_env().daemon_lock.read_text().strip())
        lat: list[float] = []
        failures: list[str] = []

        def one(i: int) -> None:
            t0 = time.perf_counter()
            try:
                r = made[i % len(made)].exec("echo", "1", timeout=60)
                if r.exit_code != 0 or r.stdout != b"1\n":
                    failures.append(f"exec {i}: exit {r.exit_code}, stdout {r.stdout!r}, stderr {r.stderr[-200:]!r}")
            except RollboxError as e:
                failures.append(f"exec {i}: {type(e).__name__}: {e}")
            lat.append((time.perf_counter() - t0) * 1000)

        with ZombieWatch(daemon) as zombies, CpuSplit(daemon, [sb.sandbox_id for sb in made]) as cpu:
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(concurrency) as ex:
                list(ex.map(one, range(n)))
            seconds = time.perf_counter() - t0
        return {"sandboxes": sandboxes, "concurrency": concurrency, "execs": n, "seconds": round(seconds, 2),
                "execs_per_s": round(n / seconds, 1), "p50_ms": round(pct(lat, .5), 1),
                "p99_ms": round(pct(lat, .99), 1), "failed": len(failures), "failures": failures[:10],
                "max_zombie_s": round(zombies.max_age_s, 2),
                "cpu_ms_per_exec": {k: round(cpu.used[k] * 1000 / n, 1) for k in ("sandboxes", "daemon", "client")},
                "host_busy_cores": round(cpu.used["host"] / cpu.used["wall"], 2), "host_cores": os.cpu_count()}
    finally:
        with cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda sb: sb.terminate(), made))
