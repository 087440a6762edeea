"""What the benchmark's modules share: where the bench works (paths, cgroup parent), the raw
runsc invocation, and the timing and log helpers."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The daemon's state directory (ROLLBOX_HOME, as rollbox.config reads it): its base image is
# what the raw loops run.
SHARED_HOME = Path(os.environ.get("ROLLBOX_HOME") or "/var/lib/rollbox")
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


def timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


