"""rootfs.disk_full: a failed write's cause told from the filesystem's free space (statvfs
stubbed: the boundary), for the nearest existing parent of a path that is not there yet."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollbox.runtime import rootfs


def _statvfs(free: int):  # type: ignore[no-untyped-def]
    return lambda _p: SimpleNamespace(f_bavail=free // 4096, f_frsize=4096)


def test_full_and_not_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "statvfs", _statvfs(1 << 20))
    assert rootfs.disk_full(tmp_path / "not" / "made" / "yet")
    monkeypatch.setattr(os, "statvfs", _statvfs(1 << 30))
    assert not rootfs.disk_full(tmp_path)


def test_unreadable_filesystem_is_not_called_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(_p: object) -> None:
        raise OSError("EIO")
    monkeypatch.setattr(os, "statvfs", fail)
    assert not rootfs.disk_full(tmp_path)
