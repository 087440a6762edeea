"""mount(2)/umount2(2) called directly, and sparse copies of a formatted disk image.

Per sandbox the daemon mounts an overlay, loop-mounts its capped disk and unmounts both. Each
`mount`/`umount`/`mkfs.ext4` run is a fork and exec from a large Python process plus the
binary's own start (~2-6 ms of CPU each, measured); on 2 cores that is throughput. These
helpers do the same work in-process: the overlay mount and both unmounts as system calls, and
the disk image as a copy of the data extents (~2 MiB of a 4 GiB image) of one image `mkfs`
formatted once per size (`DiskTemplates`).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import subprocess
import threading
from pathlib import Path

MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

# mkfs.ext4 flags for a sandbox's writable layer: no journal (the layer dies with the sandbox),
# no reserved blocks, inode tables initialised lazily.
MKFS_EXT4 = ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
             "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard")


def mount(source: str, target: Path, fstype: str, options: str, flags: int = 0) -> None:
    """mount(2). Raises OSError (its errno and the target) when the kernel refuses."""
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags, options.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount -t {fstype} at {target}: {os.strerror(e)}")


def umount(target: Path) -> bool:
    """Unmounts `target`; a busy mount (a gofer still exiting) is detached instead and goes
    away once its last user does. False when nothing was mounted there.

    Raises OSError for any other refusal (EPERM, say)."""
    path = os.fsencode(target)
    for flags in (0, MNT_DETACH):
        if _libc.umount2(path, flags) == 0:
            return True
        e = ctypes.get_errno()
        if e in (errno.EINVAL, errno.ENOENT):
            return False  # not a mount point (or no such path): nothing to do
        if e != errno.EBUSY:
            raise OSError(e, f"umount {target}: {os.strerror(e)}")
    raise OSError(errno.EBUSY, f"umount {target}: still busy after a lazy unmount")


LOOP_CTL_GET_FREE, LOOP_CONFIGURE = 0x4C82, 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
_LOOP_CONFIG_SIZE, _LO_FLAGS_AT = 304, 60  # struct loop_config; its info.lo_flags offset


def loop_mount(img: Path, target: Path, fstype: str = "ext4", flags: int = MS_NOSUID | MS_NODEV) -> None:
    """`mount -o loop` in-process: a free loop device bound to `img` with autoclear (it
    detaches itself when the filesystem is unmounted, or at once if the mount fails), then
    mount(2). Raises OSError when no loop device can be had or the mount is refused."""
    import fcntl

    for _ in range(16):  # another process may take the free device between the two calls
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            n = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
        finally:
            os.close(ctl)
        dev = f"/dev/loop{n}"
        backing = os.open(img, os.O_RDWR | os.O_CLOEXEC)
        try:
            loop = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            os.close(backing)
            raise
        try:
            cfg = bytearray(_LOOP_CONFIG_SIZE)
            cfg[0:4] = backing.to_bytes(4, "little")
            cfg[_LO_FLAGS_AT:_LO_FLAGS_AT + 4] = LO_FLAGS_AUTOCLEAR.to_bytes(4, "little")
            try:
                fcntl.ioctl(loop, LOOP_CONFIGURE, bytes(cfg))
            except OSError as e:
                if e.errno == errno.EBUSY:
                    continue  # taken meanwhile: ask for another
                raise
            mount(dev, target, fstype, "", flags)
            return
        finally:
            os.close(loop)
            os.close(backing)
    raise OSError(errno.EBUSY, f"no free loop device for {img} after 16 tries")


def sparse_copy(src: Path, dst: Path) -> None:
    """Copies `src` to a new `dst` of the same size, writing only its data extents
    (SEEK_DATA/SEEK_HOLE): holes stay holes and use no disk."""
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        size = os.fstat(fi.fileno()).st_size
        os.ftruncate(fo.fileno(), size)
        pos = 0
        while pos < size:
            try:
                data = os.lseek(fi.fileno(), pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    break  # only a hole is left
                raise
            hole = os.lseek(fi.fileno(), data, os.SEEK_HOLE)
            off = data
            while off < hole:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), hole - off, off, off)
                if n <= 0:
                    raise OSError(errno.EIO, f"copying {src} to {dst}: short copy at {off}")
                off += n
            pos = hole


class DiskTemplates:
    """One freshly formatted ext4 image per size under `root`, made by `mkfs.ext4` the first
    time a size is asked for and copied (sparse) for every sandbox after that. A copy is
    byte-for-byte what `mkfs` makes (same UUID and hash seed in every sandbox: nothing in a
    sandbox can see them, and the kernel mounts equal UUIDs side by side). Thread-safe."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()

    def template(self, size_mib: int) -> Path:
        """The formatted image of `size_mib` MiB, made now if missing.

        Raises OSError (disk full, ...) or subprocess.CalledProcessError (mkfs failed)."""
        # Named by the mkfs flags too: a template made with other flags is never used.
        flags = hashlib.sha256(" ".join(MKFS_EXT4).encode()).hexdigest()[:8]
        path = self.root / f"ext4-{int(size_mib)}m-{flags}.img"
        if path.exists():
            return path
        with self._lock:
            if path.exists():
                return path
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.unlink(missing_ok=True)
            try:
                with open(tmp, "wb") as f:
                    f.truncate(int(size_mib) << 20)
                subprocess.run([*MKFS_EXT4, str(tmp)], check=True, capture_output=True, text=True)
                os.replace(tmp, path)  # whole or absent: a crash mid-mkfs leaves no template
            finally:
                tmp.unlink(missing_ok=True)
        return path

    def make(self, img: Path, size_mib: int) -> None:
        """Writes a fresh formatted image of `size_mib` MiB at `img` (which must not exist)."""
        sparse_copy(self.template(size_mib), img)
