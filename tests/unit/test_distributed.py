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
