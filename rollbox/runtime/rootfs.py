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
from . import mounts


def mount_overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    """Mounts `lowers` (top first) under a fresh or copied `upper` at `target`."""
    for d in (upper, work, target):
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}"
    try:
        mounts.mount("overlay", target, "overlay", opts)  # mount(2): no `mount` process (mounts.py)
    except OSError as e:
        raise RollboxError(f"mounting the sandbox root filesystem at {target} failed: "
                           f"{e.strerror} (is overlayfs available? `modprobe overlay`)") from e


def mount_disk(target: Path, size_mib: int, templates: mounts.DiskTemplates | None = None) -> None:
    """A capped, disk-backed filesystem at `target` for a sandbox's writable layer.

    A sparse file beside `target` (`disk.img`, using host disk only for what is written)
    formatted ext4 and loop-mounted: writing past `size_mib` fails with ENOSPC inside the
    sandbox and the host disk never fills. Why not a quota on the host filesystem: this kernel
    has none (CONFIG_QUOTA off, XFS quota unavailable: `mount -o prjquota` fails, measured);
    why not a size-capped tmpfs: its pages are charged to the sandbox's memory cgroup (600 MiB
    written into a 256 MiB sandbox OOM-killed it, measured). No journal (the layer dies with the
    sandbox), no reserved blocks; `mkfs` + `mount` took ~20 ms here.

    templates: the image is a sparse copy of one `mkfs` made once per size, and the loop mount
    is done in-process (mounts.py: ~2 ms of CPU instead of two processes' ~10 ms); None: `mkfs`
    and `mount -o loop` per sandbox.

    Raises:
        ResourceExhausted: the host disk is full.
        RollboxError: the image could not be made or mounted (e2fsprogs or loop devices missing).
    """
    target.mkdir(parents=True, exist_ok=True)
    img = target.parent / f"{target.name}.img"
    what = "mkfs.ext4"
    try:
        if templates is not None:
            templates.make(img, size_mib)
            what = "mount -o loop"
            mounts.loop_mount(img, target)
            return
        with open(img, "wb") as f:
            f.truncate(int(size_mib) << 20)
        for argv in ([*mounts.MKFS_EXT4, str(img)], ["mount", "-o", "loop,nosuid,nodev", str(img), str(target)]):
            what = argv[0]
            subprocess.run(argv, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        full = disk_full(img)
        img.unlink(missing_ok=True)
        detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
        if full:
            raise ResourceExhausted(f"disk full making the sandbox's writable layer under {target.parent}") from e
        raise RollboxError(f"making the sandbox's {size_mib} MiB writable layer at {target} failed: "
                           f"`{what}`: {detail} (are e2fsprogs and loop devices available?)") from e


def _image_dir(upper: Path, lowers: list[Path], name: str, default_mode: int) -> bool:
    """Makes `upper/name` for a fresh sandbox with the image's owner and mode for that
    directory (an upper directory's attributes win in the merged view), or `default_mode` when
    the image has none. False, making nothing, when the image's entry is not a directory."""
    mine = upper / name
    if os.path.lexists(mine):  # a boot from a snapshot's files: what they hold wins
        return mine.is_dir() and not mine.is_symlink()
    img = next((p / name for p in lowers if os.path.lexists(p / name)), None)
    if img is not None and (img.is_symlink() or not img.is_dir()):
        return False
    mine.mkdir(mode=default_mode)
    st = img.stat() if img is not None else None
    if st is not None:
        os.chown(upper / name, st.st_uid, st.st_gid)
    os.chmod(upper / name, (st.st_mode if st is not None else default_mode) & 0o7777)
    return True


def write_hostname(upper: Path, lowers: list[Path], name: str) -> None:
    """Puts /etc/hostname (`name`) in a fresh sandbox's upper directory. Skipped when the
    image's /etc is not a directory."""
    if _image_dir(upper, lowers, "etc", 0o755):
        (upper / "etc" / "hostname").write_text(name + "\n")


# gVisor mounts a tmpfs of its own over an empty /tmp, sized at half the host's memory and
# charged to the sandbox's memory limit (filling it ended the sandbox as `oom`). A file in /tmp
# keeps /tmp on the disk-capped writable layer instead; the agent removes it at start.
TMP_MARKER = ".rollbox-tmp-on-disk"


def keep_tmp_on_disk(upper: Path, lowers: list[Path]) -> bool:
    """Puts the marker in a fresh sandbox's /tmp (mode 1777 when the image has none); False
    when the image's /tmp is not a directory (a symlink, say): /tmp then needs a bounded tmpfs."""
    if not _image_dir(upper, lowers, "tmp", 0o1777):
        return False
    (upper / "tmp" / TMP_MARKER).touch(mode=0o600)
    return True


def is_mounted(target: Path) -> bool:
    t = str(target)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == t for line in f)


def unmount(target: Path) -> None:
    """Unmounts `target` if something is mounted there (umount2(2), lazily when busy: a gofer
    still exiting); a loop-mounted disk's device detaches itself (autoclear).

    Raises OSError when the kernel refuses for another reason."""
    if is_mounted(target):
        mounts.umount(target)


def copy_tree(src: Path, dst: Path) -> None:
    """Copies a directory with owners, modes, xattrs and overlay whiteouts (cp -a), reflinked
    where the filesystem can."""
    res = subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dst)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        if disk_full(dst):
            raise ResourceExhausted(f"disk full while copying {src}: free space under {dst.parent}")
        raise RollboxError(f"copying {src} to {dst} failed: {res.stderr.strip()}")


def remove_tree(path: Path) -> None:
    """Removes `path` and everything under it, never crossing into a mount left there."""
    if path.exists():
        try:
            shutil.rmtree(path, ignore_errors=True)
        except RecursionError:
            pass  # nested deeper than Python's stack (a sandbox can do that): rm walks iteratively
        if path.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True)


def tree_usage(path: Path) -> tuple[int, int]:
    """(bytes, files) under `path`: apparent sizes of regular files and links, not followed."""
    size = files = 0
    todo = [str(path)]  # an explicit stack: os.walk recurses, and sandboxes nest thousands deep
    while todo:
        try:
            it = os.scandir(todo.pop())
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    else:
                        size += e.stat(follow_symlinks=False).st_size
                        files += 1
                except OSError:
                    pass
    return size, files


def disk_free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


FULL_BELOW = 8 << 20  # bytes free under which a failed write is put down to a full disk


def disk_full(path: Path) -> bool:
    """Whether the filesystem holding `path` (or its nearest existing parent) is full: how a
    failed command's cause is told from the filesystem's state, not from its message."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return disk_free_bytes(p) < FULL_BELOW
    except OSError:
        return False
