"""NVIDIA GPUs for sandboxes through gVisor's nvproxy (`runsc --nvproxy`).

nvproxy forwards the sandbox's ioctls on /dev/nvidia* to the host driver; the sandbox needs
the device nodes in its spec and the driver's user-space libraries (libcuda, nvidia-smi) in its
root filesystem, which `--nvproxy-docker` has runsc add through the NVIDIA container toolkit
when the host has it (https://gvisor.dev/docs/user_guide/gpu/). A request this machine cannot
meet raises ResourceUnavailable: a GPU job never silently runs on the CPU.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument, ResourceUnavailable

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str  # e.g. "NVIDIA H200"
    memory_mib: int


def host_gpus() -> list[Gpu]:
    """The host's NVIDIA GPUs (empty without a driver or devices)."""
    if not Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            gpus.append(Gpu(int(parts[0]), parts[1], int(float(parts[2] or 0))))
    return gpus


def select(kind: str, count: int, in_use: set[int] | None = None) -> list[Gpu]:
    """`count` free GPUs matching `kind` ("any" or a model name such as "H100", matched as a
    substring of the device name). Raises InvalidArgument (bad count) or ResourceUnavailable."""
    if not isinstance(count, int) or count < 1:
        raise InvalidArgument(f"gpu_count={count!r} must be a positive integer")
    gpus = host_gpus()
    if not gpus:
        raise ResourceUnavailable(f"gpu={kind!r} was asked for but this machine has no NVIDIA GPU (no "
                                  "/dev/nvidiactl or nvidia-smi); run it on a GPU machine or drop gpu=")
    want = kind.strip().upper()
    match = [g for g in gpus if want in ("ANY", "TRUE", "1") or want in g.name.upper()]
    free = [g for g in match if g.index not in (in_use or set())]
    if len(free) < count:
        have = ", ".join(f"{g.index}: {g.name}" for g in gpus)
        raise ResourceUnavailable(f"gpu={kind!r} x{count} is not available here: {len(free)} free of "
                                  f"{len(match)} matching (GPUs: {have})")
    return free[:count]


def oci_devices(gpus: list[Gpu]) -> list[dict[str, object]]:
    """OCI `linux.devices` entries for the control devices and the chosen GPUs."""
    out = []
    for path in (*CONTROL_DEVICES, *(f"/dev/nvidia{g.index}" for g in gpus)):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        out.append({"path": path, "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                    "fileMode": stat.S_IMODE(st.st_mode), "uid": 0, "gid": 0})
    return out
