"""`/run_code` throughput: HumanEval's canonical programs through the PyPI `sandbox-fusion`
client against `rollbox serve-fusion`, beside the same programs through the SDK.

Run as root from the repository root: `.venv/bin/python -m bench.fusion [--concurrency 8]
[--limit N] [--isolation container] [--rounds 1]` (or `rollbox bench fusion ...`). Not run by
the tests. Side by side, at one concurrency:

- `fusion`: `rollbox serve-fusion` started as a user would (a subprocess on a free loopback
  port, `--memory 512` like the SDK row's snapshot), then C client threads each calling
  `run_code(RunCodeRequest(code=program, language="python"))`: the whole path a verl reward
  worker takes (HTTP, JSON, the server's pool, a fresh episode per request).
- `sdk`: the same programs through one long-lived `SandboxPool(snapshot, isolation=...)` (as the
  server holds one), `pool.map` of bench.humaneval's episode: the program written to
  /work/program.py and run by python3, no HTTP in between.

Both sides are warmed up first (a round of C programs: pooled sandboxes restored).

Each row: programs/s, p50/p99 latency per program, CPU-ms per program (the whole machine's
busy time: run it on a quiet machine) and passed/total; then the CPU-ms per program of the
processes the two paths do not share (less sensitive to a busy machine): the server process
and this process (the client threads, or the SDK pool's), beside the daemon's. Then the
fusion/sdk ratio and one JSON line (`fusion_humaneval_c<C>_per_s`, `sdk_humaneval_c<C>_per_s`,
...).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from bench.humaneval import (TIMEOUT_S, CpuMeter, Row, measure, prepare_snapshot, print_rows, programs,
                             rollbox_episode)
from rollbox import SandboxPool

START_TIMEOUT_S = 300.0


def start_server(concurrency: int, isolation: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile(prefix="serve-fusion-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "rollbox", "serve-fusion", "--listen", f"127.0.0.1:{port}",
                             "--concurrency", str(concurrency), "--isolation", isolation, "--memory", "512"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    import requests
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(url + "/v1/ping", timeout=2).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"serve-fusion did not come up; its log: {log.name}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_fusion(url: str) -> Callable[[list[str], int], list[tuple[bool, float]]]:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    def one(program: str) -> tuple[bool, float]:
        t = time.perf_counter()
        try:
            r = run_code(RunCodeRequest(code=program, language="python", run_timeout=TIMEOUT_S), endpoint=url,
                         max_attempts=1)
            ok = r.status == RunStatus.Success
        except Exception:  # noqa: BLE001 - a SandboxError or HTTP failure counts as not passed
            ok = False
        return ok, (time.perf_counter() - t) * 1000

    def run(progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        with cf.ThreadPoolExecutor(concurrency) as ex:
            return list(ex.map(one, progs))
    return run


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemon_pid() -> int:
    from rollbox.sdk.sandbox import default_client
    return int(default_client().request("GET", "/health")["pid"])


def run_sdk(pool: Any) -> Callable[[list[str], int], list[tuple[bool, float]]]:
    def run(progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        res = list(pool.map(rollbox_episode, progs, timeout=TIMEOUT_S + 30, retries=1))
        return [(r.status == "ok" and r.reward == 1.0, r.wall_s * 1000) for r in res]
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rollbox bench fusion", description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None, help="first N problems only")
    ap.add_argument("--isolation", default="container", choices=("container", "sandbox"))
    ap.add_argument("--rounds", type=int, default=1, help="fusion/sdk pairs, alternated (noisy machines)")
    args = ap.parse_args(argv)
    c = args.concurrency
    progs = programs(args.limit)
    meter = CpuMeter()
    rows: list[Row] = []
    split: list[dict[str, Any]] = []  # per row: CPU-ms per program of the server, this process, the daemon
    proc, url = start_server(c, args.isolation)
    try:
        run_fusion(url)(progs[:c], c)  # warm-up: the pool's sandboxes restored, connections open
        fusion = run_fusion(url)
        snap = prepare_snapshot()
        try:
            with SandboxPool(snap, max_concurrency=c, warm=c if args.isolation == "sandbox" else 0,
                             isolation=args.isolation) as pool:
                sdk = run_sdk(pool)
                sdk(progs[:c], c)
                daemon = daemon_pid()
                for _ in range(args.rounds):
                    for name, run in (("fusion", fusion), ("sdk", sdk)):
                        before = (proc_cpu_s(proc.pid), time.process_time(), proc_cpu_s(daemon))
                        rows.append(measure(name, c, progs, run, meter))
                        after = (proc_cpu_s(proc.pid), time.process_time(), proc_cpu_s(daemon))
                        server_ms, own_ms, daemon_ms = ((a - b) * 1000 / len(progs) for a, b in zip(after, before))
                        split.append({"name": name, "server_cpu_ms": round(server_ms, 1) if name == "fusion" else 0.0,
                                      "caller_cpu_ms": round(own_ms, 1), "daemon_cpu_ms": round(daemon_ms, 1)})
                        print(f"{name} c={c}: {rows[-1].per_s:.2f} programs/s; CPU-ms per program: server "
                              f"{split[-1]['server_cpu_ms']}, caller {split[-1]['caller_cpu_ms']}, daemon "
                              f"{split[-1]['daemon_cpu_ms']}", flush=True)
        finally:
            from rollbox.sdk.sandbox import default_client
            default_client().request("DELETE", f"/snapshots/{snap}")
    finally:
        stop_server(proc)
    print()
    print(f"HumanEval canonical programs, isolation={args.isolation}: /run_code through the sandbox-fusion client "
          "vs the SDK (CPU-ms per program: the whole machine's busy time)")
    print_rows(rows)
    print(f"{'CPU-ms per program':<22} {'server':>8} {'caller':>8} {'daemon':>8}")
    for sp in split:
        print(f"{sp['name']:<22} {sp['server_cpu_ms']:>8} {sp['caller_cpu_ms']:>8} {sp['daemon_cpu_ms']:>8}")
    best: dict[str, Row] = {}
    for r in rows:
        if r.name not in best or r.per_s > best[r.name].per_s:
            best[r.name] = r
    ratio = best["fusion"].per_s / best["sdk"].per_s
    print(f"fusion / sdk at c={c}: {ratio:.2f}x (best round of each)")
    out: dict[str, Any] = {f"{name}_humaneval_c{c}_per_s": round(r.per_s, 2) for name, r in best.items()}
    out.update({f"{name}_humaneval_c{c}_cpu_ms": round(r.cpu_ms, 1) for name, r in best.items()})
    out.update({"fusion_over_sdk": round(ratio, 3), "isolation": args.isolation, "rows": [asdict(r) for r in rows],
                "process_cpu_ms": split})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
