"""On-disk layout of memory snapshots.

    snapshots/<snapshot_id>/checkpoint/   `runsc checkpoint` image (pages uncompressed)
    snapshots/<snapshot_id>/upper/        copy of the sandbox's overlay upper at capture time
    snapshots/<snapshot_id>/meta.json     SnapshotMeta

A restore mounts a copy of `upper` over the same image layers and runs `runsc restore` with a
bundle whose spec matches the captured one (same mounts and limits), so the restored
processes find the filesystem they left.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument, InvalidState, SnapshotNotFound
from ..runtime.rootfs import remove_tree, tree_usage

log = logging.getLogger("rollbox.snapshots")


@dataclass(frozen=True)
class SnapshotMeta:
    snapshot_id: str
    source_sandbox_id: str
    image_id: str
    cpu: float
    memory_mib: int
    env: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    internal: bool = False  # made by fork(); removed when the forks are up
    volumes: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "mount_path", "read_only"}]
    kind: str = "memory"  # memory | pause | fork
    agent_key: str = ""  # hex; the restored agent keeps the key it had (it is in its memory)
    # NetworkSpec.to_wire() of a networked source (its netstack needs an interface on restore).
    network: dict[str, Any] | None = None
    disk_mib: int | None = None  # the source's writable-layer cap; copies get the same
    platform: str = ""  # gVisor platform of the checkpoint ("" from before it was kept: systrap)
    agent_pinned: bool = False  # its directory holds agent/, the build its processes run
    pids: int | None = None  # the source's task limit (RLIMIT_NPROC, in its memory); None: 512
    # The source's bounded memory-backed mounts {path in the sandbox: MiB}, mounted again on
    # restore; None: taken before rollbox bounded them (no such mounts).
    tmpfs: dict[str, int] | None = None


def new_snapshot_id() -> str:
    return "sn-" + secrets.token_hex(12)


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def dir(self, snapshot_id: str) -> Path:
        if not snapshot_id.startswith("sn-") or "/" in snapshot_id:
            raise InvalidArgument(f"{snapshot_id!r} is not a snapshot id (expected 'sn-' + 24 hex digits)")
        return self.root / snapshot_id

    def checkpoint_dir(self, snapshot_id: str) -> Path:
        return self.dir(snapshot_id) / "checkpoint"

    def upper_dir(self, snapshot_id: str) -> Path:
        return self.dir(snapshot_id) / "upper"

    def write_meta(self, meta: SnapshotMeta) -> None:
        p = self.dir(meta.snapshot_id) / "meta.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(meta)))
        tmp.rename(p)

    def meta(self, snapshot_id: str) -> SnapshotMeta:
        """Raises SnapshotNotFound, or InvalidState for a meta.json that cannot be read.

        Keys this version does not know (a newer rollbox wrote them) are ignored, so a
        downgrade or a mixed-version cluster still reads every snapshot it can restore."""
        try:
            raw = json.loads((self.dir(snapshot_id) / "meta.json").read_text())
            known = {f.name for f in fields(SnapshotMeta)}
            return SnapshotMeta(**{k: v for k, v in raw.items() if k in known})
        except FileNotFoundError:
            raise SnapshotNotFound(f"snapshot {snapshot_id!r} not found: list them with `rollbox snapshot ls`") from None
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise InvalidState(f"snapshot {snapshot_id!r} has an unreadable meta.json ({type(e).__name__}: {e}); "
                               f"delete it with `rollbox snapshot rm {snapshot_id}`") from None

    def size_bytes(self, snapshot_id: str) -> int:
        return tree_usage(self.dir(snapshot_id))[0]

    def remove(self, snapshot_id: str) -> None:
        remove_tree(self.dir(snapshot_id))

    def list(self) -> list[SnapshotMeta]:
        out = []
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                if (d / "meta.json").is_file():
                    try:
                        out.append(self.meta(d.name))
                    except InvalidState as e:  # one bad snapshot must not hide the others
                        log.warning("%s", e)
        return out
