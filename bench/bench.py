"""rollbox benchmark: rollbox against raw gVisor `runsc`, both measured in the same run.

Run from the repository root as root: `.venv/bin/python -m bench.bench` (~2-4 min on 2 cores).
It prints a side-by-side table, then, as its last line, one JSON object.

What is measured and how (all wall-clock, `time.perf_counter`, one warm-up run discarded):

1. Cold time-to-first-command (TTFC): `Sandbox(image=Image.debian()).create()` followed by the
   first `exec("true")`, as seen by the SDK. Baseline: `runsc run -detach` of a prepared bundle
   followed by `runsc exec ID true`. The raw bundle is what rollbox builds (an overlayfs of the
   image rootfs with a fresh upper, `config.json` from `rollbox.runtime.bundle.oci_spec`, the same
   cpu/memory limits and runsc flags) but its process is an idle `python3` instead of the agent;
   mounting the overlay is done before the clock starts.
2. Restore TTFC: `Sandbox().create_from_memory_snapshot(snap)` + first `exec("true")`.
   Baseline: `runsc restore -detach --image-path IMG` (an uncompressed checkpoint of the raw
   idle-python container, like rollbox's) + `runsc exec ID true`; the fresh overlay mount is
   again prepared before the clock starts, rollbox's own upper copy and mount are inside it.
3. Exec round trip of `true` in a warm sandbox (rollbox: agent over FIFOs; raw: `runsc exec`),
   and paired with it (alternating blocks of 10) a posix_spawnp + waitpid of `true` by a
   process inside the same sandbox: `exec_over_spawn_ms` is what rollbox adds to the command's
   own cost (issue #15: at most 2 ms).
   Then exec fan-out (bench/execs.py): `echo 1` 256 at once across 32 sandboxes, execs/s, p50/p99.
   Then background processes (bench/processes.py): write-to-client latency p50/p99, process start,
   run_code `1+1` against exec `python3 -c`.
4. `sb.fork(8)` wall time.
5. Episodes/s of a trivial episode (`sb.exec("true")`) through `SandboxPool.map` at
   concurrency 1, 4 and 16, pool teardown included. Baseline: one raw runsc
   restore + exec + delete (+ overlay mount/unmount) per episode, at concurrency 1 and 4.
6. Idle memory per sandbox: 8 sandboxes restored from the snapshot, 2 s idle, then the sum of
   PSS (`/proc/PID/smaps_rollup`) of their runsc-sandbox and runsc-gofer processes (cmdline
   holds the container id) and every descendant of the sandbox process (systrap stubs), / 8.
   Also the memory cgroup's `memory.usage_in_bytes` (page cache included), / 8, and the CPU
   (utime + stime) those processes use over 5 idle seconds, as % of one core per sandbox.
   Full mode repeats it on a daemon restarted with ROLLBOX_PLATFORM=ptrace.
7. Networking: restore TTFC and cold TTFC of a sandbox with its own network namespace and one
   exposed port, against the loopback-only rows above (target: restore <= 20 ms more at p50).
   Then a churn of ROLLBOX_BENCH_NET_CYCLES (default 1000; 0 skips it) networked create ->
   exec -> terminate cycles at concurrency 4, and the count of namespaces, host links, nft map
   elements and port listeners left beyond the prepared pool ("leaked", must be 0).
8. Boot from an image made by `create_image_from_filesystem()` (1 MiB of new files on the
   Debian base): create + first `exec("true")` (target < 1 s).

The bench process becomes a child subreaper and reaps the raw sandboxes it orphans (as the
daemon does), so that `runsc delete` of a raw container is not slowed by PID 1.
Everything it makes is removed in `finally` blocks: sandboxes, snapshots, raw containers,
overlay mounts, directories under /tmp/rollbox-bench and cgroups under */rollbox-bench.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.client.transport import stop_daemon
from rollbox.config import Paths
from rollbox.errors import RollboxError
from rollbox.sdk.image import Image
from rollbox.sdk.pool import SandboxPool
from rollbox.sdk.sandbox import Sandbox, SandboxInstance, default_client
from rollbox.server import inventory

from . import execs, memory, processes, scale
from .common import (CGROUP_PARENT, IMAGE_ID, IMAGE_ROOTFS, PRIVATE_HOME, RAW_ROOT,
                     SHARED_HOME, WORK, log, timed_ms)
from .memory import Memory, host_sandbox_count, idle_memory
from .raw import (OrphanReaper, RawRunsc, raw_cold, raw_episodes_per_s, raw_exec_ms, raw_make_checkpoint,
                  raw_restore, remove_cgroups, unmount_under)
from .report import build_results, print_table, r
from .stats import pct


N_COLD, N_RESTORE, N_EXEC, N_RAW_EXEC, N_RAW_RESTORE, N_RAW_COLD = 10, 20, 100, 20, 20, 10
FORK_N, IDLE_N = 8, 8
POOL_RUNS: tuple[tuple[int, int], ...] = ((1, 16), (4, 32), (16, 48))  # (concurrency, episodes)
EXEC_FANOUT = (32, 256, 4000)  # sandboxes, concurrency, execs
N_PROCS = 40  # samples per figure of the processes section (bench/processes.py)
RAW_EPISODE_RUNS: tuple[tuple[int, int], ...] = ((1, 12), (4, 16))
NET_CYCLES = int(os.environ.get("ROLLBOX_BENCH_NET_CYCLES", "1000"))
# Tier rows (bench/scale.py): (concurrency, episodes) per run; TIER_POOL_RUNS for the gVisor tiers.
TIER_RUNS: list[tuple[int, int]] = [(1, 20), (4, 40), (16, 64), (64, 128)]
TIER_POOL_RUNS: list[tuple[int, int]] = [(1, 16), (4, 32), (16, 48), (64, 128)]
N_TIER_TTFC, N_WARM_ACQUIRE = 20, 20
SCALE_TESTS = True
ADMISSION = (1000, 64)  # episodes, max_concurrency
DENSITY: dict[str, int] = {"limit": 600, "batch": 25}


# ---- rollbox ---------------------------------------------------------------------------------

@dataclass
class Tracker:
    """Everything rollbox-side this run made, for cleanup in `finally`."""

    sandboxes: list[SandboxInstance] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)

    def add(self, sb: SandboxInstance) -> SandboxInstance:
        self.sandboxes.append(sb)
        return sb

    def terminate(self, sbs: Iterable[SandboxInstance]) -> None:
        todo = [s for s in sbs if not s.terminated]
        if not todo:
            return
        with cf.ThreadPoolExecutor(4) as ex:
            for fut in [ex.submit(s.terminate) for s in todo]:
                try:
                    fut.result()
                except RollboxError as e:
                    log(f"terminate failed: {e}")

    def snap_of_fresh_sandbox(self) -> str:
        """A memory snapshot of a fresh Debian sandbox (its agent idle), made on the daemon now up."""
        sb = self.add(Sandbox(image=Image.debian()).create())
        first_exec_ok(sb)
        snap = sb.snapshot_memory()
        self.snapshots.append(snap)
        self.terminate([sb])
        return snap

    def cleanup(self) -> None:
        self.terminate(self.sandboxes)
        for sid in self.snapshots:
            try:
                default_client().request("DELETE", f"/snapshots/{sid}")
            except RollboxError as e:
                log(f"deleting snapshot {sid} failed: {e}")


def first_exec_ok(sb: SandboxInstance) -> None:
    r = sb.exec("true")
    if r.exit_code != 0:
        raise RuntimeError(f"`true` in {sb.sandbox_id} exited {r.exit_code}")


def rollbox_cold(tr: Tracker, ports: list[int] | None = None, image: Image | None = None) -> float:
    def go() -> SandboxInstance:
        sb = tr.add(Sandbox(image=image or Image.debian(), ports=ports or []).create())
        first_exec_ok(sb)
        return sb
    ms, sb = timed_ms(go)
    tr.terminate([sb])
    return ms


def rollbox_restore(tr: Tracker, snap: str) -> float:
    def go() -> SandboxInstance:
        sb = tr.add(Sandbox().create_from_memory_snapshot(snap))
        first_exec_ok(sb)
        return sb
    ms, sb = timed_ms(go)
    tr.terminate([sb])
    return ms


def net_leftovers() -> dict[str, int]:
    """What rollbox's networking holds on the host now, counted from the host's side
    (rollbox.server.inventory), plus the daemon's own count of listeners and slots."""
    health = default_client().request("GET", "/health")["network"]
    inv = inventory.take(Paths.from_env(), ready_slots=health["ready"])
    return {"netns": inv.netns, "links": inv.links, "nft_elements": inv.nft_elements, "listeners": health["ports"],
            "in_use": health["in_use"], "ready": health["ready"]}


def net_churn(cycles: int, concurrency: int = 4) -> dict[str, Any]:
    """`cycles` networked create -> exec -> terminate, then what is left beyond the ready pool."""
    def one(_i: int) -> None:
        sb = Sandbox(ports=[8000], block_network=False, allow_list=["198.18.0.0/24"], memory=256).create()
        try:
            first_exec_ok(sb)
        finally:
            sb.terminate()
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, range(cycles)))
    left = net_leftovers()
    ready = left["ready"]
    return {"cycles": cycles, "seconds": round(time.perf_counter() - t0, 1), **left,
            "leaked": (left["netns"] - 2 * ready) + (left["links"] - ready) + (left["nft_elements"] - ready)
            + left["listeners"] + left["in_use"]}


def rollbox_warm(tr: Tracker, snap: str, n: int, spares: int = 4) -> list[float]:
    """TTFC with a warm pool of `spares`: each acquisition is followed by a pause long enough
    for the daemon to restore a replacement (steady state of a pool at modest demand)."""
    client = default_client()
    client.request("PUT", f"/snapshots/{snap}/warm", json={"count": spares, "idle_seconds": 120})
    try:
        deadline = time.monotonic() + 60
        while client.request("GET", f"/snapshots/{snap}/warm")["ready"] < spares and time.monotonic() < deadline:
            time.sleep(0.2)
        out = []
        for _ in range(n):
            out.append(rollbox_restore(tr, snap))
            time.sleep(0.5)
        return out
    finally:
        client.request("PUT", f"/snapshots/{snap}/warm", json={"count": 0})


# Inside the sandbox: N spawns of `true` found on PATH, as exec("true") finds it (posix_spawnp +
# waitpid), each timed (ms), one per line.
SPAWN_LOOP = ("import os, sys, time\n"
              "for _ in range(int(sys.argv[1])):\n"
              "    t = time.perf_counter()\n"
              "    os.waitpid(os.posix_spawnp('true', ['true'], os.environ), 0)\n"
              "    print((time.perf_counter() - t) * 1e3)\n")


def exec_vs_spawn(sb: SandboxInstance, n: int, block: int = 10) -> dict[str, list[float]]:
    """`exec("true")` round trips (SDK to agent and back) against spawns of `true` made by a
    process inside the same sandbox (what the command itself costs there: gVisor's fork/exec),
    in alternating blocks of `block` so that drift in the host's load hits both alike (issue #15:
    exec of `true` at most 2 ms over the in-sandbox spawn). ms per call, `n` of each."""
    out: dict[str, list[float]] = {"exec": [], "spawn": []}
    while len(out["exec"]) < n:
        out["exec"] += [timed_ms(lambda: first_exec_ok(sb))[0] for _ in range(block)]
        r = sb.exec("python3", "-c", SPAWN_LOOP, str(block))
        if r.exit_code != 0:
            raise RuntimeError(f"the in-sandbox spawn loop exited {r.exit_code}: {r.stderr[-300:]!r}")
        out["spawn"] += [float(x) for x in r.stdout.split()]
    return out


def rollbox_fork(tr: Tracker, sb: SandboxInstance, n: int) -> float:
    ms, kids = timed_ms(lambda: sb.fork(n))
    for k in kids:
        tr.add(k)
    tr.terminate(kids)
    return ms / 1000


def trivial_episode(sb: SandboxInstance, _task: Any) -> bool:
    return bool(sb.exec("true").exit_code == 0)


def pool_episodes_per_s(snap: str, concurrency: int, n: int) -> tuple[float, int]:
    """(episodes/s with teardown included, episodes not `ok`)."""
    t0 = time.perf_counter()
    with SandboxPool(snap, max_concurrency=concurrency) as pool:
        results = list(pool.map(trivial_episode, range(n), progress=False))
    dt = time.perf_counter() - t0
    bad = sum(1 for r in results if r.status != "ok" or r.reward != 1.0)
    return n / dt, bad


RAY_ROW = True  # local vs Ray episodes/s (issue 9); off in --quick


def ray_vs_local(snap: str, concurrency: int = 4, n: int = 32) -> dict[str, float] | None:
    """Episodes/s of the same batch through the local pool and the Ray backend on one machine
    (a local one-node Ray whose node actor adopts this run's daemon), interleaved twice;
    None when Ray is not installed. Target: ray >= 0.8x local."""
    try:
        import ray
    except ImportError:
        log("ray not installed: skipping local vs ray")
        return None
    # A throwaway local cluster: no auth token (one written to ~/.ray would turn auth on for
    # later `ray start` clusters on this machine).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(WORK / "ray"))
    try:
        rates: dict[str, list[float]] = {"local": [], "ray": []}
        for _ in range(2):
            for backend in ("local", "ray"):
                t0 = time.perf_counter()
                with SandboxPool(snap, max_concurrency=concurrency, backend=backend) as pool:
                    ok = sum(r.status == "ok" for r in pool.map(trivial_episode, range(n), progress=False))
                rates[backend].append(ok / (time.perf_counter() - t0))
    finally:
        ray.shutdown()
    local, remote = max(rates["local"]), max(rates["ray"])
    log(f"local vs ray c={concurrency}: {local:.2f} vs {remote:.2f} eps/s")
    return {"local_eps": r(local, 2), "ray_eps": r(remote, 2), "ratio": r(remote / local, 2)}


def rollbox_idle(tr: Tracker, snap: str, n: int) -> Memory:
    sbs = [tr.add(Sandbox().create_from_memory_snapshot(snap)) for _ in range(n)]
    try:
        for sb in sbs:
            first_exec_ok(sb)
        time.sleep(memory.IDLE_WAIT_S)
        return idle_memory([s.sandbox_id.removeprefix("sb-") for s in sbs], Paths.from_env().cgroup_parent)
    finally:
        tr.terminate(sbs)


def raw_idle(raw: RawRunsc, image: Path, n: int) -> Memory:
    cids: list[str] = []
    try:
        for _ in range(n):
            cids.append(raw_restore(raw, image, keep=True)[1])
        time.sleep(memory.IDLE_WAIT_S)
        return idle_memory(cids, CGROUP_PARENT)
    finally:
        for c in cids:
            raw.destroy(c)


# ---- a private daemon ------------------------------------------------------------------------

@contextlib.contextmanager
def daemon_platform(platform: str) -> Iterator[None]:
    """Restarts the bench's daemon on another gVisor platform for the block, then back."""
    paths = Paths.from_env()
    stop_daemon(paths)
    os.environ["ROLLBOX_PLATFORM"] = platform  # the SDK starts the next daemon with this
    try:
        yield
    finally:
        os.environ.pop("ROLLBOX_PLATFORM", None)
        stop_daemon(paths)


def use_private_home() -> Path:
    """Points the SDK at a fresh ROLLBOX_HOME whose base image links to the shared one.

    The SDK then autostarts a daemon of its own there, so other users of /var/lib/rollbox
    (test suites that kill and restart their daemon) neither disturb nor load this run.
    """
    (PRIVATE_HOME / "images").mkdir(parents=True, exist_ok=True)
    os.symlink(SHARED_HOME / "images" / IMAGE_ID, PRIVATE_HOME / "images" / IMAGE_ID)
    os.environ["ROLLBOX_HOME"] = str(PRIVATE_HOME)
    return PRIVATE_HOME


# ---- main ----------------------------------------------------------------------------------------

def series(name: str, n: int, fn: Callable[[], float]) -> list[float]:
    fn()  # warm-up, discarded
    out = [fn() for _ in range(n)]
    log(f"{name}: p50 {pct(out, .5):.1f} ms (n={n})")
    return out


def paired(name: str, n: int, a: Callable[[], float], b: Callable[[], float]) -> tuple[list[float], list[float]]:
    """`a` and `b` alternately, n times each (after one warm-up of each)."""
    a(), b()
    xs, ys = [], []
    for _ in range(n):
        xs.append(a())
        ys.append(b())
    log(f"{name}: p50 {pct(xs, .5):.1f} vs {pct(ys, .5):.1f} ms (n={n})")
    return xs, ys


def measure(tr: Tracker, raw: RawRunsc) -> dict[str, Any]:
    m: dict[str, Any] = {"load0": list(os.getloadavg())}
    m["others"] = host_sandbox_count()
    m["cold"] = series("rollbox cold", N_COLD, lambda: rollbox_cold(tr))
    m["raw_cold"] = series("raw cold", N_RAW_COLD, lambda: raw_cold(raw))

    base = tr.add(Sandbox(image=Image.debian()).create())
    first_exec_ok(base)
    snap = base.snapshot_memory()
    tr.snapshots.append(snap)
    image = raw_make_checkpoint(raw)

    m["restore"] = series("rollbox restore", N_RESTORE, lambda: rollbox_restore(tr, snap))
    m["raw_restore_only"] = []
    m["raw_restore"] = series("raw restore", N_RAW_RESTORE,
                              lambda: raw_restore(raw, image, restore_only=m["raw_restore_only"])[0])

    # The same restore with networking (own namespace, netstack, one exposed port).
    netbase = tr.add(Sandbox(image=Image.debian(), ports=[8000]).create())
    first_exec_ok(netbase)
    netsnap = netbase.snapshot_memory()
    tr.snapshots.append(netsnap)
    tr.terminate([netbase])
    # Interleaved with loopback-only runs, so that drift in the host's load hits both alike.
    m["net_restore"], m["restore_pair"] = paired("rollbox restore, networked vs loopback-only", N_RESTORE,
                                                 lambda: rollbox_restore(tr, netsnap), lambda: rollbox_restore(tr, snap))
    m["net_cold"], m["cold_pair"] = paired("rollbox cold, networked vs loopback-only", N_COLD,
                                           lambda: rollbox_cold(tr, ports=[8000]), lambda: rollbox_cold(tr))

    # An image made from a sandbox's files (create_image_from_filesystem): boot + first command.
    fs_src = tr.add(Sandbox(image=Image.debian()).create())
    fs_src.fs.write_file("/work/state.bin", os.urandom(1 << 20))
    fs_image = Image.from_id(fs_src.create_image_from_filesystem())
    tr.terminate([fs_src])
    m["fs_image"] = series("rollbox boot from a filesystem image", N_COLD,
                           lambda: rollbox_cold(tr, image=fs_image))

    m["warm"] = rollbox_warm(tr, snap, N_RESTORE)
    log(f"rollbox warm-pool restore: p50 {pct(m['warm'], .5):.1f} ms")

    m["exec"] = series("rollbox exec", N_EXEC, lambda: timed_ms(lambda: first_exec_ok(base))[0])
    m["http_rtt"] = series("rollbox GET sandbox (HTTP only)", N_EXEC // 2, lambda: timed_ms(base.info)[0])
    m["agent_rtt"] = series("rollbox read_file (agent, no spawn)", N_EXEC // 2,
                            lambda: timed_ms(lambda: base.fs.read_file("/etc/hostname"))[0])
    m["exec_vs_spawn"] = exec_vs_spawn(base, N_EXEC)
    log("exec `true` vs a spawn of it inside the sandbox, paired: p50 {exec:.2f} vs {spawn:.2f} ms".format(
        **{k: pct(v, .5) for k, v in m["exec_vs_spawn"].items()}))
    m["raw_exec"] = raw_exec_ms(raw, image, N_RAW_EXEC)
    m["exec_fanout"] = execs.fanout(*EXEC_FANOUT)
    log(f"exec fan-out: {m['exec_fanout']}")
    m["processes"] = processes.measure(N_PROCS)
    log(f"processes: {m['processes']}")
    log(f"raw exec: p50 {pct(m['raw_exec'], .5):.1f} ms")

    m["fork8_s"] = rollbox_fork(tr, base, FORK_N)
    log(f"fork({FORK_N}): {m['fork8_s']:.2f} s")
    tr.terminate([base])

    m["pool"] = {}
    for c, n in POOL_RUNS:
        m["pool"][c] = pool_episodes_per_s(snap, c, n)
        log(f"pool c={c}: {m['pool'][c][0]:.2f} eps/s ({m['pool'][c][1]} not ok)")
    m["ray"] = ray_vs_local(snap) if RAY_ROW else None  # full mode: ~15 s of Ray start-up
    m["raw_eps"] = {}
    for c, n in RAW_EPISODE_RUNS:
        m["raw_eps"][c] = raw_episodes_per_s(raw, image, c, n)
        log(f"raw episodes c={c}: {m['raw_eps'][c]:.2f} eps/s")

    if NET_CYCLES:
        m["net_churn"] = net_churn(NET_CYCLES)
        log(f"network churn: {m['net_churn']}")
    m["idle"] = rollbox_idle(tr, snap, IDLE_N)
    m["raw_idle"] = raw_idle(raw, image, IDLE_N)
    log(f"idle: rollbox {m['idle']}, raw {m['raw_idle']}")
    measure_tiers(tr, m, raw, image, snap)
    return m


def measure_tiers(tr: Tracker, m: dict[str, Any], raw: RawRunsc, image: Path, snap: str) -> None:
    """The tier table (bench/scale.py) and, in full mode, the scale tests."""
    m["warm_acquire"] = scale.warm_acquire(snap, N_WARM_ACQUIRE)
    tiers = m["tiers"] = {}
    tiers["gvisor"] = scale.pool_tier("rollbox gVisor (snapshot)", snap, TIER_POOL_RUNS, m["restore"], warm=False)
    tiers["gvisor"].idle_mib = m["idle"].pss_mib
    tiers["warm"] = scale.pool_tier("rollbox warm pool", snap, TIER_POOL_RUNS, m["warm"], warm=True)
    tiers["warm"].idle_mib = m["idle"].pss_mib
    tiers["runc"] = scale.runc_tier(TIER_RUNS, N_TIER_TTFC)
    tiers["raw_runsc"] = scale.Tier("raw runsc restore", ttfc_ms=list(m["raw_restore"]),
                                    eps=dict(m["raw_eps"]), idle_mib=m["raw_idle"].pss_mib)
    rr = scale.RawRunc(WORK, IMAGE_ROOTFS, CGROUP_PARENT)
    tiers["raw_runc"] = scale.raw_runc_tier(rr, TIER_RUNS, N_TIER_TTFC)
    tiers["subprocess"] = scale.subprocess_tier(TIER_RUNS, N_TIER_TTFC)
    if SCALE_TESTS:
        m["admission"] = scale.admission(snap, *ADMISSION)
        m["density"] = scale.idle_density(snap, **DENSITY)
        # The same with auto-pause (server/autopause.py): idle sandboxes paused to disk after 2 s.
        m["density_autopause"] = scale.idle_density(snap, auto_pause_seconds=2, wall_s=900, **DENSITY)
        # The same on the ptrace platform, whose idle sandboxes sleep (systrap's spin ~5% of a
        # core each, google/gvisor#10793): a fresh daemon and snapshot, since a checkpoint
        # restores on the platform it was taken on.
        with daemon_platform("ptrace"):
            m["idle_ptrace"] = rollbox_idle(tr, ptrace_snap := tr.snap_of_fresh_sandbox(), IDLE_N)
            log(f"idle on ptrace: {m['idle_ptrace']}")
            m["density_ptrace"] = scale.idle_density(ptrace_snap, **DENSITY)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer samples and no churn (~1-2 min; noisier)")
    ap.add_argument("--smoke", action="store_true",
                    help="every step of the full run at toy sizes (~3 min): checks the script, measures nothing")
    ap.add_argument("--shared-daemon", action="store_true",
                    help="use the daemon of ROLLBOX_HOME (default /var/lib/rollbox) instead of a private one")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick or args.smoke:
        global N_COLD, N_RESTORE, N_EXEC, N_RAW_EXEC, N_RAW_RESTORE, N_RAW_COLD, POOL_RUNS, RAW_EPISODE_RUNS
        global NET_CYCLES, IDLE_N
        N_COLD, N_RESTORE, N_EXEC, N_RAW_EXEC, N_RAW_RESTORE, N_RAW_COLD = 4, 8, 40, 10, 8, 4
        POOL_RUNS, RAW_EPISODE_RUNS, IDLE_N = ((1, 6), (4, 12)), ((1, 6), (4, 8)), 4
        global EXEC_FANOUT, N_PROCS
        EXEC_FANOUT, N_PROCS = (8, 64, 400), 20
        global TIER_RUNS, TIER_POOL_RUNS, N_TIER_TTFC, N_WARM_ACQUIRE, SCALE_TESTS
        TIER_RUNS, TIER_POOL_RUNS = [(1, 4), (4, 8), (16, 16), (64, 64)], [(1, 4), (4, 8), (16, 16)]
        memory.IDLE_CPU_WINDOW_S = 3.0
        N_TIER_TTFC, N_WARM_ACQUIRE, SCALE_TESTS = 6, 8, False
        global RAY_ROW
        RAY_ROW = False
        NET_CYCLES = int(os.environ.get("ROLLBOX_BENCH_NET_CYCLES", "0"))
    if args.smoke:
        global ADMISSION, DENSITY
        N_COLD, N_RESTORE, N_EXEC, N_RAW_EXEC, N_RAW_RESTORE, N_RAW_COLD = 2, 2, 4, 2, 2, 2
        POOL_RUNS, RAW_EPISODE_RUNS, IDLE_N, EXEC_FANOUT = ((1, 2), (4, 4)), ((1, 2),), 2, (2, 4, 8)
        N_PROCS = 5
        TIER_RUNS, TIER_POOL_RUNS, N_TIER_TTFC, N_WARM_ACQUIRE = [(1, 2), (4, 4)], [(1, 2), (4, 4)], 2, 2
        SCALE_TESTS, RAY_ROW, NET_CYCLES = True, True, 4
        ADMISSION, DENSITY = (8, 4), {"limit": 4, "batch": 2}
    if os.geteuid() != 0:
        print("bench: run as root (runsc, overlay mounts and cgroups need it)", file=sys.stderr)
        return 2
    if WORK.exists():
        unmount_under(WORK)
        shutil.rmtree(WORK, ignore_errors=True)
    RAW_ROOT.mkdir(parents=True, exist_ok=True)
    home = None if args.shared_daemon else use_private_home()
    reaper = OrphanReaper().start()
    tr, raw = Tracker(), RawRunsc()
    t0 = time.perf_counter()
    log(f"rollbox daemon home: {os.environ.get('ROLLBOX_HOME', SHARED_HOME)}")
    try:
        m = measure(tr, raw)
        from bench.humaneval import run_section
        he = run_section([8] if args.quick or args.smoke else [1, 4, 8], limit=16 if args.smoke else None)
    finally:
        tr.cleanup()
        raw.destroy_all()
        remove_cgroups()
        if home is not None:
            stop_daemon(Paths(home))
        reaper.stop()
        unmount_under(WORK)
        shutil.rmtree(WORK, ignore_errors=True)
    log(f"done in {time.perf_counter() - t0:.0f} s")
    res = build_results(m)
    print_table(res, m, fork_n=FORK_N, idle_n=IDLE_N, pool_runs=POOL_RUNS)
    res.update({k: v for k, v in he.items() if k != "humaneval_rows"})
    print(json.dumps(res, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
