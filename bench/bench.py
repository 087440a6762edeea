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
3. Exec round trip of `true` in a warm sandbox (rollbox: agent over FIFOs; raw: `runsc exec`).
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
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.client.transport import stop_daemon
from rollbox.config import Paths
from rollbox.errors import RollboxError
from rollbox.runtime.bundle import BundleSpec, oci_spec
from rollbox.runtime.reaper import Reaper, become_subreaper
from rollbox.sdk.image import Image
from rollbox.sdk.pool import SandboxPool
from rollbox.sdk.sandbox import Sandbox, SandboxInstance, default_client
from rollbox.server import inventory

from . import execs, processes, scale
from .stats import pct

SHARED_HOME = Path("/var/lib/rollbox")
IMAGE_ID = "im-debian-bookworm"
IMAGE_ROOTFS = SHARED_HOME / "images" / IMAGE_ID / "rootfs"
# ROLLBOX_BENCH_WORK: a private work directory (and cgroup parent), so that two benches on one
# machine do not remove each other's raw containers.
WORK = Path(os.environ.get("ROLLBOX_BENCH_WORK", "/tmp/rollbox-bench"))
PRIVATE_HOME = WORK / "home"
RAW_ROOT = WORK / "runsc"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "rollbox-bench" + ("-" + WORK.name if "ROLLBOX_BENCH_WORK" in os.environ else "")
RAW_ARGS = ["/usr/bin/python3", "-S", "-c", "import time\nwhile True: time.sleep(3600)"]
RUNSC_FLAGS = ["--platform=systrap", "--network=none", "--overlay2=none"]

N_COLD, N_RESTORE, N_EXEC, N_RAW_EXEC, N_RAW_RESTORE, N_RAW_COLD = 10, 20, 100, 20, 20, 10
FORK_N, IDLE_N, IDLE_WAIT_S, IDLE_CPU_WINDOW_S = 8, 8, 2.0, 5.0
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
TARGETS = {"restore_ttfc_p50_ms": ("<=", 100.0), "ttfc_p99_ms": ("<=", 250.0),
           "warm_acquire_p50_ms": ("<=", 5.0), "restore_overhead_ratio": ("<=", 1.1),
           "exec_p50_ms": ("<=", 5.0), "idle_mib": ("<=", 20.0), "net_restore_extra_ms": ("<=", 20.0),
           "fs_image_boot_p50_ms": ("<", 1000.0), "episodes_per_s": (">=", 20.0),
           "runc_episodes_per_s": (">=", 100.0), "max_idle_sandboxes": (">=", 500.0)}


# ---- statistics --------------------------------------------------------------------------

def timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---- reaping orphaned raw sandboxes --------------------------------------------------------

class OrphanReaper:
    """Reaps adopted runsc sandbox/gofer processes (comm `exe`), never our own subprocesses."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), daemon=True, name="bench-reaper")

    def start(self) -> "OrphanReaper":
        if become_subreaper():
            self._thread.start()
        return self

    def _loop(self, interval_s: float) -> None:
        reaper = Reaper()  # its sweep reaps only adopted runsc processes, never our subprocesses
        while not self._stop.wait(interval_s):
            reaper.sweep()

    def stop(self) -> None:
        self._stop.set()


# ---- raw runsc baseline --------------------------------------------------------------------

@dataclass
class RawRunsc:
    """Raw runsc containers under their own --root, each on its own overlay over the image."""

    binary: str = field(default_factory=lambda: shutil.which("runsc") or "runsc")
    live: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def argv(self, *verb: str) -> list[str]:
        return [self.binary, "--root", str(RAW_ROOT), *RUNSC_FLAGS, *verb]

    def run(self, *verb: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        res = subprocess.run(self.argv(*verb), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"runsc {' '.join(verb)}: exit {res.returncode}: {res.stderr.decode()[-500:]}")
        return res

    @staticmethod
    def new_id() -> str:
        return "rb" + secrets.token_hex(11)  # 24 chars, fixed length: no id prefixes another

    def prepare(self, cid: str) -> Path:
        """Bundle dir with a fresh overlay rootfs and config.json; returns the bundle path."""
        with self.lock:
            self.live.add(cid)
        d = WORK / "bundles" / cid
        for sub in ("upper", "work", "rootfs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        opts = f"lowerdir={IMAGE_ROOTFS},upperdir={d / 'upper'},workdir={d / 'work'}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(d / "rootfs")], check=True)
        spec = oci_spec(BundleSpec(rootfs=d / "rootfs", cgroup_path=f"/{CGROUP_PARENT}/{cid}", cpu=1.0,
                                   memory_mib=1024))
        spec["process"]["args"] = RAW_ARGS  # type: ignore[index]
        (d / "config.json").write_text(json.dumps(spec))
        return d

    def start_detached(self, verb: str, cid: str, bundle: Path, *extra: str) -> None:
        """`runsc run|restore -detach`: stdin /dev/null, output to a file, own session."""
        with open(bundle / "runsc.log", "ab") as logf:
            rc = subprocess.run(self.argv(verb, "-detach", *extra, "--bundle", str(bundle), cid),
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                timeout=60).returncode
        if rc != 0:
            tail = (bundle / "runsc.log").read_bytes()[-500:].decode(errors="replace")
            raise RuntimeError(f"runsc {verb} {cid}: exit {rc}: {tail}")

    def exec_true(self, cid: str) -> None:
        self.run("exec", cid, "true")

    def checkpoint(self, cid: str, image_dir: Path) -> None:
        image_dir.mkdir(parents=True, exist_ok=True)
        self.run("checkpoint", "--image-path", str(image_dir), "--compression=none", cid, timeout=120)

    def destroy(self, cid: str) -> None:
        """delete -force, unmount, remove the bundle dir and the container's cgroups."""
        self.run("delete", "-force", cid, check=False)
        d = WORK / "bundles" / cid
        if (d / "rootfs").is_dir():
            if subprocess.run(["umount", str(d / "rootfs")], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(d / "rootfs")], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
        remove_cgroups(cid)
        with self.lock:
            self.live.discard(cid)

    def destroy_all(self) -> None:
        for cid in list(self.live):
            try:
                self.destroy(cid)
            except Exception as e:  # noqa: BLE001 - best-effort cleanup
                log(f"cleanup of raw {cid} failed: {e}")


def unmount_under(root: Path) -> None:
    """Lazily unmounts anything still mounted below `root` (deepest first)."""
    with open("/proc/self/mounts") as f:
        targets = [line.split()[1] for line in f]
    for t in sorted((t for t in targets if t.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", t], capture_output=True)


def remove_cgroups(cid: str | None = None) -> None:
    """Removes */rollbox-bench/<cid> (or the whole */rollbox-bench tree when cid is None)."""
    for ctl in CGROUP_ROOT.iterdir():
        base = ctl / CGROUP_PARENT
        top = base / cid if cid else base
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]
        for d in dirs:
            try:
                d.rmdir()
            except OSError:
                pass


def raw_cold(raw: RawRunsc) -> float:
    cid = raw.new_id()
    bundle = raw.prepare(cid)
    try:
        t0 = time.perf_counter()
        raw.start_detached("run", cid, bundle)
        raw.exec_true(cid)
        return (time.perf_counter() - t0) * 1000
    finally:
        raw.destroy(cid)


def raw_make_checkpoint(raw: RawRunsc) -> Path:
    """Checkpoint of an idle python3 container (uncompressed, as rollbox does)."""
    cid = raw.new_id()
    bundle = raw.prepare(cid)
    image = WORK / "checkpoint"
    try:
        raw.start_detached("run", cid, bundle)
        raw.exec_true(cid)
        time.sleep(1.0)  # let python3 reach its sleep
        raw.checkpoint(cid, image)
    finally:
        raw.destroy(cid)
    return image


def raw_restore(raw: RawRunsc, image: Path, keep: bool = False,
                restore_only: list[float] | None = None) -> tuple[float, str]:
    """(ms of restore -detach + exec true, cid); destroys the container unless keep.

    With `restore_only`, the ms of `restore -detach` alone is appended to it.
    """
    cid = raw.new_id()
    bundle = raw.prepare(cid)
    try:
        t0 = time.perf_counter()
        raw.start_detached("restore", cid, bundle, "--image-path", str(image))
        t1 = time.perf_counter()
        raw.exec_true(cid)
        t2 = time.perf_counter()
    except BaseException:
        raw.destroy(cid)
        raise
    if restore_only is not None:
        restore_only.append((t1 - t0) * 1000)
    if not keep:
        raw.destroy(cid)
    return (t2 - t0) * 1000, cid


def raw_episode(raw: RawRunsc, image: Path) -> bool:
    """One raw episode: prepare, restore, exec, delete (all inside the caller's clock)."""
    _, cid = raw_restore(raw, image, keep=True)
    raw.destroy(cid)
    return True


def raw_episodes_per_s(raw: RawRunsc, image: Path, concurrency: int, n: int) -> float:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        ok = sum(ex.map(lambda _i: raw_episode(raw, image), range(n)))
    return ok / (time.perf_counter() - t0)


def raw_exec_ms(raw: RawRunsc, image: Path, n: int) -> list[float]:
    _, cid = raw_restore(raw, image, keep=True)
    try:
        raw.exec_true(cid)
        return [timed_ms(lambda: raw.exec_true(cid))[0] for _ in range(n)]
    finally:
        raw.destroy(cid)


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


# ---- memory ------------------------------------------------------------------------------------

def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _ppid(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def _pss_kib(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def sandbox_pids(cids: Iterable[str]) -> set[str]:
    """runsc-sandbox/-gofer pids whose cmdline names a cid, plus all sandbox descendants."""
    want = [c.encode() for c in cids]
    procs = [p for p in os.listdir("/proc") if p.isdigit()]
    parent = {p: _ppid(p) for p in procs}
    found = set()
    for p in procs:
        cmd = _cmdline(p)
        if cmd.startswith((b"runsc-sandbox", b"runsc-gofer")) and any(c in cmd for c in want):
            found.add(p)
    grew = True
    while grew:
        kids = {p for p, pp in parent.items() if pp in found and p not in found}
        found |= kids
        grew = bool(kids)
    return found


def host_sandbox_count() -> int:
    """runsc sandboxes running on this host (anyone's): a hint of competing load."""
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).startswith(b"runsc-sandbox"))


def cgroup_usage_bytes(parent: str, cid: str) -> int:
    try:
        return int((CGROUP_ROOT / "memory" / parent / cid / "memory.usage_in_bytes").read_text())
    except (OSError, ValueError):
        return 0


def _cpu_ticks(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass(frozen=True)
class Memory:
    pss_mib: float
    cgroup_mib: float
    procs: int
    cpu_pct: float = 0.0  # % of one core per idle sandbox (utime+stime over IDLE_CPU_WINDOW_S)


def idle_memory(cids: list[str], cgroup_parent: str) -> Memory:
    pids = sandbox_pids(cids)
    t0 = sum(_cpu_ticks(p) for p in pids)
    time.sleep(IDLE_CPU_WINDOW_S)
    used_s = (sum(_cpu_ticks(p) for p in pids) - t0) / os.sysconf("SC_CLK_TCK")
    pss = sum(_pss_kib(p) for p in pids) / 1024 / len(cids)
    cg = sum(cgroup_usage_bytes(cgroup_parent, c) for c in cids) / 2**20 / len(cids)
    return Memory(pss, cg, len(pids), 100 * used_s / IDLE_CPU_WINDOW_S / len(cids))


def rollbox_idle(tr: Tracker, snap: str, n: int) -> Memory:
    sbs = [tr.add(Sandbox().create_from_memory_snapshot(snap)) for _ in range(n)]
    try:
        for sb in sbs:
            first_exec_ok(sb)
        time.sleep(IDLE_WAIT_S)
        return idle_memory([s.sandbox_id.removeprefix("sb-") for s in sbs], Paths.from_env().cgroup_parent)
    finally:
        tr.terminate(sbs)


def raw_idle(raw: RawRunsc, image: Path, n: int) -> Memory:
    cids: list[str] = []
    try:
        for _ in range(n):
            cids.append(raw_restore(raw, image, keep=True)[1])
        time.sleep(IDLE_WAIT_S)
        return idle_memory(cids, CGROUP_PARENT)
    finally:
        for c in cids:
            raw.destroy(c)


# ---- report ------------------------------------------------------------------------------------

def r(x: float, nd: int = 1) -> float:
    return round(x, nd)


def _met(value: float, op: str, target: float) -> bool:
    return bool({"<=": value <= target, "<": value < target, ">=": value >= target}[op])


def build_results(m: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {
        "cold_ttfc_p50_ms": r(pct(m["cold"], .5)), "cold_ttfc_p99_ms": r(pct(m["cold"], .99)),
        "raw_runsc_cold_p50_ms": r(pct(m["raw_cold"], .5)),
        "restore_ttfc_p50_ms": r(pct(m["restore"], .5)), "restore_ttfc_p99_ms": r(pct(m["restore"], .99)),
        "raw_runsc_restore_p50_ms": r(pct(m["raw_restore"], .5)),
        "raw_runsc_restore_only_p50_ms": r(pct(m["raw_restore_only"][1:], .5)),
        "restore_overhead_ratio": r(pct(m["restore"], .5) / pct(m["raw_restore"], .5), 2),
        "warm_restore_ttfc_p50_ms": r(pct(m["warm"], .5)), "warm_restore_ttfc_p99_ms": r(pct(m["warm"], .99)),
        "exec_p50_ms": r(pct(m["exec"], .5), 2), "exec_p99_ms": r(pct(m["exec"], .99), 2),
        "raw_runsc_exec_p50_ms": r(pct(m["raw_exec"], .5), 1),
        "http_rtt_p50_ms": r(pct(m["http_rtt"], .5), 2), "agent_rtt_p50_ms": r(pct(m["agent_rtt"], .5), 2),
        "fork8_s": r(m["fork8_s"], 2), "exec_fanout": m["exec_fanout"],
        "net_restore_ttfc_p50_ms": r(pct(m["net_restore"], .5)),
        "net_cold_ttfc_p50_ms": r(pct(m["net_cold"], .5)),
        "net_restore_extra_ms": r(pct(m["net_restore"], .5) - pct(m["restore_pair"], .5)),
        "net_cold_extra_ms": r(pct(m["net_cold"], .5) - pct(m["cold_pair"], .5)),
        "net_churn": m.get("net_churn"),
        "fs_image_boot_p50_ms": r(pct(m["fs_image"], .5)),
        "processes": m["processes"],
    }
    for c, (eps, _bad) in m["pool"].items():
        res[f"episodes_per_s_c{c}"] = r(eps, 2)
    res["episodes_per_s"] = max(res[f"episodes_per_s_c{c}"] for c in m["pool"])
    res["episode_failures"] = sum(bad for _eps, bad in m["pool"].values())
    for c, eps in m["raw_eps"].items():
        res[f"raw_runsc_episodes_per_s_c{c}"] = r(eps, 2)
    res["idle_mib"] = r(m["idle"].pss_mib)
    res["idle_cgroup_mib"] = r(m["idle"].cgroup_mib)
    res["raw_runsc_idle_mib"] = r(m["raw_idle"].pss_mib)
    res["raw_runsc_idle_cgroup_mib"] = r(m["raw_idle"].cgroup_mib)
    res["idle_cpu_pct"] = r(m["idle"].cpu_pct, 2)
    res["raw_runsc_idle_cpu_pct"] = r(m["raw_idle"].cpu_pct, 2)
    if m.get("idle_ptrace"):
        res["ptrace_idle_mib"] = r(m["idle_ptrace"].pss_mib)
        res["ptrace_idle_cpu_pct"] = r(m["idle_ptrace"].cpu_pct, 2)
    tiers = m["tiers"]
    res["tiers"] = {k: t.row() for k, t in tiers.items()}
    wa = m["warm_acquire"]
    res["ttfc_p50_ms"], res["ttfc_p99_ms"] = res["restore_ttfc_p50_ms"], res["restore_ttfc_p99_ms"]
    res["warm_acquire_p50_ms"] = r(pct(wa["acquire_ms"], .5), 2)
    res["warm_acquire_daemon_p50_ms"] = r(pct(wa["daemon_ms"], .5), 2)
    res["warm_first_exec_p50_ms"] = r(pct(wa["first_exec_ms"], .5), 2)
    res["episodes_per_s"] = r(max(max(tiers["gvisor"].eps.values()), res["episodes_per_s"]), 2)
    res["runc_episodes_per_s"] = r(max(tiers["runc"].eps.values()), 2)
    sub_eps = max(tiers["subprocess"].eps.values())
    res["ratio_ttfc_vs_raw_runsc"] = res["restore_overhead_ratio"]
    res["ratio_ttfc_vs_no_isolation"] = r(pct(m["restore"], .5) / pct(tiers["subprocess"].ttfc_ms, .5), 1)
    res["ratio_eps_vs_no_isolation"] = r(res["episodes_per_s"] / sub_eps, 4)
    res["ratio_runc_eps_vs_no_isolation"] = r(res["runc_episodes_per_s"] / sub_eps, 4)
    res["ratio_runc_ttfc_vs_raw_runc"] = r(pct(tiers["runc"].ttfc_ms, .5) / pct(tiers["raw_runc"].ttfc_ms, .5), 2)
    if m.get("admission"):
        res["admission"] = m["admission"]
    if m.get("density"):
        # The best platform's count; each platform's run is kept beside it.
        res["density"] = {"systrap": m["density"], "ptrace": m.get("density_ptrace")}
        res["max_idle_sandboxes_systrap"] = m["density"]["max_idle_sandboxes"]
        res["max_idle_sandboxes_ptrace"] = (m.get("density_ptrace") or {}).get("max_idle_sandboxes")
        res["max_idle_sandboxes"] = max(res["max_idle_sandboxes_systrap"], res["max_idle_sandboxes_ptrace"] or 0)
    else:
        res["max_idle_sandboxes"] = None  # full mode only
    res["targets"] = {k: {"target": f"{op} {v:g}", "value": res[k], "met": _met(res[k], op, v)}
                      for k, (op, v) in TARGETS.items() if res.get(k) is not None}
    res["all_targets_met"] = all(t["met"] for t in res["targets"].values())
    res["host"] = {"cores": os.cpu_count(), "loadavg_start": m["load0"], "loadavg_end": list(os.getloadavg()),
                   "other_runsc_sandboxes_at_start": m["others"]}
    return res


def print_tier_table(res: dict[str, Any]) -> None:
    """The one table of tiers: TTFC, episodes/s per concurrency, idle PSS, CPU per episode."""
    names = {"gvisor": "rollbox gVisor from snapshot", "warm": "rollbox warm pool", "runc": "rollbox runc tier",
             "raw_runsc": "raw runsc restore", "raw_runc": "raw runc run", "subprocess": "subprocess (no isolation)"}
    concs = sorted({int(k[5:]) for t in res["tiers"].values() for k in t if k.startswith("eps_c")})
    head = ["tier", "TTFC p50 ms", "TTFC p99 ms", *[f"eps c={c}" for c in concs], "idle MiB", "CPU s/ep"]
    rows = []
    for key, t in res["tiers"].items():
        rows.append([names.get(key, key), f"{t['ttfc_p50_ms']}", f"{t['ttfc_p99_ms']}",
                     *[str(t.get(f"eps_c{c}", "-")) for c in concs],
                     "-" if t["idle_mib"] is None else str(t["idle_mib"]),
                     "-" if t["cpu_s_per_episode"] is None else str(t["cpu_s_per_episode"])])
    w = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    line = "  ".join("{:<%d}" % n for n in w)
    print(line.format(*head))
    print(line.format(*("-" * n for n in w)))
    for row in rows:
        print(line.format(*row))
    print(f"ratios: TTFC rollbox/raw runsc {res['ratio_ttfc_vs_raw_runsc']}, rollbox/no isolation "
          f"{res['ratio_ttfc_vs_no_isolation']}; eps gVisor/no isolation {res['ratio_eps_vs_no_isolation']}, "
          f"runc/no isolation {res['ratio_runc_eps_vs_no_isolation']}; runc TTFC rollbox/raw runc "
          f"{res['ratio_runc_ttfc_vs_raw_runc']}")
    print(f"warm acquire p50 {res['warm_acquire_p50_ms']} ms (daemon hand-out {res['warm_acquire_daemon_p50_ms']} ms), "
          f"then first exec {res['warm_first_exec_p50_ms']} ms")
    if res.get("admission"):
        a = res["admission"]
        print(f"admission {a['episodes']} episodes @ {a['concurrency']}: {a['statuses']} in {a['seconds']} s; "
              f"TTFC p50 by decile {a['ttfc_p50_ms_by_decile']}")
    for platform, d in (res.get("density") or {}).items():
        if d:
            print(f"idle density ({platform}): {d['max_idle_sandboxes']} idle sandboxes before start latency "
                  f"doubled (stopped by {d['stopped_by']}; batches {[(b['n'], b['ttfc_p50_ms']) for b in d['batches']]})")
    print()


def print_table(res: dict[str, Any], m: dict[str, Any]) -> None:
    print_tier_table(res)
    rows: list[tuple[str, str, str, str]] = [
        ("cold TTFC p50 / p99 (ms)", f"{res['cold_ttfc_p50_ms']} / {res['cold_ttfc_p99_ms']}",
         f"{res['raw_runsc_cold_p50_ms']}", "raw: run -detach + exec true"),
        ("restore TTFC p50 / p99 (ms)", f"{res['restore_ttfc_p50_ms']} / {res['restore_ttfc_p99_ms']}",
         f"{res['raw_runsc_restore_p50_ms']}", "raw: restore -detach + exec true (mount excluded)"),
        ("  raw restore -detach alone (ms)", "-", f"{res['raw_runsc_restore_only_p50_ms']}", "p50, no exec"),
        ("restore overhead ratio", f"{res['restore_overhead_ratio']}", "1.0", "rollbox p50 / raw p50"),
        ("warm-pool TTFC p50 / p99 (ms)", f"{res['warm_restore_ttfc_p50_ms']} / {res['warm_restore_ttfc_p99_ms']}",
         "-", "4 spares restored ahead; acquire + exec true"),
        ("exec `true` p50 / p99 (ms)", f"{res['exec_p50_ms']} / {res['exec_p99_ms']}",
         f"{res['raw_runsc_exec_p50_ms']}", "rollbox: agent FIFO; raw: runsc exec"),
        ("  of which HTTP / agent RTT (ms)", f"{res['http_rtt_p50_ms']} / {res['agent_rtt_p50_ms']}", "-",
         "GET /sandboxes/ID; fs.read_file (no spawn)"),
        ("exec fan-out execs/s, p50 / p99 (ms)", "{execs_per_s}, {p50_ms} / {p99_ms}".format(**res["exec_fanout"]), "-",
         "echo 1, {concurrency} at once across {sandboxes} sandboxes; {failed} failed".format(**res["exec_fanout"])),
        *processes.rows(res["processes"]),
        (f"fork({FORK_N}) wall (s)", f"{res['fork8_s']}", "-", ""),
        ("restore TTFC p50, networked (ms)", f"{res['net_restore_ttfc_p50_ms']}", "-",
         f"+{res['net_restore_extra_ms']} ms over loopback-only, interleaved (target <= 20)"),
        ("cold TTFC p50, networked (ms)", f"{res['net_cold_ttfc_p50_ms']}", "-",
         f"+{res['net_cold_extra_ms']} ms over loopback-only, interleaved"),
        ("boot from filesystem image p50 (ms)", f"{res['fs_image_boot_p50_ms']}", "-",
         "create_image_from_filesystem, then create + exec true (target < 1000)"),
    ]
    if res.get("net_churn"):
        c = res["net_churn"]
        rows.append((f"network churn ({c['cycles']} cycles)", f"leaked {c['leaked']}", "-",
                     f"{c['seconds']} s; netns {c['netns']}, links {c['links']}, nft {c['nft_elements']}, "
                     f"listeners {c['listeners']} (ready pool {c['ready']})"))
    for c, n in POOL_RUNS:
        raw = res.get(f"raw_runsc_episodes_per_s_c{c}")
        rows.append((f"episodes/s c={c} ({n} eps)", f"{res[f'episodes_per_s_c{c}']}",
                     "-" if raw is None else f"{raw}", "raw: mount+restore+exec+delete"))
    if m.get("ray"):
        rows.append(("episodes/s c=4, local vs Ray", f"{m['ray']['local_eps']} vs {m['ray']['ray_eps']}", "-",
                     f"ratio {m['ray']['ratio']} (target >= 0.8)"))
    rows += [
        (f"idle MiB/sandbox PSS ({IDLE_N})", f"{res['idle_mib']}", f"{res['raw_runsc_idle_mib']}",
         f"procs: {m['idle'].procs} vs {m['raw_idle'].procs}"),
        ("idle MiB/sandbox memcg", f"{res['idle_cgroup_mib']}", f"{res['raw_runsc_idle_cgroup_mib']}",
         "usage_in_bytes, page cache incl."),
        ("idle CPU % of a core/sandbox", f"{res['idle_cpu_pct']}", f"{res['raw_runsc_idle_cpu_pct']}",
         f"systrap, over {IDLE_CPU_WINDOW_S:g} s"),
    ]
    if "ptrace_idle_cpu_pct" in res:
        rows.append(("  on ptrace: idle CPU % / PSS MiB", f"{res['ptrace_idle_cpu_pct']} / {res['ptrace_idle_mib']}",
                     "-", "ROLLBOX_PLATFORM=ptrace"))
    head = ("metric", "rollbox", "raw runsc", "note")
    w = [max(len(x[i]) for x in [head, *rows]) for i in range(4)]
    line = "  ".join("{:<%d}" % n for n in w)
    print(line.format(*head))
    print(line.format(*("-" * n for n in w)))
    for row in rows:
        print(line.format(*row))
    print()
    for k, t in res["targets"].items():
        print(f"target {k} {t['target']}: {t['value']} -> {'MET' if t['met'] else 'MISSED'}")
    print(f"host: {res['host']}")
    if res["episode_failures"]:
        print(f"WARNING: {res['episode_failures']} pool episodes did not finish ok")


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
        global TIER_RUNS, TIER_POOL_RUNS, N_TIER_TTFC, N_WARM_ACQUIRE, SCALE_TESTS, IDLE_CPU_WINDOW_S
        TIER_RUNS, TIER_POOL_RUNS = [(1, 4), (4, 8), (16, 16), (64, 64)], [(1, 4), (4, 8), (16, 16)]
        IDLE_CPU_WINDOW_S = 3.0
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
    print_table(res, m)
    res.update({k: v for k, v in he.items() if k != "humaneval_rows"})
    print(json.dumps(res, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
