"""Tiers and scale: the rows of `rollbox bench` beyond rollbox-vs-raw-runsc (bench/bench.py).

Tiers, each running the same trivial episode (`true` in a fresh sandbox, one per episode):
  gvisor   rollbox, a fresh gVisor sandbox restored from a memory snapshot (SandboxPool.map)
  warm     the same with the daemon's warm pool (warm = concurrency)
  runc     rollbox's runc tier: Sandbox(runtime="runc").create() + exec + terminate
  raw runc `runc run` of a prepared bundle whose process is `true` (overlay mount included)
  subprocess `subprocess.run(["true"])`: no isolation, the physical limit on this machine
(raw runsc is bench.bench's RawRunsc restore + exec + delete.)

Per tier: TTFC p50/p99 (fresh sandbox to first command done), episodes/s at each concurrency,
idle PSS per sandbox, CPU seconds per episode. CPU is what the host spent on the run: the
bench process and its reaped children (os.times) plus the daemon's process and its reaped
children (/proc/PID/stat) plus the sandboxes' cgroups (cpuacct) — other users' load excluded.

Scale (full mode only): admission (1000 episodes at max_concurrency=64: infra errors and the
latency profile over the run) and idle density (sandboxes restored and kept idle until start
latency doubles, free memory falls under a floor, N reaches 600 or the wall budget ends).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.config import Paths
from rollbox.runtime.bundle import BundleSpec, oci_spec
from rollbox.runtime.runc import runc_spec
from rollbox.sdk.pool import SandboxPool
from rollbox.sdk.sandbox import Sandbox, SandboxInstance, default_client

from .stats import pct

CGROUP_ROOT = Path("/sys/fs/cgroup")
CLK_TCK = os.sysconf("SC_CLK_TCK")
WARM_SPARES_PER_CORE = 4


def log(msg: str) -> None:
    import sys
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---- CPU accounting --------------------------------------------------------------------------

def _proc_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a process, seconds (0 when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def _cgroup_cpu_s(parent: str) -> float:
    try:
        return int((CGROUP_ROOT / "cpuacct" / parent / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


def daemon_pid() -> int:
    try:
        return int(Paths.from_env().daemon_lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


@dataclass
class CpuMeter:
    """CPU seconds spent by us, the daemon and the given cgroup parents between start and stop.
    A sandbox's cgroup is gone after teardown, so parents are read (they keep the totals)."""

    parents: tuple[str, ...]
    t0: float = 0.0

    def _now(self) -> float:
        t = os.times()
        total = t.user + t.system + t.children_user + t.children_system
        pid = daemon_pid()
        if pid:
            total += _proc_cpu_s(pid)
        return total + sum(_cgroup_cpu_s(p) for p in self.parents)

    def __enter__(self) -> "CpuMeter":
        self.t0 = self._now()
        return self

    def seconds(self) -> float:
        return self._now() - self.t0

    def __exit__(self, *exc: object) -> None:
        pass


# ---- tiers -------------------------------------------------------------------------------------

@dataclass
class Tier:
    name: str
    ttfc_ms: list[float] = field(default_factory=list)
    eps: dict[int, float] = field(default_factory=dict)
    failures: int = 0
    cpu_s_per_episode: float | None = None
    idle_mib: float | None = None

    def row(self) -> dict[str, Any]:
        return {"ttfc_p50_ms": round(pct(self.ttfc_ms, .5), 2), "ttfc_p99_ms": round(pct(self.ttfc_ms, .99), 2),
                **{f"eps_c{c}": round(v, 2) for c, v in self.eps.items()},
                "cpu_s_per_episode": None if self.cpu_s_per_episode is None else round(self.cpu_s_per_episode, 4),
                "idle_mib": None if self.idle_mib is None else round(self.idle_mib, 1), "failures": self.failures}


def run_concurrent(episode: Callable[[], bool], concurrency: int, n: int) -> tuple[float, int]:
    """(episodes/s, episodes that failed) of n episodes at `concurrency` threads."""
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        oks = list(ex.map(lambda _i: _safe(episode), range(n)))
    return n / (time.perf_counter() - t0), oks.count(False)


def _safe(fn: Callable[[], bool]) -> bool:
    try:
        return bool(fn())
    except Exception as e:  # noqa: BLE001 - a failed episode is counted, not fatal
        log(f"episode failed: {type(e).__name__}: {e}")
        return False


def measure_tier(tier: Tier, episode: Callable[[], bool], ttfc: Callable[[], float], runs: list[tuple[int, int]],
                 n_ttfc: int, cpu_parents: tuple[str, ...]) -> Tier:
    ttfc()  # warm-up
    tier.ttfc_ms = [ttfc() for _ in range(n_ttfc)]
    total_eps, cpu = 0, 0.0
    for c, n in runs:
        with CpuMeter(cpu_parents) as m:
            eps, bad = run_concurrent(episode, c, n)
            cpu += m.seconds()
        tier.eps[c] = eps
        tier.failures += bad
        total_eps += n
    tier.cpu_s_per_episode = cpu / max(1, total_eps)
    log(f"{tier.name}: ttfc p50 {pct(tier.ttfc_ms, .5):.1f} ms, eps {({c: round(v, 1) for c, v in tier.eps.items()})}, "
        f"cpu/ep {tier.cpu_s_per_episode:.3f} s, failures {tier.failures}")
    return tier


def subprocess_tier(runs: list[tuple[int, int]], n: int) -> Tier:
    def ep() -> bool:
        return subprocess.run(["true"]).returncode == 0

    def ttfc() -> float:
        t0 = time.perf_counter()
        ep()
        return (time.perf_counter() - t0) * 1000

    return measure_tier(Tier("subprocess"), ep, ttfc, runs, n, ())


def _runc_episode(sb_factory: Callable[[], SandboxInstance]) -> float:
    t0 = time.perf_counter()
    sb = sb_factory()
    try:
        assert sb.exec("true").exit_code == 0
        return (time.perf_counter() - t0) * 1000
    finally:
        sb.terminate()


def runc_tier(runs: list[tuple[int, int]], n: int) -> Tier:
    def make() -> SandboxInstance:
        return Sandbox(runtime="runc", memory=256).create()

    tier = measure_tier(Tier("rollbox runc"), lambda: _runc_episode(make) > 0, lambda: _runc_episode(make), runs, n,
                        (Paths.from_env().cgroup_parent,))
    return tier


@dataclass
class RawRunc:
    """`runc run` (foreground, process `true`) of a bundle on a fresh overlay of the image."""

    work: Path
    image_rootfs: Path
    cgroup_parent: str
    binary: str = field(default_factory=lambda: shutil.which("runc") or "runc")
    n: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def episode_ms(self) -> float:
        return self.run(["/bin/true"])[0]

    def run(self, argv: list[str], timeout: float = 60.0) -> tuple[float, int]:
        """One `runc run` of `argv` in a fresh container: (milliseconds, exit status)."""
        with self.lock:
            self.n += 1
            cid = f"rr{os.getpid():x}{self.n:08x}".ljust(24, "0")[:24]
        d = self.work / "runc-bundles" / cid
        for sub in ("upper", "work", "rootfs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        opts = f"lowerdir={self.image_rootfs},upperdir={d / 'upper'},workdir={d / 'work'}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(d / "rootfs")], check=True)
        try:
            spec = runc_spec(oci_spec(BundleSpec(rootfs=d / "rootfs", cgroup_path=f"/{self.cgroup_parent}/{cid}",
                                                 cpu=1.0, memory_mib=256)))
            spec["process"]["args"] = argv
            spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/.rollbox"]
            (d / "config.json").write_text(json.dumps(spec))
            t0 = time.perf_counter()
            res = subprocess.run([self.binary, "--root", str(self.work / "runc-root"), "run", "--bundle", str(d), cid],
                                 stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
            ms = (time.perf_counter() - t0) * 1000
            if res.returncode != 0 and argv == ["/bin/true"]:
                raise RuntimeError(f"runc run: {res.stderr.decode()[-300:]}")
            return ms, res.returncode
        finally:
            subprocess.run([self.binary, "--root", str(self.work / "runc-root"), "delete", "-f", cid],
                           capture_output=True)
            subprocess.run(["umount", str(d / "rootfs")], capture_output=True)
            shutil.rmtree(d, ignore_errors=True)
            for ctl in os.listdir(CGROUP_ROOT):
                try:
                    (CGROUP_ROOT / ctl / self.cgroup_parent / cid).rmdir()
                except OSError:
                    pass


def raw_runc_tier(raw: RawRunc, runs: list[tuple[int, int]], n: int) -> Tier:
    return measure_tier(Tier("raw runc run"), lambda: raw.episode_ms() > 0, raw.episode_ms, runs, n,
                        (raw.cgroup_parent,))


def pool_tier(name: str, snap: str, runs: list[tuple[int, int]], restore_ms: list[float], warm: bool) -> Tier:
    """The gVisor tiers through SandboxPool.map (teardown included); TTFC from the caller's rows."""
    tier = Tier(name, ttfc_ms=list(restore_ms))
    total, cpu = 0, 0.0
    for c, n in runs:
        with CpuMeter((Paths.from_env().cgroup_parent,)) as m:
            t0 = time.perf_counter()
            # Spares beyond what the cores can restore and keep do not help: every idle systrap
            # sandbox costs ~5% of a core, and 64 of them on 2 cores collapsed the run (0.3 eps/s).
            spares = min(c, WARM_SPARES_PER_CORE * (os.cpu_count() or 1))
            with SandboxPool(snap, max_concurrency=c, warm=spares if warm else 0) as pool:
                if warm:
                    pool.start_warm()
                    wait_warm(snap, spares, 60)
                    t0 = time.perf_counter()
                res = list(pool.map(lambda sb, _t: sb.exec("true").exit_code == 0, range(n), progress=False))
            tier.eps[c] = n / (time.perf_counter() - t0)
            cpu += m.seconds()
        tier.failures += sum(1 for r in res if r.status != "ok")
        total += n
    tier.cpu_s_per_episode = cpu / max(1, total)
    log(f"{name}: eps {({c: round(v, 1) for c, v in tier.eps.items()})}, cpu/ep {tier.cpu_s_per_episode:.3f} s, "
        f"failures {tier.failures}")
    return tier


def wait_warm(snap: str, count: int, wait_s: float) -> None:
    client = default_client()
    deadline = time.monotonic() + wait_s
    while client.request("GET", f"/snapshots/{snap}/warm")["ready"] < count and time.monotonic() < deadline:
        time.sleep(0.1)


def warm_acquire(snap: str, n: int, spares: int = 4) -> dict[str, list[float]]:
    """The pure hand-out of a warm spare, apart from the first exec: the acquire HTTP call as
    the SDK sees it, the daemon's own time for it (its recorded ttfc_ms), and the first exec."""
    client = default_client()
    client.request("PUT", f"/snapshots/{snap}/warm", json={"count": spares, "idle_seconds": 120})
    out: dict[str, list[float]] = {"acquire_ms": [], "daemon_ms": [], "first_exec_ms": []}
    try:
        for _ in range(n):
            wait_warm(snap, spares, 30)
            t0 = time.perf_counter()
            sb = Sandbox().create_from_memory_snapshot(snap)
            t1 = time.perf_counter()
            sb.exec("true")
            t2 = time.perf_counter()
            out["acquire_ms"].append((t1 - t0) * 1000)
            out["first_exec_ms"].append((t2 - t1) * 1000)
            if sb.info().ttfc_ms is not None and sb.info().tags.get("rollbox.warm"):
                out["daemon_ms"].append(float(sb.info().ttfc_ms or 0))
            sb.terminate()
    finally:
        client.request("PUT", f"/snapshots/{snap}/warm", json={"count": 0})
    log(f"warm acquire: p50 {pct(out['acquire_ms'], .5):.2f} ms (daemon {pct(out['daemon_ms'], .5):.2f} ms), "
        f"first exec {pct(out['first_exec_ms'], .5):.1f} ms")
    return out


# ---- scale tests (full mode) ---------------------------------------------------------------------

def admission(snap: str, n: int = 1000, concurrency: int = 64) -> dict[str, Any]:
    """n trivial episodes at max_concurrency: statuses and the latency profile in 10 slices of
    completion order (flat = admission control queues instead of collapsing)."""
    t0 = time.perf_counter()
    with SandboxPool(snap, max_concurrency=concurrency) as pool:
        res = list(pool.map(lambda sb, _t: sb.exec("true").exit_code == 0, range(n), progress=False, timeout=120))
    wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for r in res:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    ttfc = [r.ttfc_ms or 0.0 for r in res]
    k = max(1, len(ttfc) // 10)
    profile = [round(pct(ttfc[i:i + k], .5)) for i in range(0, len(ttfc), k)][:10]
    out = {"episodes": n, "concurrency": concurrency, "seconds": round(wall, 1), "episodes_per_s": round(n / wall, 2),
           "statuses": statuses, "infra_error": statuses.get("infra_error", 0),
           "ttfc_p50_ms_by_decile": profile}
    log(f"admission {n}@{concurrency}: {out}")
    return out


def _mem_available_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _tree_bytes(root: Path) -> int:
    """Bytes the files under `root` take on disk (sparse files as allocated; a file hard-linked
    several times, e.g. each snapshot's pinned agent, once)."""
    total, seen = 0, set()
    for d, _dirs, files in os.walk(root):
        for f in files:
            try:
                st = os.lstat(os.path.join(d, f))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _host_processes() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


def wait_paused(ids: list[str], wait_s: float) -> tuple[float, int]:
    """Waits until every sandbox of `ids` is paused (auto-pause) or `wait_s` passed; returns
    the seconds waited and how many are paused then."""
    t0, want, paused = time.monotonic(), set(ids), 0
    while True:
        rows = default_client().request("GET", "/sandboxes")
        paused = sum(1 for r in rows if r["sandbox_id"] in want and r["state"] == "paused")
        if paused == len(want) or time.monotonic() - t0 > wait_s:
            return time.monotonic() - t0, paused
        time.sleep(0.5)


def idle_density(snap: str, limit: int = 600, batch: int = 25, floor_mib: float = 2048,
                 wall_s: float = 600, auto_pause_seconds: float | None = None,
                 settle_s: float = 120, confirm: int = 2) -> dict[str, Any]:
    """Restores sandboxes and keeps them idle, `batch` at a time; stops when the batch's restore
    p50 is twice the reference (the lower p50 of the first two batches, on a nearly empty host)
    in `confirm` batches in a row (reached: the count before the first of them), MemAvailable <
    floor_mib, `limit` is reached or `wall_s` passed. Terminates them all before returning.

    With `auto_pause_seconds`, each is restored with that auto-pause delay (the daemon pauses
    it to disk once idle) and, before the next batch is measured, the kept ones are left to
    settle: up to `settle_s` seconds until all are paused (each batch reports how long that
    took and how many were paused), so a batch's restores are measured against idle paused
    sandboxes, not against the checkpoints of the previous batch. At the end a few of the
    paused ones are resumed (`resume_p50_ms`: the next call's latency on a paused sandbox)."""
    kept: list[SandboxInstance] = []
    base: float | None = None
    reason, batches, over = "limit", [], 0
    resume: list[float] = []
    t_end = time.monotonic() + wall_s
    try:
        while len(kept) < limit:
            lat = []
            for _ in range(batch):
                t0 = time.perf_counter()
                sb = Sandbox(keep_warm_seconds=900, auto_pause_seconds=auto_pause_seconds
                             ).create_from_memory_snapshot(snap)
                sb.exec("true")
                lat.append((time.perf_counter() - t0) * 1000)
                kept.append(sb)
            p50 = pct(lat, .5)
            # The reference: the lower of the first two batches' p50 (a shared host can slow
            # the first batch alone, which would then hide any later doubling).
            base = p50 if base is None or (len(batches) == 1 and p50 < base) else base
            row: dict[str, Any] = {"n": len(kept), "ttfc_p50_ms": round(p50, 1)}
            if auto_pause_seconds is not None:
                waited, paused = wait_paused([s.sandbox_id for s in kept], settle_s)
                row |= {"settle_s": round(waited, 1), "paused": paused,
                        "snapshots_disk_mib": round(_tree_bytes(Paths.from_env().snapshots) / 2**20)}
            row |= {"mem_available_mib": round(_mem_available_mib()), "host_processes": _host_processes(),
                    "host_load1": round(os.getloadavg()[0], 1)}  # others' work on a shared host shows here
            batches.append(row)
            log(f"idle density: {row} (reference {base:.0f} ms)")
            # On a shared host one batch can be slow for others' reasons: a doubling counts
            # once the next batch confirms it (every batch is reported).
            over = over + 1 if p50 > 2 * base else 0
            if over >= confirm:
                reason = "latency doubled"
                break
            if _mem_available_mib() < floor_mib:
                reason = "memory floor"
                break
            if time.monotonic() > t_end:
                reason = "wall budget"
                break
        if auto_pause_seconds is not None:
            for sb in kept[:5]:
                t0 = time.perf_counter()
                sb.exec("true")
                resume.append((time.perf_counter() - t0) * 1000)
    finally:
        with cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda s: _safe(lambda: s.terminate() is None), kept))
    reached = len(kept) if reason != "latency doubled" else len(kept) - confirm * batch
    out: dict[str, Any] = {"max_idle_sandboxes": max(0, reached), "stopped_by": reason,
                           "reference_ttfc_p50_ms": round(base or 0, 1), "batches": batches}
    if resume:
        out["resume_p50_ms"] = round(pct(resume, .5), 1)
    return out
