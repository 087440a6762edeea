"""`rollbox doctor`: checks this host's prerequisites and says how to fix each."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..config import RUNSC_INSTALL_HINT as INSTALL_HINT, Paths


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def run_checks(paths: Paths) -> list[Check]:
    out: list[Check] = []
    out.append(Check("root", os.geteuid() == 0, f"euid={os.geteuid()}", "run the daemon as root (gVisor, mounts, cgroups)"))
    runsc = shutil.which("runsc")
    ver = ""
    if runsc:
        lines = subprocess.run([runsc, "--version"], capture_output=True, text=True).stdout.splitlines()
        ver = lines[0] if lines else ""
    out.append(Check("runsc", bool(runsc) and "2024" in ver, ver or "not found",
                     INSTALL_HINT if not runsc else "need the bookworm-backports build (20240729) for systrap: " + INSTALL_HINT))
    mem = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists() or Path("/sys/fs/cgroup/unified").exists()
    out.append(Check("cgroups", mem.is_dir() or v2, "memory v1" if mem.is_dir() else ("v2" if v2 else "none"),
                     "mount the cgroup memory controller (cgroup v1 `memory` or cgroup2)"))
    try:
        with open("/proc/filesystems") as f:
            fs = f.read()
    except OSError:
        fs = ""
    out.append(Check("overlayfs", "overlay" in fs, "overlay in /proc/filesystems" if "overlay" in fs else "missing",
                     "`modprobe overlay`"))
    out.append(Check("namespaces", Path("/proc/self/ns/net").exists() and Path("/proc/self/ns/pid").exists(),
                     "net, pid", "a kernel with namespaces is required"))
    try:
        os.pidfd_open(os.getpid())
        pidfd = True
    except (OSError, AttributeError):
        pidfd = False
    out.append(Check("pidfd", pidfd, "pidfd_open works" if pidfd else "pidfd_open failed", "Linux >= 5.3 is needed"))
    for tool, pkg in (("nft", "nftables"), ("nsenter", "util-linux"), ("unshare", "util-linux")):
        where = shutil.which(tool)
        out.append(Check(tool, where is not None, where or "not found",
                         f"`apt-get install {pkg}` (networked sandboxes need it)"))
    out.append(Check("debootstrap", shutil.which("debootstrap") is not None, shutil.which("debootstrap") or "not found",
                     "`apt-get install debootstrap` (builds the default base image)"))
    home = paths.home if paths.home.exists() else paths.home.parent
    st = os.statvfs(home)
    free = st.f_bavail * st.f_frsize
    out.append(Check("disk", free > 2 << 30, f"{free / 2**30:.1f} GiB free under {home}",
                     f"free at least 2 GiB under {home} (images and snapshots live there)"))
    base = paths.images / "im-debian-bookworm" / "meta.json"
    out.append(Check("base image", base.exists(), "built" if base.exists() else "not built yet",
                     "`rollbox image build-base` (or it is built on first use, ~45 s)"))
    return out
