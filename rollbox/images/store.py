"""The image store: images are chains of read-only layers, stacked by overlayfs.

    images/<image_id>/meta.json   ImageMeta
    images/<image_id>/rootfs      the image's own layer, for kinds "debian" (a full rootfs),
                                  "filesystem" and "build" (an overlay upper directory with
                                  overlayfs whiteouts); absent for "oci"
    images/_layers/<key>/         shared, content-addressed layers ("oci" images list them by
                                  key, e.g. "sha256-<hex of the uncompressed diff>"), each in
                                  overlayfs form (whiteouts as 0:0 character devices, opaque
                                  directories with the trusted.overlay.opaque xattr)

A sandbox's root filesystem is overlayfs(lowerdir = layers top first, upper = its own). An
image's layers are its `layers` (top first) or its own rootfs, then its parent's.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ImageNotFound, InvalidArgument
from ..runtime.rootfs import copy_tree, remove_tree, tree_usage
from .debian import DEBIAN_IMAGE_ID, build_debian_rootfs

MAX_DEPTH = 128
LAYERS_DIR = "_layers"


@dataclass(frozen=True)
class ImageConfig:
    """What an OCI image config (or a builder step) says about running the image.

    env: "KEY=value" strings; working_dir, user ("uid[:gid]" or a name): for commands;
    entrypoint + cmd: the image's main process; exposed_ports ("8080/tcp") and labels: what
    the image declares (recorded, not acted on: a sandbox's ports are set at create time).
    """

    env: list[str] = field(default_factory=list)
    working_dir: str | None = None
    user: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    exposed_ports: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_oci(cls, config: dict[str, Any] | None) -> "ImageConfig":
        """From the "config" object of an OCI/Docker image config JSON."""
        c = config or {}
        return cls(env=list(c.get("Env") or []), working_dir=c.get("WorkingDir") or None,
                   user=c.get("User") or None, entrypoint=c.get("Entrypoint") or None, cmd=c.get("Cmd") or None,
                   exposed_ports=sorted(c.get("ExposedPorts") or {}), labels=dict(c.get("Labels") or {}))

    def env_dict(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env if "=" in e)


@dataclass(frozen=True)
class ImageMeta:
    image_id: str
    kind: str  # "debian" | "filesystem" | "build" | "oci"
    parent: str | None
    created_at: float
    # Shared layer keys under images/_layers, top first ("oci" images; empty: own rootfs).
    layers: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # asdict(ImageConfig)
    source: str = ""  # where it came from: "registry:REF", "docker-archive:PATH", "build:STEP", ...

    @property
    def image_config(self) -> ImageConfig:
        return ImageConfig(**self.config) if self.config else ImageConfig()


def new_image_id() -> str:
    return "im-" + secrets.token_hex(12)


# How to repair an incomplete image: the same pull, import or build stores what is missing.
INCOMPLETE_HINT = ("pull, import or build it again (that stores what is missing), or remove it "
                   "(`rollbox image rm {image_id}`)")


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        # image id -> (meta.json's (inode, mtime ns, size), its ImageMeta): every start reads
        # an image's metadata three times (2-5 % of the daemon's time per runc sandbox).
        self._metas: dict[str, tuple[tuple[int, int, int], ImageMeta]] = {}

    def _dir(self, image_id: str) -> Path:
        if not image_id or "/" in image_id or image_id.startswith("."):
            raise InvalidArgument(f"{image_id!r} is not an image id (expected e.g. 'im-…')")
        return self.root / image_id

    def exists(self, image_id: str) -> bool:
        """True when the image and its own layers are on disk (so a pull, import or build that
        finds a layer missing stores it again instead of returning the broken image)."""
        d = self._dir(image_id)
        if not (d / "meta.json").is_file():
            return False
        keys = self.meta(image_id).layers
        return all(self.has_layer(k) for k in keys) if keys else (d / "rootfs").is_dir()

    # ---- shared layers ---------------------------------------------------------------------

    def layer_dir(self, key: str) -> Path:
        """The shared layer `key` ("sha256-<64 hex>" or another [A-Za-z0-9-] name)."""
        if not key or not all(c.isalnum() or c == "-" for c in key):
            raise InvalidArgument(f"{key!r} is not a layer key")
        return self.root / LAYERS_DIR / key

    def has_layer(self, key: str) -> bool:
        return self.layer_dir(key).is_dir()

    def staging_dir(self, name: str) -> Path:
        """A fresh directory on the store's file system for building a layer or image before
        `commit_layer`/`add_image` move it in (so a failure never leaves a half-written one)."""
        d = self.root / LAYERS_DIR / f".tmp-{name}-{secrets.token_hex(6)}"
        d.mkdir(parents=True)
        return d

    def commit_layer(self, key: str, staged: Path) -> Path:
        """Moves a fully written layer into place; if another writer won the race, keeps
        theirs and removes `staged`. Returns the layer's directory."""
        dest = self.layer_dir(key)
        try:
            os.rename(staged, dest)
        except OSError:
            if not dest.is_dir():
                raise
            remove_tree(staged)
        return dest

    def add_image(self, meta: ImageMeta, rootfs: Path | None = None) -> ImageMeta:
        """Registers an image whose layers (and parent) already exist; `rootfs`: a staged
        directory that becomes the image's own layer. Atomic: meta.json is written last."""
        for key in meta.layers:
            if not self.has_layer(key):
                raise ImageNotFound(f"layer {key} of image {meta.image_id} is not in the store")
        if meta.parent is not None:
            self.meta(meta.parent)
        d = self._dir(meta.image_id)
        d.mkdir(parents=True, exist_ok=True)
        if rootfs is not None:
            os.rename(rootfs, d / "rootfs")
        self._write_meta(meta)
        return meta

    def sizes(self) -> list[dict[str, Any]]:
        """Every image with `own_bytes` (its own layer, or its shared layers), `total_bytes`
        (its whole chain) and `shared_bytes` (the part of total that other images use too):
        a layer is stored once however many images use it."""
        metas = {m.image_id: m for m in self.list()}
        cache: dict[Path, int] = {}

        def size(p: Path) -> int:
            if p not in cache:
                cache[p] = tree_usage(p)[0] if p.is_dir() else 0
            return cache[p]

        chains = {i: self.layers(i, check=False) for i in metas}
        users: dict[Path, int] = {}
        for chain in chains.values():
            for p in chain:
                users[p] = users.get(p, 0) + 1
        out = []
        for i, m in metas.items():
            own = [self.layer_dir(k) for k in m.layers] if m.layers else [self._dir(i) / "rootfs"]
            out.append({**asdict(m), "own_bytes": sum(size(p) for p in own),
                        "total_bytes": sum(size(p) for p in chains[i]),
                        "shared_bytes": sum(size(p) for p in chains[i] if users[p] > 1)})
        return out

    def prune(self) -> dict[str, Any]:
        """Removes shared layers no image lists and staging left by an interrupted write."""
        freed, removed = 0, []
        for key in self.unused_layers():
            freed += tree_usage(self.layer_dir(key))[0]
            self.remove_layer(key)
            removed.append(key)
        self.remove_staging(older_than_s=3600)
        return {"removed_layers": removed, "freed_bytes": freed}

    def unused_layers(self) -> list[str]:
        """Shared layers no image lists (what `prune` removes)."""
        used = {k for m in self.list() for k in m.layers}
        base = self.root / LAYERS_DIR
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if not p.name.startswith(".") and p.name not in used)

    def remove_layer(self, key: str) -> None:
        remove_tree(self.layer_dir(key))

    def remove_staging(self, older_than_s: float = 0.0) -> None:
        """Removes staging directories a crashed writer left behind (only those untouched
        for `older_than_s` seconds: a pull or build in progress keeps its own)."""
        base = self.root / LAYERS_DIR
        if base.is_dir():
            now = time.time()
            for p in base.iterdir():
                if p.name.startswith(".tmp-") and now - p.stat().st_mtime >= older_than_s:
                    remove_tree(p)

    def meta(self, image_id: str) -> ImageMeta:
        """The image's metadata (re-read whenever meta.json changed on disk).

        Raises:
            ImageNotFound: no such image.
        """
        f = self._dir(image_id) / "meta.json"
        try:
            st = os.stat(f)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            hit = self._metas.get(image_id)
            if hit is not None and hit[0] == key:
                return hit[1]
            m = ImageMeta(**json.loads(f.read_text()))
            self._metas[image_id] = (key, m)
            return m
        except FileNotFoundError:
            hint = (" (build it with `rollbox image build-base`)" if image_id == DEBIAN_IMAGE_ID
                    else ": list images with `rollbox image ls`")
            raise ImageNotFound(f"image {image_id!r} not found{hint}") from None

    def layers(self, image_id: str, *, check: bool = True) -> list[Path]:
        """The image's layer directories, top first (overlayfs `lowerdir` order).

        Raises ImageNotFound for an unknown image, or with `check` one that is incomplete on
        disk (a layer directory or a parent image missing); InvalidArgument past MAX_DEPTH
        layers. Without `check`, the chain simply ends at a missing parent (for listings)."""
        out: list[Path] = []
        cur: str | None = image_id
        while cur is not None:
            try:
                m = self.meta(cur)
            except ImageNotFound:
                if cur == image_id:
                    raise
                if not check:
                    break
                raise ImageNotFound(f"image {image_id!r} is incomplete: its parent image {cur!r} is missing; "
                                    f"{INCOMPLETE_HINT.format(image_id=image_id)}") from None
            if m.layers:
                out.extend(self.layer_dir(k) for k in m.layers)
            else:
                out.append(self._dir(cur) / "rootfs")
            if len(out) > MAX_DEPTH:
                raise InvalidArgument(f"image {image_id} has more than {MAX_DEPTH} layers")
            cur = m.parent
        # A layer directory removed behind the store's back (by hand, a partial copy of the
        # state directory) would only surface as overlayfs' ENOENT at mount: name it here.
        for layer in out if check else ():
            if not layer.is_dir():
                raise ImageNotFound(f"image {image_id!r} is incomplete: its layer directory {layer} is missing; "
                                    f"{INCOMPLETE_HINT.format(image_id=image_id)}")
        return out

    def ensure_debian(self) -> str:
        """Builds the default base image if missing (serialised by a lock file); returns its id."""
        if self.exists(DEBIAN_IMAGE_ID):
            return DEBIAN_IMAGE_ID
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".debian.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.exists(DEBIAN_IMAGE_ID):
                d = self._dir(DEBIAN_IMAGE_ID)
                d.mkdir(parents=True, exist_ok=True)
                build_debian_rootfs(d / "rootfs", d / "build.log")
                self._write_meta(ImageMeta(DEBIAN_IMAGE_ID, "debian", None, time.time()))
        return DEBIAN_IMAGE_ID

    def _write_meta(self, meta: ImageMeta) -> None:
        p = self._dir(meta.image_id) / "meta.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(meta)))
        tmp.rename(p)

    def create_from_upper(self, upper: Path, parent: str) -> ImageMeta:
        """A new image whose top layer is a copy of a sandbox's upper directory."""
        self.meta(parent)
        image_id = new_image_id()
        d = self._dir(image_id)
        d.mkdir(parents=True)
        try:
            copy_tree(upper, d / "rootfs")
            meta = ImageMeta(image_id, "filesystem", parent, time.time(), config=self.meta(parent).config)
            self._write_meta(meta)
        except BaseException:
            remove_tree(d)
            raise
        return meta

    def children(self, image_id: str) -> list[str]:
        return [m.image_id for m in self.list() if m.parent == image_id]

    def delete(self, image_id: str) -> None:
        """Removes an image's layer. The caller checks that nothing uses it."""
        self.meta(image_id)
        remove_tree(self._dir(image_id))

    def list(self) -> list[ImageMeta]:
        out = []
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                if d.name != LAYERS_DIR and (d / "meta.json").is_file():
                    out.append(self.meta(d.name))
        return out
