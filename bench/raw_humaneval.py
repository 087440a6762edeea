"""The raw-runsc HumanEval baseline: per program one `runsc restore` of an idle python3
checkpoint into a fresh overlay, `runsc exec ... python3 -c PROGRAM`, then `runsc delete`
(bench.bench's RawRunsc: the runsc flags, bundle and checkpoint kind rollbox uses)."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from pathlib import Path

from bench.bench import OrphanReaper, RawRunsc, raw_make_checkpoint, remove_cgroups

TIMEOUT_S = 10.0


def run_raw_runsc() -> Callable[[list[str], int], list[tuple[bool, float]]]:
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
            OrphanReaper().start()
            raw = RawRunsc()
            state["raw"] = raw
            state["image"] = raw_make_checkpoint(raw)
        raw, image = state["raw"], state["image"]
        try:
            with cf.ThreadPoolExecutor(concurrency) as ex:
                return list(ex.map(lambda p: one(raw, image, p), progs))  # type: ignore[arg-type]
        finally:
            raw.destroy_all()  # type: ignore[attr-defined]
            remove_cgroups()
    return run
