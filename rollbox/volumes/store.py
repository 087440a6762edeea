"""Volume store: `volumes/<name>/data` is the directory sandboxes mount.

A volume is created on first use and shared read-write by every sandbox that mounts it:
gVisor's gofer writes straight through to the host directory, so a file written just before
`terminate()` is on the host afterwards, and 64 sandboxes writing distinct files lose nothing.
Host-side reads and writes go through `resolve()`, which refuses any path that leaves the
volume (`..`, symlinks pointing outside).
"""

from __future__ import annotations

import builtins

import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument, NotFound, ResourceExhausted, VolumeNotFound
from ..runtime.rootfs import tree_usage

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    path: str
    created_at: float
    size_bytes: int
    files: int


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidArgument(f"volume name {name!r} is invalid: use 1-63 of [a-z0-9._-], starting with a letter or digit")
    return name


RESERVED = ("/proc", "/dev", "/sys", "/.rollbox", "/.rollbox-key")
MAX_READ = 64 * 1024 * 1024


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
        shutil.rmtree(d)

    def resolve(self, name: str, path: str) -> Path:
        """The host path of `path` inside the volume; never outside it."""
        base = self.data_dir(name)
        if not base.is_dir():
            raise VolumeNotFound(f"volume {name!r} not found")
        rel = path.lstrip("/")
        target = (base / rel).resolve()
        base_r = base.resolve()
        if target != base_r and base_r not in target.parents:
            raise InvalidArgument(f"path {path!r} leaves volume {name!r}")
        return target

    def _check_fd(self, name: str, fd: int, path: str) -> None:
        """After opening: the descriptor's real path is inside the volume. Checking the open
        file, not the name, leaves no window for a symlink swapped in by a sandbox."""
        real = os.readlink(f"/proc/self/fd/{fd}")
        base = str(self.data_dir(name).resolve())
        if real != base and not real.startswith(base + "/"):
            raise InvalidArgument(f"path {path!r} leaves volume {name!r}")

    def write_file(self, name: str, path: str, data: bytes) -> int:
        self.ensure(name)
        target = self.resolve(name, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        tmp = f".{target.name}.rollbox-{time.monotonic_ns()}"
        try:
            self._check_fd(name, dfd, path)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, target.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as e:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                if e.errno == 28:
                    raise ResourceExhausted(f"disk full writing {path!r} to volume {name!r}") from e
                raise
        finally:
            os.close(dfd)
        return len(data)

    def read_file(self, name: str, path: str) -> bytes:
        """The file's bytes (at most 64 MiB; larger files: mount the volume in a sandbox)."""
        target = self.resolve(name, path)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise NotFound(f"no file {path!r} in volume {name!r}") from None
        except OSError as e:
            raise InvalidArgument(f"cannot read {path!r} in volume {name!r}: {e.strerror}") from None
        try:
            self._check_fd(name, fd, path)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"{path!r} in volume {name!r} is not a regular file")
            if st.st_size > MAX_READ:
                raise InvalidArgument(f"{path!r} in volume {name!r} is {st.st_size} bytes, over the {MAX_READ}-byte "
                                      "read limit; read it from a sandbox that mounts the volume")
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(MAX_READ + 1)
        finally:
            os.close(fd)

    def list_files(self, name: str, path: str = "/") -> builtins.list[dict[str, object]]:
        target = self.resolve(name, path)
        if not target.is_dir():
            raise NotFound(f"no directory {path!r} in volume {name!r}")
        out = []
        for e in sorted(os.scandir(target), key=lambda e: e.name):
            st = e.stat(follow_symlinks=False)
            rel = "/" + str(Path(e.path).relative_to(self.data_dir(name)))
            out.append({"name": e.name, "path": rel, "is_dir": e.is_dir(follow_symlinks=False), "size": st.st_size,
                        "mode": st.st_mode, "mtime": st.st_mtime})
        return out

    def remove_file(self, name: str, path: str) -> None:
        target = self.resolve(name, path)
        if target == self.data_dir(name).resolve():
            raise InvalidArgument("refusing to remove the volume root; delete the volume instead")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            raise NotFound(f"no file {path!r} in volume {name!r}")
