"""The raw gVisor baseline of bench.bench: `runsc` driven directly (run, restore, exec, delete)
with the bundle, flags and checkpoint kind rollbox uses, and the reaping of the raw sandboxes
the bench orphans."""

from __future__ import annotations

import concurrent.futures as cf
import json
import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollbox.runtime.bundle import BundleSpec, oci_spec
from rollbox.runtime.reaper import Reaper, become_subreaper


from .common import CGROUP_PARENT, CGROUP_ROOT, IMAGE_ROOTFS, RAW_ARGS, RAW_ROOT, RUNSC_FLAGS, WORK, log, timed_ms

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
    platform: str = "systrap"  # gVisor's: the same as the rollbox rows it is compared with
    live: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def argv(self, *verb: str) -> list[str]:
        flags = [f"--platform={self.platform}" if f.startswith("--platform=") else f for f in RUNSC_FLAGS]
        return [self.binary, "--root", str(RAW_ROOT), *flags, *verb]

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


