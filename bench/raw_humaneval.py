"""The raw HumanEval baselines: per program one `runsc restore` of an idle python3
checkpoint into a fresh overlay, `runsc exec ... python3 -c PROGRAM`, then `runsc delete`
(bench.bench's RawRunsc: the runsc flags, bundle and checkpoint kind rollbox uses); and per
program one `runc run` of `python3 -c PROGRAM` on a fresh overlay of the base image
(bench.scale's RawRunc, the tier table's raw runc row)."""

from __future__ import annotations

import concurrent.futures as cf
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import WORK
from bench.raw import OrphanReaper, RawRunsc, remove_cgroups

TIMEOUT_S = 10.0


def make_checkpoint(raw: RawRunsc) -> Path:
    """Checkpoint of an idle python3 container (uncompressed, as rollbox does), in a directory
    of its own (bench.bench's rows keep theirs)."""
    cid = raw.new_id()
    bundle = raw.prepare(cid)
    image = WORK / "humaneval-checkpoint"
    shutil.rmtree(image, ignore_errors=True)  # an earlier run's (runsc refuses to overwrite it)
    try:
        raw.start_detached("run", cid, bundle)
        raw.run("exec", cid, "true")
        time.sleep(1.0)  # let python3 reach its sleep
        raw.checkpoint(cid, image)
    finally:
        raw.destroy(cid)
    return image


def run_raw_runsc(platform: str = "systrap") -> Callable[[list[str], int], list[tuple[bool, float]]]:
    state: dict[str, object] = {}

    def one(raw: RawRunsc, image: Path, program: str) -> tuple[bool, float]:
        t = time.perf_counter()
        cid = raw.new_id()
        bundle = raw.prepare(cid)
        try:
            raw.start_detached("restore", cid, bundle, "--image-path", str(image))
            res = raw.run("exec", cid, "python3", "-c", program, timeout=TIMEOUT_S + 20, check=False)
            ok = res.returncode == 0
        finally:
            raw.destroy(cid)
        return ok, (time.perf_counter() - t) * 1000

    def run(progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        if "raw" not in state:
            state["reaper"] = OrphanReaper().start()
            raw = RawRunsc(platform=platform)
            state["raw"] = raw
            state["image"] = make_checkpoint(raw)
        raw, image = state["raw"], state["image"]
        try:
            with cf.ThreadPoolExecutor(concurrency) as ex:
                return list(ex.map(lambda p: one(raw, image, p), progs))  # type: ignore[arg-type]
        finally:
            raw.destroy_all()  # type: ignore[attr-defined]
            remove_cgroups()
    return run


def run_raw_runc() -> Callable[[list[str], int], list[tuple[bool, float]]]:
    from bench.common import CGROUP_PARENT, IMAGE_ROOTFS
    from bench.scale import RawRunc

    rr = RawRunc(WORK, IMAGE_ROOTFS, CGROUP_PARENT)

    def one(program: str) -> tuple[bool, float]:
        ms, status = rr.run(["python3", "-c", program], timeout=TIMEOUT_S + 20)
        return status == 0, ms

    def run(progs: list[str], concurrency: int) -> list[tuple[bool, float]]:
        try:
            with cf.ThreadPoolExecutor(concurrency) as ex:
                return list(ex.map(one, progs))
        finally:
            remove_cgroups()
    return run
