"""Volume store: `volumes/<name>/data` is the directory sandboxes mount.

A volume is created on first use and mounted read-write or read-only (one gVisor writer at a
time: volumes/writers.py): gVisor's gofer writes straight through to the host directory, so a
file written just before `terminate()` is on the host afterwards, and readers see it.
Sandboxes can create or swap symlinks in that directory at any moment while the daemon (root)
works in it, so host-side file operations never resolve a path by name: `_walk()` opens the
data directory, then each component with O_NOFOLLOW relative to the previous descriptor, and
the operation acts on the last descriptor with `dir_fd=`. A symlink anywhere in the path is
refused (`..` too), and one swapped in after a component was opened cannot redirect anything.
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument, NotFound, ResourceExhausted, VolumeNotFound
from ..names import check_volume_name
from ..runtime.rootfs import remove_tree, tree_usage

check_name = check_volume_name  # the SDK checks names too: one rule, in rollbox.names


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    path: str
    created_at: float
    size_bytes: int
    files: int


RESERVED = ("/proc", "/dev", "/sys", "/.rollbox", "/.rollbox-key")
MAX_READ = 64 * 1024 * 1024
MAX_REMOVE_DEPTH = 256  # directory levels `remove_file` descends; deeper trees: remove them from a sandbox
# A component is opened only as a real directory: O_NOFOLLOW makes a symlink fail (ELOOP/ENOTDIR)
# instead of being followed, O_NONBLOCK keeps a FIFO from blocking the daemon.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FULL = (errno.ENOSPC, errno.EDQUOT)


def check_mount_path(mount_path: str) -> str:
    """The normalised mount path; refuses '/', '..', and anything at or under a reserved path."""
    bad = InvalidArgument(f"mount_path {mount_path!r} must be an absolute path such as '/data', not '/', "
                          f"one with '..', nor at or under {', '.join(RESERVED)}")
    if not isinstance(mount_path, str) or not mount_path.startswith("/") or "\0" in mount_path \
            or ".." in mount_path.split("/"):
        raise bad
    norm = "/" + os.path.normpath(mount_path).lstrip("/")  # normpath keeps a leading '//'
    if norm == "/" or any(norm == r or norm.startswith(r + "/") for r in RESERVED):
        raise bad
    return norm


@dataclass(frozen=True)
class VolPath:
    """A path inside a volume, split into components: `//a/./b` is ('a', 'b'), '/' is ()."""

    volume: str
    path: str  # as the caller gave it, for error messages
    parts: tuple[str, ...]

    @classmethod
    def parse(cls, volume: str, path: str) -> VolPath:
        """Raises InvalidArgument for a non-string path, a NUL byte, or a `..` component."""
        if not isinstance(path, str) or "\0" in path:
            raise InvalidArgument(f"path {path!r} in volume {volume!r} must be a string without NUL bytes")
        parts = tuple(p for p in path.split("/") if p not in ("", "."))
        if ".." in parts:
            raise InvalidArgument(f"path {path!r} leaves volume {volume!r}")
        return cls(volume, path, parts)

    @property
    def parent(self) -> tuple[str, ...]:
        return self.parts[:-1]

    @property
    def leaf(self) -> str:
        return self.parts[-1]

    def symlink_error(self, upto: int) -> InvalidArgument:
        link = "/" + "/".join(self.parts[:upto + 1])
        return InvalidArgument(f"path {self.path!r} in volume {self.volume!r} goes through the symlink {link!r}; "
                               "volume file operations do not follow symlinks (read the link's target instead)")

    def not_found(self, what: str = "file") -> NotFound:
        return NotFound(f"no {what} {self.path!r} in volume {self.volume!r}")


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_child(dir_fd: int, vp: VolPath, i: int, *, create: bool, missing: str) -> int:
    """Opens component `i` of `vp` relative to `dir_fd` as a real directory (creating it if `create`).

    Raises: InvalidArgument (a symlink; or, when creating, a non-directory), NotFound (missing, or
    not a directory, when not creating: "no {missing} ..."), ResourceExhausted (disk full creating it).
    """
    part = vp.parts[i]
    for _ in range(2):  # create, then open once more: a sandbox may create or swap it in between
        try:
            return os.open(part, DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise vp.not_found(missing) from None
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if _is_symlink(dir_fd, part):
                raise vp.symlink_error(i) from None
            if create:
                raise InvalidArgument(f"path {vp.path!r} in volume {vp.volume!r}: "
                                      f"{'/' + '/'.join(vp.parts[:i + 1])!r} is not a directory") from None
            raise vp.not_found(missing) from None
        try:
            os.mkdir(part, 0o755, dir_fd=dir_fd)  # never follows a symlink: EEXIST, then the open refuses it
        except FileExistsError:
            pass
        except OSError as e:
            if e.errno in FULL:
                raise ResourceExhausted(f"disk full creating {vp.path!r} in volume {vp.volume!r}") from e
            raise
    raise InvalidArgument(f"path {vp.path!r} in volume {vp.volume!r} kept changing while it was opened; retry")


def _remove_entry(dir_fd: int, name: str, depth: int = 0) -> None:
    """Removes `name` in `dir_fd`: a file or symlink is unlinked (a link is never followed), a directory
    is emptied through descriptors opened O_NOFOLLOW, then removed. Unlike `shutil.rmtree`, which opens
    subdirectories without O_NOFOLLOW (and so can open a device or FIFO a swapped-in link points at
    before noticing), nothing here ever opens a symlink's target.

    Raises: FileNotFoundError when `name` is missing, InvalidArgument past MAX_REMOVE_DEPTH levels,
    OSError for anything else (e.g. ENOTEMPTY when a sandbox writes into it meanwhile).
    """
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=dir_fd)  # not a directory: a file, a symlink, a FIFO...
        return
    try:
        if depth >= MAX_REMOVE_DEPTH:
            raise InvalidArgument(f"directory nested deeper than {MAX_REMOVE_DEPTH} levels; "
                                  "remove it from a sandbox that mounts the volume")
        with os.scandir(fd) as it:
            names = [e.name for e in it]
        for n in names:
            try:
                _remove_entry(fd, n, depth + 1)
            except FileNotFoundError:
                pass  # a sandbox removed it meanwhile
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


class VolumeStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def data_dir(self, name: str) -> Path:
        return self.root / check_name(name) / "data"

    def exists(self, name: str) -> bool:
        return self.data_dir(name).is_dir()

    def ensure(self, name: str) -> Path:
        """Creates the volume if missing; returns its data directory."""
        d = self.data_dir(name)
        if not d.is_dir():
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ResourceExhausted(f"cannot create volume {name!r}: {e}") from e
        return d

    def info(self, name: str) -> VolumeInfo:
        d = self.data_dir(name)
        if not d.is_dir():
            raise VolumeNotFound(f"volume {name!r} not found: it is created when a sandbox first mounts it, "
                                 "or with `rollbox volume put`")
        size, files = tree_usage(d)
        return VolumeInfo(name, str(d), d.stat().st_ctime, size, files)

    def list(self) -> list[VolumeInfo]:
        if not self.root.is_dir():
            return []
        return [self.info(p.name) for p in sorted(self.root.iterdir()) if (p / "data").is_dir()]

    def delete(self, name: str) -> None:
        d = self.root / check_name(name)
        if not (d / "data").is_dir():
            raise VolumeNotFound(f"volume {name!r} not found")
        remove_tree(d)  # iterative (`rm -rf`): a sandbox may have nested directories thousands deep

    def _open_root(self, name: str) -> int:
        """A descriptor of the volume's data directory. Raises VolumeNotFound."""
        try:
            return os.open(self.data_dir(name), DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            raise VolumeNotFound(f"volume {name!r} not found") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise VolumeNotFound(f"volume {name!r} not found") from None
            raise

    @contextmanager
    def _walk(self, vp: VolPath, parts: tuple[str, ...], *, create: bool = False,
              missing: str = "file") -> Iterator[int]:
        """Yields a descriptor of the directory `parts` (a prefix of `vp.parts`) names, reached one
        component at a time from the data directory and never through a symlink; closed on exit.

        Raises: VolumeNotFound, and `_open_child`'s errors.
        """
        fd = self._open_root(vp.volume)
        try:
            for i in range(len(parts)):
                child = _open_child(fd, vp, i, create=create, missing=missing)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def write_file(self, name: str, path: str, data: bytes) -> int:
        """Writes `data` to `path` (atomically, creating parent directories); returns its length.

        Raises: InvalidArgument (`..`, a symlink or non-directory in the path, no file name, the path is a
        directory), VolumeNotFound, ResourceExhausted (disk full).
        """
        vp = VolPath.parse(name, path)
        if not vp.parts:
            raise InvalidArgument(f"path {path!r} names no file in volume {name!r}")
        self.ensure(name)
        with self._walk(vp, vp.parent, create=True) as pfd:
            return self._write_at(pfd, vp, data)

    def _write_at(self, pfd: int, vp: VolPath, data: bytes) -> int:
        """Writes `data` to `vp.leaf` in directory `pfd` through a temporary file renamed over it
        (rename replaces a symlink leaf itself, never its target)."""
        if len(vp.leaf.encode(errors="surrogateescape")) > 255:
            raise InvalidArgument(f"file name {vp.leaf[:40]!r}... in volume {vp.volume!r} is over 255 bytes")
        tmp = f".rollbox-{time.monotonic_ns()}.tmp"  # short: any legal leaf name fits beside it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=pfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, vp.leaf, src_dir_fd=pfd, dst_dir_fd=pfd)
        except OSError as e:
            try:
                os.unlink(tmp, dir_fd=pfd)
            except OSError:
                pass
            if e.errno in FULL:
                raise ResourceExhausted(f"disk full writing {vp.path!r} to volume {vp.volume!r}") from e
            if e.errno == errno.EISDIR:
                raise InvalidArgument(f"{vp.path!r} in volume {vp.volume!r} is a directory") from None
            raise
        return len(data)

    def read_file(self, name: str, path: str) -> bytes:
        """The file's bytes (at most 64 MiB; larger files: mount the volume in a sandbox).

        Raises: NotFound, VolumeNotFound, InvalidArgument (`..`, a symlink in the path or as the file,
        not a regular file, over the read limit).
        """
        vp = VolPath.parse(name, path)
        if not vp.parts:
            raise InvalidArgument(f"{path!r} in volume {name!r} is not a regular file")
        with self._walk(vp, vp.parent) as pfd:
            return self._read_at(pfd, vp)

    def _read_at(self, pfd: int, vp: VolPath) -> bytes:
        """Reads regular file `vp.leaf` in directory `pfd`; a symlink leaf is refused, not followed."""
        try:
            # O_PATH first: a device node or FIFO planted by a sandbox (runc's root has
            # CAP_MKNOD) is never opened for real; only a regular file is, via /proc/self/fd.
            ref = os.open(vp.leaf, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
            try:
                mode = os.fstat(ref).st_mode
                if not stat.S_ISREG(mode):
                    if stat.S_ISLNK(mode):
                        raise OSError(errno.ELOOP, "a symlink")
                    raise InvalidArgument(f"{vp.path!r} in volume {vp.volume!r} is not a regular file")
                fd = os.open(f"/proc/self/fd/{ref}", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
            finally:
                os.close(ref)
        except FileNotFoundError:
            raise vp.not_found() from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise vp.symlink_error(len(vp.parts) - 1) from None
            raise InvalidArgument(f"cannot read {vp.path!r} in volume {vp.volume!r}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"{vp.path!r} in volume {vp.volume!r} is not a regular file")
            if st.st_size > MAX_READ:
                raise InvalidArgument(f"{vp.path!r} in volume {vp.volume!r} is {st.st_size} bytes, over the "
                                      f"{MAX_READ}-byte read limit; read it from a sandbox that mounts the volume")
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(MAX_READ + 1)
        finally:
            os.close(fd)

    def list_files(self, name: str, path: str = "/") -> builtins.list[dict[str, object]]:
        """The entries of directory `path`, sorted by name: name, path (volume-relative, from '/'),
        is_dir, size, mode, mtime; symlinks are listed as themselves.

        Raises: NotFound (missing or not a directory), VolumeNotFound, InvalidArgument (`..`, a symlink).
        """
        vp = VolPath.parse(name, path)
        with self._walk(vp, vp.parts, missing="directory") as fd:
            return self._list_at(fd, vp)

    @staticmethod
    def _list_at(fd: int, vp: VolPath) -> builtins.list[dict[str, object]]:
        prefix = "".join("/" + p for p in vp.parts)
        out: builtins.list[dict[str, object]] = []
        with os.scandir(fd) as it:  # scandir(fd) dups the descriptor; entries stat relative to it
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # a sandbox removed it meanwhile
            out.append({"name": e.name, "path": f"{prefix}/{e.name}", "is_dir": stat.S_ISDIR(st.st_mode),
                        "size": st.st_size, "mode": st.st_mode, "mtime": st.st_mtime})
        return out

    def remove_file(self, name: str, path: str) -> None:
        """Removes a file, a symlink (not its target) or a directory tree.

        Raises: NotFound, VolumeNotFound, InvalidArgument (the volume root, `..`, a symlink in the path,
        a tree deeper than MAX_REMOVE_DEPTH).
        """
        vp = VolPath.parse(name, path)
        if not vp.parts:
            raise InvalidArgument("refusing to remove the volume root; delete the volume instead")
        with self._walk(vp, vp.parent) as pfd:
            self._remove_at(pfd, vp)

    @staticmethod
    def _remove_at(pfd: int, vp: VolPath) -> None:
        try:
            _remove_entry(pfd, vp.leaf)
        except FileNotFoundError:
            raise vp.not_found() from None
        except IsADirectoryError:  # a file swapped for a directory between open and unlink
            raise InvalidArgument(f"{vp.path!r} in volume {vp.volume!r} changed while being removed; "
                                  "retry") from None
