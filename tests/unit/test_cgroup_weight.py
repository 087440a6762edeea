"""A pausing sandbox's CPU weight (server/autopause.py): lowered to the minimum while its
checkpoint runs, put back when the pause does not happen."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.runtime import cgroups


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    return tmp_path


def test_lowered_then_restored_on_both_versions(root: Path) -> None:
    v1, v2 = root / "cpu/rb/c1", root / "unified/rb/c1"
    v1.mkdir(parents=True), v2.mkdir(parents=True)
    (v1 / "cpu.shares").write_text("1024\n")
    (v2 / "cpu.weight").write_text("100\n")
    saved = cgroups.lower_cpu_weight("c1", "rb")
    assert saved == (1024, 100)
    assert (v1 / "cpu.shares").read_text() == str(cgroups.MIN_CPU_SHARES)
    assert (v2 / "cpu.weight").read_text() == str(cgroups.MIN_CPU_WEIGHT)
    cgroups.restore_cpu_weight("c1", saved, "rb")
    assert (v1 / "cpu.shares").read_text() == "1024"
    assert (v2 / "cpu.weight").read_text() == "100"


def test_a_missing_cgroup_is_left_alone(root: Path) -> None:
    assert cgroups.lower_cpu_weight("gone", "rb") == (None, None)
    cgroups.restore_cpu_weight("gone", (1024, None), "rb")  # no error, nothing created
    assert not (root / "cpu").exists()
