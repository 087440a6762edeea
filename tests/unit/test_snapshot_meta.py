"""Snapshot metadata read by other versions: unknown keys ignored, a corrupt one isolated."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from rollbox.errors import InvalidState, SnapshotNotFound
from rollbox.snapshots.store import SnapshotMeta, SnapshotStore


def _write(store: SnapshotStore, sid: str, raw: object) -> None:
    store.dir(sid).mkdir(parents=True)
    (store.dir(sid) / "meta.json").write_text(json.dumps(raw) if not isinstance(raw, str) else raw)


def test_keys_from_a_newer_version_are_ignored(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    meta = SnapshotMeta("sn-" + "1" * 24, "sb-x", "im-x", 1.0, 512, platform="ptrace")
    _write(store, meta.snapshot_id, {**asdict(meta), "field_from_the_future": {"x": 1}})
    assert store.meta(meta.snapshot_id) == meta


def test_a_corrupt_meta_is_a_typed_error_and_does_not_hide_the_others(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    good = SnapshotMeta("sn-" + "2" * 24, "sb-x", "im-x", 1.0, 512)
    _write(store, good.snapshot_id, asdict(good))
    for i, bad in enumerate(["{not json", [1, 2], {"snapshot_id": "sn-x"}]):
        sid = "sn-" + str(3 + i) * 24
        _write(store, sid, bad)
        with pytest.raises(InvalidState, match="snapshot rm"):
            store.meta(sid)
    assert [m.snapshot_id for m in store.list()] == [good.snapshot_id]
    with pytest.raises(SnapshotNotFound):
        store.meta("sn-" + "9" * 24)


def test_volume_names_are_checked_before_they_reach_a_url() -> None:
    from rollbox import InvalidArgument, Volume

    for bad in ("../sandboxes/sb-" + "0" * 24, "a/b", "", "UPPER"):
        with pytest.raises(InvalidArgument, match="volume name"):
            Volume(name=bad)
