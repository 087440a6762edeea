"""The image `rollbox serve-fusion` runs (`--image`), and building it with progress shown.

`--image toolchains` is Debian 12 plus one cached layer per toolchain of the language table.
The first start builds it step by step in gVisor sandboxes with network (measured here, 2
shared cores: 4 min 6 s, 5 min 12 s under load; 2,425 MiB in all, 2,266 beyond the base);
every later start finds each step cached (0.1 s) and goes on at once. While a step builds, a
line says so and another follows every HEARTBEAT_S seconds, so a first start never looks hung.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from rollbox.errors import RollboxError
from rollbox.sdk.image import Image

# One layer each, in this order: a failed build names its step, and a change to one
# toolchain rebuilds only the layers after it.
TOOLCHAIN_PACKAGES = ("python3-pytest", "g++", "golang-go", "default-jdk-headless", "nodejs", "rustc")
# A step still building after this long is announced; then a line every HEARTBEAT_S.
ANNOUNCE_AFTER_S = 2.0
HEARTBEAT_S = 30.0


def toolchains_image() -> Image:
    """Debian 12 with g++, Go, Java (JDK), Node.js, Rust and pytest: the `--image toolchains` preset."""
    img = Image.debian()
    for pkg in TOOLCHAIN_PACKAGES:
        img = img.apt_install(pkg)
    return img


def image_for(spec: str) -> Image:
    """`--image`: "debian" (the default base: python3 and bash), "toolchains" (the base plus
    g++, Go, Java, Node.js, Rust and pytest), a stored image id ("im-...") or a registry
    reference ("python:3.11-slim")."""
    if spec in ("", "debian"):
        return Image.debian()
    if spec == "toolchains":
        return toolchains_image()
    if spec.startswith("im-"):
        return Image.from_id(spec)
    return Image.from_registry(spec)


def describe_step(step: dict[str, Any]) -> str:
    """A short name for a build step: "apt-get install PKG" for Image.apt_install's, else its
    first command (cut at 80 characters)."""
    commands = step.get("commands") or []
    first = str(commands[0]) if commands else str(step.get("kind", "step"))
    m = re.search(r"apt-get install -y -qq --no-install-recommends (.+?) && ", first)
    if m:
        return f"apt-get install {m.group(1)}"
    return first if len(first) <= 80 else first[:79] + "…"


class _Heartbeat:
    """Logs that a step is building if it takes over ANNOUNCE_AFTER_S, then every HEARTBEAT_S."""

    def __init__(self, log: Callable[[str], None], label: str) -> None:
        self._log, self._label = log, label
        self._done = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fusion-build-progress")

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        if self._done.wait(ANNOUNCE_AFTER_S):
            return
        self._log(f"  {self._label}: building (not cached: only the first start builds it) ...")
        while not self._done.wait(HEARTBEAT_S):
            self._log(f"  {self._label}: still building ({time.monotonic() - self._t0:.0f} s)")


def _total_mib(image_id: str) -> float | None:
    from rollbox.sdk.sandbox import default_client  # no public call reports an image's size

    try:
        for entry in default_client().request("GET", "/images"):
            if entry.get("image_id") == image_id:
                return float(entry["total_bytes"]) / (1 << 20)
    except (RollboxError, KeyError, TypeError, ValueError):
        pass
    return None


def build_image(image: Image, log: Callable[[str], None]) -> Image:
    """Builds `image` one step at a time (each step a cached layer: only the first use
    builds), logging each step as it starts, while it builds and when it ends, then the
    whole build's time and size. Returns it as a stored image.

    Raises ImageBuildError (a step failed: its output is in the message) and the errors of
    the image's base (see Image.from_registry)."""
    if not image.needs_build:
        return image
    n = len(image.steps)
    prefixes = [Image(image.image_id, image.base, image.steps[:k]) for k in range(1, n + 1)] or [image]
    t0 = time.monotonic()
    built = 0
    image_id = ""
    for k, prefix in enumerate(prefixes, 1):
        label = f"image step {k}/{len(prefixes)} ({describe_step(prefix.steps[-1]) if prefix.steps else 'base'})"
        with _Heartbeat(log, label):
            rep = prefix.build_report()
        image_id = str(rep["image_id"])
        step = rep["steps"][-1] if rep["steps"] else {"cached": True, "seconds": 0.0}
        built += not step["cached"]
        log(f"  {label}: {'cached' if step['cached'] else 'built in %.1f s' % float(step['seconds'])}")
    if built:
        size = _total_mib(image_id)
        log(f"  image {image_id} built in {time.monotonic() - t0:.0f} s ({built} of {len(prefixes)} steps)"
            + (f", {size:.0f} MiB in all" if size is not None else "") + "; later starts reuse it")
    else:
        log(f"  image {image_id}: every step cached ({time.monotonic() - t0:.1f} s)")
    return Image.from_id(image_id)
