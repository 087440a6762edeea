"""Per-sandbox root filesystems: a host overlayfs of read-only image layers plus a private upper.

The upper directory holds everything a sandbox wrote, so it *is* the sandbox's filesystem
snapshot: fork/restore copy it, `create_image_from_filesystem` turns it into a layer. Two
sandboxes never share an upper, so a write in one is never seen in another or in the image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import ResourceExhausted, RollboxError


def mount_overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    """Mounts `lowers` (top first) under a fresh or copied `upper` at `target`."""
    for d in (upper, work, target):
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}"
    res = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(target)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RollboxError(f"mounting the sandbox root filesystem at {target} failed: "
                           f"{res.stderr.strip()} (is overlayfs available? `modprobe overlay`)")


def is_mounted(target: Path) -> bool:
    t = str(target)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == t for line in f)


def unmount(target: Path) -> None:
    if not is_mounted(target):
        return
    res = subprocess.run(["umount", str(target)], capture_output=True, text=True)
    if res.returncode != 0:
        # A busy mount (a gofer still exiting) goes away once its last user does.
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def copy_tree(src: Path, dst: Path) -> None:
    """Copies a directory with owners, modes, xattrs and overlay whiteouts (cp -a), reflinked
    where the filesystem can."""
    res = subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dst)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        if "No space left" in res.stderr:
            raise ResourceExhausted(f"disk full while copying {src}: free space under {dst.parent}")
        raise RollboxError(f"copying {src} to {dst} failed: {res.stderr.strip()}")


def remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            subprocess.run(["rm", "-rf", str(path)], capture_output=True)


def tree_usage(path: Path) -> tuple[int, int]:
    """(bytes, files) under `path`: apparent sizes of regular files and links, not followed."""
    size = files = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            try:
                size += os.lstat(os.path.join(root, n)).st_size
                files += 1
            except OSError:
                pass
    return size, files


def disk_free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
