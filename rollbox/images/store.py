"""The image store: each image is a directory of one read-only layer plus its parent's chain.

    images/<image_id>/rootfs      the layer (a full rootfs for a base image, an overlay
                                  upper directory with whiteouts for a derived one)
    images/<image_id>/meta.json   {"image_id", "parent", "kind", "created_at"}

A sandbox's root filesystem is overlayfs(lowerdir = layers top first, upper = its own).
"""

from __future__ import annotations

import fcntl
import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ImageNotFound, InvalidArgument
from ..runtime.rootfs import copy_tree, remove_tree
from .debian import DEBIAN_IMAGE_ID, build_debian_rootfs

MAX_DEPTH = 64


@dataclass(frozen=True)
class ImageMeta:
    image_id: str
    kind: str  # "debian" | "filesystem"
    parent: str | None
    created_at: float


def new_image_id() -> str:
    return "im-" + secrets.token_hex(12)


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, image_id: str) -> Path:
        if not image_id or "/" in image_id or image_id.startswith("."):
            raise InvalidArgument(f"{image_id!r} is not an image id (expected e.g. 'im-…')")
        return self.root / image_id

    def exists(self, image_id: str) -> bool:
        d = self._dir(image_id)
        return (d / "rootfs").is_dir() and (d / "meta.json").is_file()

    def meta(self, image_id: str) -> ImageMeta:
        d = self._dir(image_id)
        try:
            return ImageMeta(**json.loads((d / "meta.json").read_text()))
        except FileNotFoundError:
            hint = (" (build it with `rollbox image build-base`)" if image_id == DEBIAN_IMAGE_ID
                    else ": list images with `rollbox image ls`")
            raise ImageNotFound(f"image {image_id!r} not found{hint}") from None

    def layers(self, image_id: str) -> list[Path]:
        """The image's layer directories, top first (overlayfs `lowerdir` order)."""
        out: list[Path] = []
        cur: str | None = image_id
        while cur is not None:
            if len(out) >= MAX_DEPTH:
                raise InvalidArgument(f"image {image_id} has more than {MAX_DEPTH} layers")
            m = self.meta(cur)
            out.append(self._dir(cur) / "rootfs")
            cur = m.parent
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
            meta = ImageMeta(image_id, "filesystem", parent, time.time())
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
                if (d / "meta.json").is_file():
                    out.append(self.meta(d.name))
        return out
