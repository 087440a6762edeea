"""Moving a snapshot and the image it needs between state directories (`ROLLBOX_HOME`s).

A snapshot restores only where its image's layers exist, so shipping one means shipping an
ordered list of `Item`s: shared layers, then images from the root of the chain down, then
the snapshot itself. Every item is named by an immutable id (snapshot and image ids are
never reused, layer keys are content digests), so "this home has it" is a presence check:
a node that already holds an item pays nothing for it.

Each item travels as one uncompressed tar (GNU tar: overlayfs whiteouts are character
devices and opaque directories carry `trusted.overlay.opaque` xattrs, which Python's tarfile
drops). It is unpacked into a staging directory next to its destination and renamed into
place, so a half-written item is never visible and two concurrent imports do not collide.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import errors
from ..config import Paths
from ..images.store import LAYERS_DIR, ImageStore
from ..runtime.rootfs import remove_tree
from ..snapshots.store import SnapshotStore

ItemKind = Literal["layer", "image", "snapshot"]
TAR_FLAGS = ["--xattrs", "--xattrs-include=trusted.*", "--xattrs-include=user.*", "--numeric-owner"]


@dataclass(frozen=True)
class Item:
    """One transferable piece of a state directory: a shared layer, an image or a snapshot."""

    kind: ItemKind
    key: str

    def rel(self) -> str:
        """Its directory, relative to ROLLBOX_HOME."""
        if not self.key or "/" in self.key or self.key.startswith("."):
            raise errors.InvalidArgument(f"{self.key!r} is not a {self.kind} id")
        if self.kind == "layer":
            return f"images/{LAYERS_DIR}/{self.key}"
        if self.kind == "image":
            return f"images/{self.key}"
        if self.kind == "snapshot":
            return f"snapshots/{self.key}"
        raise errors.InvalidArgument(f"unknown transfer item kind {self.kind!r}")


def items_for_snapshot(paths: Paths, snapshot_id: str) -> list[Item]:
    """What a home needs to restore `snapshot_id`, in the order to import it (dependencies first).

    Raises:
        SnapshotNotFound: `paths` has no such snapshot. ImageNotFound: its image chain is broken.
    """
    meta = SnapshotStore(paths.snapshots).meta(snapshot_id)
    images = ImageStore(paths.images)
    chain: list[str] = []
    cur: str | None = meta.image_id
    while cur is not None:
        if cur in chain:
            raise errors.InvalidArgument(f"image {meta.image_id} has a parent cycle at {cur}")
        chain.append(cur)
        cur = images.meta(cur).parent
    out: list[Item] = []
    for image_id in reversed(chain):  # root first: add_image checks the parent exists
        out += [Item("layer", k) for k in images.meta(image_id).layers if Item("layer", k) not in out]
        out.append(Item("image", image_id))
    out.append(Item("snapshot", snapshot_id))
    return out


def has_item(paths: Paths, item: Item) -> bool:
    """True when `paths` already holds `item` complete (its meta.json is written last)."""
    d = paths.home / item.rel()
    return d.is_dir() if item.kind == "layer" else (d / "meta.json").is_file()


def missing(paths: Paths, items: list[Item]) -> list[Item]:
    """The items `paths` lacks, in the given order."""
    return [i for i in items if not has_item(paths, i)]


def pack(paths: Paths, item: Item, dest: Path | None = None) -> bytes | Path:
    """One item as an uncompressed tar: returned as bytes, or written to `dest` (a file, e.g.
    in a directory every node can read) and that path returned.

    Raises:
        NotFound: `paths` does not hold the item. RollboxError: tar failed.
    """
    src = paths.home / item.rel()
    if not has_item(paths, item):
        raise errors.NotFound(f"{item.kind} {item.key} is not in {paths.home}; nothing to send")
    # --sparse: holes (a checkpoint's unused memory pages) travel as holes, not zeros.
    argv = ["tar", *TAR_FLAGS, "--sparse", "-C", str(src), "-cf", str(dest) if dest else "-", "."]
    if dest is not None:
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}")
        argv[argv.index(str(dest))] = str(tmp)
        res = subprocess.run(argv, capture_output=True)
        if res.returncode == 0:
            os.rename(tmp, dest)
            return dest
        tmp.unlink(missing_ok=True)
    else:
        res = subprocess.run(argv, capture_output=True)
        if res.returncode == 0:
            return res.stdout
    raise errors.RollboxError(f"packing {item.kind} {item.key} failed: {res.stderr.decode(errors='replace')[-500:]}")


def unpack(paths: Paths, item: Item, data: bytes | Path) -> bool:
    """Installs a packed item into `paths`; False when it was already there (nothing done).

    Raises:
        RollboxError: the archive is unreadable or the disk is full (nothing is left behind).
    """
    if has_item(paths, item):
        return False
    dest = paths.home / item.rel()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".incoming-{dest.name}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        if isinstance(data, Path):
            res = subprocess.run(["tar", *TAR_FLAGS, "-C", str(staging), "-xf", str(data)], capture_output=True)
        else:
            res = subprocess.run(["tar", *TAR_FLAGS, "-C", str(staging), "-xf", "-"], input=data, capture_output=True)
        if res.returncode != 0:
            raise errors.RollboxError(f"unpacking {item.kind} {item.key} into {paths.home} failed: "
                                      f"{res.stderr.decode(errors='replace')[-500:]}")
        if dest.exists() and not has_item(paths, item):
            remove_tree(dest)  # a torn leftover (no meta.json), never a complete item
        try:
            os.rename(staging, dest)
        except OSError:
            if not has_item(paths, item):
                raise
            return False  # another import won the race
        return True
    finally:
        if staging.exists():
            remove_tree(staging)
