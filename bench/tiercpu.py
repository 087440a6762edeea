"""Per-episode CPU of rollbox's `sandbox` and `runc` tiers against the raw loops, measured
side by side (gh-15 item 3). Each row prints CPU-ms per episode:
- by cpuacct cgroup (v1 charges every ancestor, so sandboxes already removed still count):
  `tier-client` (this process and what it spawns: the raw loops' runtime CLI calls and
  mounts), `tier-daemon` (the daemon, which this moves there, and its runtime CLI calls and
  helpers), the daemon's sandbox parent (sentries, gofers, systrap stubs; runc containers)
  and bench's raw parent; plus kernel threads (loop devices, writeback: no cgroup);
- from psutil: the client's and the daemon's own CPU and that of their reaped children;
- per runtime CLI verb (calls and CPU per episode) when `runsc`/`runc` on PATH are
  /usr/bin/time wrappers appending "%U %S %e RUNSC|RUNC %C" lines to $TIER_CLI_LOG.
Other people's load inflates every figure: compare rows of one run, not runs.
Usage: python -m bench.tiercpu [N] [C] [modes...]
    (modes: sandbox sandbox_cold raw_runsc runc raw_runc; TIER_DISK=none: a snapshot without
    the disk cap)
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path

import psutil

from bench import humaneval as he
from bench.common import CGROUP_PARENT
from rollbox.config import Paths

CLI_LOG = Path(os.environ.get("TIER_CLI_LOG", "/tmp/tier/cli.log"))


def cpu(p: psutil.Process) -> tuple[float, float]:
    t = p.cpu_times()
    return t.user + t.system, t.children_user + t.children_system


def daemon_proc() -> psutil.Process | None:
    home = os.environ.get("ROLLBOX_HOME", "/var/lib/rollbox")
    for p in psutil.process_iter(["cmdline", "environ"]):
        cl = p.info["cmdline"] or []
        if "rollbox" in cl and "serve" in cl and (p.info["environ"] or {}).get("ROLLBOX_HOME", "/var/lib/rollbox") == home:
            return p
    return None


def cli_lines() -> list[str]:
    try:
        return CLI_LOG.read_text().splitlines()
    except OSError:
        return []


def verbs(lines: list[str]) -> dict[str, tuple[int, float]]:
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])  # type: ignore[arg-type]
    for ln in lines:
        parts = ln.split()
        if len(parts) < 5 or parts[3] not in ("RUNSC", "RUNC"):
            continue
        verb = next((a for a in parts[5:] if not a.startswith("-") and not a.startswith("/")), "?")
        key = f"{parts[3].lower()} {verb}"
        out[key][0] += 1
        out[key][1] += float(parts[0]) + float(parts[1])
    return {k: (int(v[0]), v[1]) for k, v in out.items()}


ACCT = Path("/sys/fs/cgroup/cpuacct")


def join_cgroup(name: str, pid: int) -> None:
    """Moves `pid` into cpuacct cgroup `name` (made if needed): what it starts from now on is
    counted there too (runtime CLI calls, mount helpers), except sandboxes, which runsc and
    runc move into their own cgroups."""
    d = ACCT / name
    d.mkdir(exist_ok=True)
    (d / "cgroup.procs").write_text(str(pid))


def kthreads_cpu() -> float:
    """CPU seconds of the kernel's threads (children of kthreadd): loop-device workers,
    writeback and other work the kernel does for a sandbox's mounts, charged to no cgroup."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if st[1] == "2":
            total += int(st[11]) + int(st[12])
    return total / hz


class Peak(threading.Thread):
    """Polls a cgroup's counter (every 20 ms) and keeps the highest value: the raw loops
    remove their parent cgroup when they finish, taking its counter with it."""

    def __init__(self, name: str) -> None:
        super().__init__(daemon=True)
        self.name_, self.peak, self.done = name, acct(name), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, acct(self.name_))


def acct(name: str) -> float:
    """CPU seconds charged so far to cpuacct cgroup `name` and its children (also removed
    ones: v1 charges every ancestor as it goes)."""
    try:
        return int((ACCT / name / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        return 0.0


def measure(name: str, n: int, c: int, run, warm=None) -> None:  # type: ignore[no-untyped-def]
    progs = he.programs(n)
    if warm is not None:
        warm(c, progs)
    groups = ("tier-client", "tier-daemon", Paths.from_env().cgroup_parent, CGROUP_PARENT)
    g0 = {g: acct(g) for g in groups}
    k0 = kthreads_cpu()
    peak = Peak(CGROUP_PARENT)
    peak.start()
    me = psutil.Process()
    d = daemon_proc()
    if d is not None:
        join_cgroup("tier-daemon", d.pid)
    m0, d0 = cpu(me), (cpu(d) if d else (0.0, 0.0))
    l0 = len(cli_lines())
    t0 = time.perf_counter()
    res = run(progs, c)
    wall = time.perf_counter() - t0
    m1, d1 = cpu(me), (cpu(d) if d else (0.0, 0.0))
    peak.done.set()
    peak.join()
    tot = {g: acct(g) - g0[g] for g in groups}
    kern = kthreads_cpu() - k0
    tot[CGROUP_PARENT] = max(tot[CGROUP_PARENT], peak.peak - g0[CGROUP_PARENT])
    lines = cli_lines()[l0:]
    ok = sum(1 for r, _ in res if r)
    per = lambda x: x * 1000 / n
    print(f"== {name} n={n} c={c}: {n / wall:.2f}/s ok {ok}/{n}; CPU-ms/episode: client self {per(m1[0] - m0[0]):.0f}"
          f" client children {per(m1[1] - m0[1]):.0f} daemon self {per(d1[0] - d0[0]):.0f}"
          f" daemon children {per(d1[1] - d0[1]):.0f}", flush=True)
    print("   cgroups: " + " ".join(f"{k} {per(v):.0f}" for k, v in tot.items())
          + f" = {per(sum(tot.values())):.0f} CPU-ms/episode; kernel threads {per(kern):.0f}", flush=True)
    for k, (cnt, s) in sorted(verbs(lines).items()):
        print(f"   {k:<18} {cnt / n:5.2f} calls/episode  {per(s):6.1f} CPU-ms/episode", flush=True)


def prepare_snapshot() -> str:
    """demos.humaneval's snapshot; TIER_DISK=none: without the disk cap (an A/B of its cost)."""
    if os.environ.get("TIER_DISK", "") != "none":
        return he.prepare_snapshot()
    from rollbox import Image, Sandbox
    sb = Sandbox(image=Image.debian(), cpu=1.0, memory=512, keep_warm_seconds=600, disk=None).create()
    try:
        sb.exec("python3", "-c", "import json, math, re, collections, itertools, hashlib, typing", timeout=60)
        sb.exec("mkdir", "-p", "/work")
        return sb.snapshot_memory()
    finally:
        sb.terminate()


def main() -> None:
    from rollbox.sdk.sandbox import default_client
    default_client().request("GET", "/sandboxes")  # the daemon up (autostarted) before this joins its cgroup
    join_cgroup("tier-client", os.getpid())
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    modes = sys.argv[3:] or ["sandbox", "raw_runsc", "runc", "raw_runc"]
    snap = prepare_snapshot() if any(m.startswith("sandbox") for m in modes) else ""
    try:
        for m in modes:
            if m == "sandbox":
                pr = he.run_pool(snap, "sandbox")
                measure(m, n, c, pr, pr.warm)
            elif m == "sandbox_cold":  # no warm spares: every episode restores on its path
                pr = he.run_pool(snap, "sandbox")

                def warm0(c: int, progs: list[str], pr=pr) -> None:  # type: ignore[no-untyped-def]
                    from rollbox import SandboxPool
                    pr.pool = SandboxPool(snap, max_concurrency=c, warm=0, isolation="sandbox")
                    list(pr.pool.map(he.rollbox_episode, progs[:c], timeout=40, retries=1))
                measure(m, n, c, pr, warm0)
            elif m == "raw_runsc":
                from bench.raw_humaneval import run_raw_runsc
                r = run_raw_runsc()
                r(he.programs(c), c)  # its checkpoint made, unmeasured
                measure(m, n, c, r)
            elif m == "runc":
                measure(m, n, c, he.run_runc())
            elif m == "raw_runc":
                from bench.raw_humaneval import run_raw_runc
                measure(m, n, c, run_raw_runc())
    finally:
        if snap:
            from rollbox.sdk.sandbox import default_client
            default_client().request("DELETE", f"/snapshots/{snap}")


if __name__ == "__main__":
    main()
