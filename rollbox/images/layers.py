"""OCI image layers: from blobs to shared layer directories in the image store.

An image (OCI image-spec v1.1, https://github.com/opencontainers/image-spec) is a manifest
naming a config blob and an ordered list of layer blobs; each layer is a tar archive (plain,
gzip or zstd) of a file system changeset. This module

- (manifests, indexes and configs are parsed by manifest.py),
- applies one layer blob to an empty directory in overlayfs form (`apply_layer`; spec:
  layer.md), verifying the blob's digest and the uncompressed `diff_id` while streaming,
- and registers an image whose layers it stored (`import_image`), so that registry.py and
  archive.py only differ in where the blobs come from.

Whiteouts (layer.md "Representing Changes") become what overlayfs understands: `dir/.wh.NAME`
a 0:0 character device `dir/NAME`, `dir/.wh..wh..opq` the `trusted.overlay.opaque=y` xattr on
`dir` (https://docs.kernel.org/filesystems/overlayfs.html). Writing them needs root.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import zstandard

from ..errors import ImageCorrupt, ImagePullError, ResourceExhausted, RollboxError, UnsupportedImage
from ..runtime.rootfs import remove_tree
from .store import ImageConfig, ImageMeta, ImageStore
from .manifest import (OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD, check_layer_media_type, image_id_for,
                       layer_key, parse_config, split_digest, verify_bytes)

CHUNK = 1 << 20
TAR_BUFSIZE = 256 << 10  # tarfile's read size in stream mode (and so its read-ahead)
ALLOWED_XATTR_PREFIXES = ("user.", "security.capability")


# ---- streaming readers -----------------------------------------------------------------------

class _Reader(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class _Digesting:
    """Passes reads through from `src`, hashing and counting them. Exceptions the source raises
    become `wrap(exc)` (RollboxErrors pass as they are). Keeps the last `keep_tail` bytes so the
    caller can check what followed the tar end-of-archive marker."""

    def __init__(self, src: _Reader, algo: str, wrap: Callable[[BaseException], RollboxError]) -> None:
        self._src, self._wrap = src, wrap
        self.keep_tail = 0
        self.hash = hashlib.new(algo)
        self.size = 0
        self.tail = bytearray()

    def read(self, n: int = -1, /) -> bytes:
        try:
            data = self._src.read(n if n is not None and n >= 0 else CHUNK)
        except RollboxError:
            raise
        except Exception as e:  # decompressor and tar errors come in many types
            raise self._wrap(e) from e
        self.hash.update(data)
        self.size += len(data)
        if self.keep_tail:
            self.tail += data
            if len(self.tail) > 2 * self.keep_tail:
                del self.tail[:-self.keep_tail]
        return data

    def drain(self) -> bool:
        """Reads to the end; returns True when any byte read was not zero."""
        nonzero = False
        while data := self.read(CHUNK):
            nonzero = nonzero or data.count(0) != len(data)
        return nonzero


class _Prefixed:
    """`head` (already read), then the rest of `src`."""

    def __init__(self, head: bytes, src: _Reader) -> None:
        self._head, self._src = head, src

    def read(self, n: int = -1, /) -> bytes:
        if self._head:
            data = self._head if n < 0 else self._head[:n]
            self._head = self._head[len(data):]
            return data
        return self._src.read(n)


def _sniff(src: BinaryIO) -> tuple[str, BinaryIO]:
    """(media type from the first bytes, a reader that still yields them)."""
    peek = getattr(src, "peek", None)
    if peek is not None:
        return sniff_media_type(peek(4)[:4]), src
    head = src.read(4)
    return sniff_media_type(head), _Prefixed(head, src)  # type: ignore[return-value]


def sniff_media_type(head: bytes) -> str:
    """The layer media type of a blob that starts with `head` (gzip and zstd magic numbers),
    for archives that do not say (`docker save`)."""
    if head[:2] == b"\x1f\x8b":
        return OCI_LAYER_GZIP
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return OCI_LAYER_ZSTD
    return OCI_LAYER_TAR


# ---- applying a layer ------------------------------------------------------------------------

def apply_layer(src: BinaryIO, dest: Path, media_type: str, expected_digest: str | None,
                diff_id: str | None, *, name: str | None = None) -> str:
    """Unpacks one layer blob into the empty directory `dest`, in overlayfs form.

    src: the blob as stored (compressed per `media_type`), read once, streaming.
    media_type: an OCI/Docker layer type: application/vnd.oci.image.layer.v1.tar[+gzip|+zstd]
      or application/vnd.docker.image.rootfs.diff.tar.gzip.
    expected_digest / diff_id: "sha256:<hex>" of the blob as stored / of the uncompressed tar,
      verified while reading when given.
    name: how messages name the layer (default: its digest).

    Extraction is confined to `dest`: absolute member names are made relative, names with ".."
    are rejected, no member is written through a symlink or non-directory (every parent is
    checked with lstat), hardlinks must point at an earlier member, device nodes are skipped
    (whiteouts aside), symlink targets are stored verbatim and never resolved. Modes, numeric
    uid/gid, mtimes and user.* / security.capability xattrs are kept.

    Returns the diff_id ("sha256:<hex>") of what was unpacked. Raises UnsupportedImage (media
    type), ImageCorrupt (digest mismatch; truncated or malformed tar, gzip or zstd; an escaping
    member), ImagePullError (reading `src` failed), ResourceExhausted (disk full). On failure
    `dest` is left partly written: the caller removes it (see `store_layer`).
    """
    label = name or expected_digest or diff_id or "(unnamed)"
    compression = check_layer_media_type(media_type, f"layer {label}")
    algo = split_digest(diff_id, f"layer {label} diff_id")[0] if diff_id else "sha256"
    if expected_digest:
        split_digest(expected_digest, f"layer {label}")

    def read_failed(e: BaseException) -> RollboxError:
        if isinstance(e, (tarfile.TarError, EOFError)):  # src is a member of an archive
            return ImageCorrupt(f"layer {label}: the archive holding it is truncated or malformed ({e}): "
                                "export it again")
        return ImagePullError(f"reading layer {label} failed: {e}: retry")

    def corrupt(e: BaseException) -> RollboxError:
        what = {"gzip": "gzip stream", "zstd": "zstd stream"}.get(compression, "tar archive")
        return ImageCorrupt(f"layer {label}: the {what} is truncated or malformed ({type(e).__name__}: {e}); "
                            "fetch or export the image again")

    dalgo = split_digest(expected_digest, f"layer {label}")[0] if expected_digest else algo
    packed = _Digesting(src, dalgo, read_failed)
    stream: _Reader = packed
    if compression == "gzip":
        stream = gzip.GzipFile(fileobj=packed, mode="rb")  # type: ignore[call-overload]
    elif compression == "zstd":
        # zstandard reads any object with read(), as gzip does.
        stream = zstandard.ZstdDecompressor().stream_reader(packed, read_across_frames=True)  # type: ignore[arg-type]
    # An uncompressed layer with a digest of the same algorithm is hashed once: digest == diff_id.
    plain = packed if stream is packed and dalgo == algo else _Digesting(stream, algo, corrupt)
    plain.keep_tail = 2 * TAR_BUFSIZE
    dest.mkdir(parents=True, exist_ok=True)
    try:
        try:
            tf = tarfile.open(fileobj=plain, mode="r|", bufsize=TAR_BUFSIZE)  # type: ignore[call-overload]
            _Extractor(dest, label).run(tf)
            end = tf.offset
        except tarfile.TarError as e:
            raise corrupt(e) from None
        # What follows the last member must be the zero-filled end-of-archive marker (or
        # nothing: Go's archive/tar accepts a clean EOF too); anything else is a bad header.
        start = plain.size - len(plain.tail)
        garbage = end >= start and any(plain.tail[end - start:])
        if plain.drain() or garbage:
            raise ImageCorrupt(f"layer {label}: invalid tar header at offset {end}: the tar is malformed or "
                               "truncated; fetch or export the image again")
        packed.drain()  # the digest covers the whole blob, trailing bytes included
    except OSError as e:
        raise _write_error(e, dest, label) from e
    if expected_digest:
        got = f"{packed.hash.name}:{packed.hash.hexdigest()}"
        if got != expected_digest:
            raise ImageCorrupt(f"layer {label}: content does not match its digest {expected_digest} (got {got}); "
                               "the blob is corrupt: fetch or export the image again")
    got_diff = f"{plain.hash.name}:{plain.hash.hexdigest()}"
    if diff_id and got_diff != diff_id:
        raise ImageCorrupt(f"layer {label}: uncompressed content does not match its diff_id {diff_id} "
                           f"(got {got_diff}); the image is corrupt: fetch or export it again")
    return got_diff


def _write_error(e: OSError, dest: Path, label: str) -> RollboxError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(f"disk full while unpacking layer {label}: free space under {dest.parent}")
    hint = " (importing images needs root: run the daemon as root)" if e.errno in (errno.EPERM, errno.EACCES) else ""
    return RollboxError(f"unpacking layer {label} into {dest} failed: {e}{hint}")


class _Extractor:
    """Writes tar members under `root`, never outside it (see `apply_layer`)."""

    def __init__(self, root: Path, label: str) -> None:
        self.root = str(root)
        self.label = label
        self.as_root = os.geteuid() == 0
        self.dirs: dict[str, tarfile.TarInfo] = {}  # metadata applied last (children change mtimes)
        self.known_dirs: set[str] = set()  # parents already checked to be real directories

    def run(self, tf: tarfile.TarFile) -> None:
        for m in tf:
            self.member(tf, m)
        # Deepest first, so setting a parent's mtime or read-only mode comes after its children.
        for path in sorted(self.dirs, reverse=True):
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    self.set_meta(path, self.dirs[path])
            except FileNotFoundError:
                pass  # replaced later in the same layer

    def bad(self, name: str, why: str) -> ImageCorrupt:
        return ImageCorrupt(f"layer {self.label}: member {name!r} {why}; the layer is malformed or "
                            "malicious and was not imported")

    def parts(self, path: str, name: str) -> list[str]:
        """Path components of `path` (member `name` or its link target) inside the layer;
        absolute paths are taken as relative to the layer's root, as in a container."""
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            what = "has" if path == name else f"links to {path!r}, which has"
            raise self.bad(name, f"{what} a '..' component (it would escape the layer)")
        return parts

    def parent(self, parts: list[str], name: str, create: bool = True) -> str:
        """The absolute parent directory of `parts`, creating missing ones, after checking each
        is a real directory (not a symlink an earlier member made)."""
        cur = self.root
        for comp in parts[:-1]:
            cur = os.path.join(cur, comp)
            if cur in self.known_dirs:
                continue
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(cur, 0o755)
            else:
                if not stat.S_ISDIR(st.st_mode):
                    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a non-directory"
                    rel = os.path.relpath(cur, self.root)
                    raise self.bad(name, f"would be written through {kind} ({rel!r})")
            self.known_dirs.add(cur)
        return cur

    def clear(self, path: str, keep_dir: bool) -> bool:
        """Makes room at `path` for a new member; returns True when an existing directory is kept."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return True
            shutil.rmtree(path)
            self.known_dirs.clear()
        else:
            os.unlink(path)
        return False

    def member(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        parts = self.parts(m.name, m.name)
        if not parts:  # the layer's root ("./"): only its metadata
            if m.isdir():
                self.dirs[self.root] = m
            return
        parent = self.parent(parts, m.name)
        base = parts[-1]
        if base.startswith(".wh."):
            self.whiteout(parent, base, m.name)
            return
        path = os.path.join(parent, base)
        if m.isdir():
            if not self.clear(path, keep_dir=True):
                os.mkdir(path, 0o755)
            self.known_dirs.add(path)
            self.dirs[path] = m
        elif m.isreg():
            self.clear(path, keep_dir=False)
            src = tf.extractfile(m)
            assert src is not None
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                while data := src.read(CHUNK):
                    _write_all(fd, data)
                self.set_meta(fd, m)
            finally:
                os.close(fd)
        elif m.issym():
            self.clear(path, keep_dir=False)
            os.symlink(m.linkname, path)  # verbatim: resolved only inside the sandbox
            self.set_meta(path, m, link=True)
        elif m.islnk():
            target = self.link_target(m)
            if target != path:  # a link to itself is already there
                self.clear(path, keep_dir=False)
                os.link(target, path, follow_symlinks=False)
        elif m.isfifo():
            self.clear(path, keep_dir=False)
            os.mkfifo(path, 0o600)
            self.set_meta(path, m)
        # Character and block devices (and unknown types) are skipped: an image must not
        # bring host device nodes; the sandbox provides /dev.

    def link_target(self, m: tarfile.TarInfo) -> str:
        tparts = self.parts(m.linkname, m.name)
        if not tparts:
            raise self.bad(m.name, f"is a hardlink to the layer root ({m.linkname!r})")
        try:
            target = os.path.join(self.parent(tparts, m.name, create=False), tparts[-1])
            st = os.lstat(target)
        except FileNotFoundError:
            raise self.bad(m.name, f"is a hardlink to {m.linkname!r}, which is not earlier in the layer") from None
        if stat.S_ISDIR(st.st_mode):
            raise self.bad(m.name, f"is a hardlink to the directory {m.linkname!r}")
        return target

    def whiteout(self, parent: str, base: str, name: str) -> None:
        if base == ".wh..wh..opq":
            # Opaque directory: hides the lower layers' content of `parent`.
            os.setxattr(parent, "trusted.overlay.opaque", b"y", follow_symlinks=False)
            return
        if base.startswith(".wh..wh."):
            return  # other AUFS metadata (e.g. .wh..wh.plnk): meaningless here
        hidden = base[len(".wh."):]
        if hidden in ("", ".", ".."):
            raise self.bad(name, "is a whiteout of nothing")
        path = os.path.join(parent, hidden)
        if os.path.lexists(path):
            return  # whiteouts only hide lower layers' files, never this layer's (layer.md)
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))

    def set_meta(self, target: int | str, m: tarfile.TarInfo, *, link: bool = False) -> None:
        """Owner, then mode (chown clears setuid bits), then xattrs, then mtime."""
        ns = int(m.mtime * 1e9)
        if link:  # a symlink's own owner and mtime; symlinks have no mode of their own
            if self.as_root:
                os.chown(target, m.uid, m.gid, follow_symlinks=False)
            os.utime(target, ns=(ns, ns), follow_symlinks=False)
            return
        if self.as_root:  # unprivileged, files stay the importer's own
            os.chown(target, m.uid, m.gid)
        os.chmod(target, m.mode & 0o7777)
        for key, value in m.pax_headers.items():
            if key.startswith("SCHILY.xattr."):
                self.set_xattr(target, key[len("SCHILY.xattr."):], value)
        os.utime(target, ns=(ns, ns))

    @staticmethod
    def set_xattr(target: int | str, key: str, value: str) -> None:
        if not key.startswith(ALLOWED_XATTR_PREFIXES):
            return
        try:
            os.setxattr(target, key, value.encode("utf-8", "surrogateescape"))
        except OSError as e:
            if e.errno not in (errno.ENOTSUP, errno.EPERM, errno.EINVAL):
                raise  # best effort: a file system without xattrs still gets the file


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---- storing layers and images ---------------------------------------------------------------

@dataclass(frozen=True)
class LayerBlob:
    """One layer of an image being imported: its media type ("" when the source does not say,
    as in `docker save` archives: detected from the gzip/zstd magic numbers), digest as stored
    (None when unknown, as for legacy `docker save` layers) and how to open its bytes."""

    media_type: str
    digest: str | None
    open: Callable[[], AbstractContextManager[BinaryIO]]
    name: str  # for messages, e.g. "sha256:ab12… of debian:12"


def store_layer(store: ImageStore, blob: LayerBlob, diff_id: str) -> str:
    """Unpacks `blob` into the store's shared layer "sha256-<diff_id hex>" unless it is there;
    returns the key. Atomic: built in a staging directory, renamed into place, and the staging
    directory removed on any failure (so a retry starts clean)."""
    key = layer_key(diff_id)
    if store.has_layer(key):
        return key
    staged = store.staging_dir("layer")
    try:
        with blob.open() as src:
            media_type = blob.media_type
            if not media_type:
                media_type, src = _sniff(src)
            apply_layer(src, staged, media_type, blob.digest, diff_id, name=blob.name)
        store.commit_layer(key, staged)
    finally:
        remove_tree(staged)  # gone already after a successful commit
    return key


def import_image(store: ImageStore, *, name: str, config_digest: str, config_bytes: bytes,
                 layers: Sequence[LayerBlob], source: str) -> ImageMeta:
    """Registers the image whose config blob is `config_bytes` (verified against
    `config_digest`) and whose layers are `layers` (bottom first, as in a manifest), storing
    the layers that are missing. Idempotent: an image already in the store is returned as it
    is. The image id is `image_id_for(config_digest)`; `source` is e.g. "registry:REF".

    Raises ImageCorrupt, UnsupportedImage, ImagePullError, ResourceExhausted.
    """
    image_id = image_id_for(config_digest)
    if store.exists(image_id):
        return store.meta(image_id)
    verify_bytes(config_bytes, config_digest, f"config of {name}")
    parsed = parse_config(config_bytes, f"config of {name}")
    if len(parsed.diff_ids) != len(layers):
        raise ImageCorrupt(f"{name}: its config lists {len(parsed.diff_ids)} layers but its manifest "
                           f"{len(layers)}; the image is malformed")
    if not layers:
        raise UnsupportedImage(f"{name} has no layers: rollbox boots images with at least one layer")
    keys = [store_layer(store, blob, diff_id) for blob, diff_id in zip(layers, parsed.diff_ids)]
    # overlayfs refuses a directory twice in lowerdir; a layer that recurs is kept only at its
    # topmost place, which gives the same tree (the upper copy re-applies every path it has).
    top_first = list(dict.fromkeys(reversed(keys)))
    meta = ImageMeta(image_id, kind="oci", parent=None, created_at=time.time(), layers=top_first,
                     config=asdict(ImageConfig.from_oci(parsed.config)), source=source)
    return store.add_image(meta)
