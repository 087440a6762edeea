"""The Ray backend's pure parts: backend choice, transfer items, Ray missing."""

from __future__ import annotations

import sys

import pytest

import rollbox
from rollbox.distributed import resolve_backend
from rollbox.distributed.transfer import Item


def test_backend_names() -> None:
    assert resolve_backend(None) == "local"  # until rollbox.init()
    assert resolve_backend("ray") == "ray" and resolve_backend("local") == "local"
    with pytest.raises(rollbox.InvalidArgument, match="backend='slurm'"):
        resolve_backend("slurm")
    with pytest.raises(rollbox.InvalidArgument):
        rollbox.SandboxPool("sn-" + "0" * 24, backend="k8s")


def test_transfer_item_paths() -> None:
    assert Item("snapshot", "sn-1").rel() == "snapshots/sn-1"
    assert Item("image", "im-1").rel() == "images/im-1"
    assert Item("layer", "sha256-ab").rel() == "images/_layers/sha256-ab"
    for bad in ("../x", "", ".hidden", "a/b"):
        with pytest.raises(rollbox.InvalidArgument):
            Item("snapshot", bad).rel()


def test_ray_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollbox.distributed import backend

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(rollbox.RuntimeMissing, match=r"rollbox\[ray\]"):
        backend.require_ray()
    with pytest.raises(rollbox.RuntimeMissing):
        rollbox.init()


def test_pack_keeps_holes_of_sparse_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint's pages file is mostly holes: it travels as holes, not as zeros."""
    from rollbox.config import Paths
    from rollbox.distributed.transfer import pack, unpack

    src, dst = Paths(tmp_path / "a"), Paths(tmp_path / "b")
    snap = src.home / "snapshots" / "sn-1"
    snap.mkdir(parents=True)
    with open(snap / "pages.img", "wb") as f:
        f.truncate(256 << 20)  # 256 MiB, all hole
        f.write(b"data at the start")
    (snap / "meta.json").write_text("{}")
    data = pack(src, Item("snapshot", "sn-1"))
    assert isinstance(data, bytes) and len(data) < 1 << 20
    assert unpack(dst, Item("snapshot", "sn-1"), data) is True
    out = dst.home / "snapshots" / "sn-1" / "pages.img"
    assert out.stat().st_size == 256 << 20 and out.stat().st_blocks * 512 < 1 << 20
    assert out.read_bytes()[:17] == b"data at the start"
