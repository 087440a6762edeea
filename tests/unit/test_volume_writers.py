"""MountRegistry: a volume has one gVisor writer at a time (gh-19 item 9)."""

from __future__ import annotations

import pytest

from rollbox import errors
from rollbox.volumes.writers import MountRegistry

RW = [{"name": "v", "mount_path": "/data"}]
RO = [{"name": "v", "mount_path": "/data", "read_only": True}]


def test_second_gvisor_writer_is_refused_until_the_first_ends_gh19() -> None:
    reg = MountRegistry()
    reg.claim("sb-a", "gvisor", RW)
    with pytest.raises(errors.VolumeBusy, match="sb-a") as e:
        reg.claim("sb-b", "gvisor", RW)
    assert e.value.sandbox_id == "sb-b" and isinstance(e.value, errors.InvalidState)
    assert reg.users("v") == ["sb-a"]  # nothing recorded for the refused one
    reg.release("sb-a")
    reg.claim("sb-b", "gvisor", RW)


@pytest.mark.parametrize("first,second", [("gvisor", "runc"), ("runc", "gvisor")])
def test_gvisor_and_runc_writers_do_not_mix_gh19(first: str, second: str) -> None:
    reg = MountRegistry()
    reg.claim("sb-a", first, RW)
    with pytest.raises(errors.VolumeBusy):
        reg.claim("sb-b", second, RW)


def test_runc_writers_share_and_readers_go_anywhere_gh19() -> None:
    reg = MountRegistry()
    for i in range(8):
        reg.claim(f"sb-r{i}", "runc", RW)
    reg.claim("sb-g", "gvisor", RO)
    reg2 = MountRegistry()
    reg2.claim("sb-w", "gvisor", RW)
    for i in range(8):
        reg2.claim(f"sb-{i}", "gvisor" if i % 2 else "runc", RO)
    # Another volume is another matter; a re-claim by the same sandbox (a resume) is fine.
    reg2.claim("sb-x", "gvisor", [{"name": "other", "mount_path": "/o"}])
    reg2.claim("sb-w", "gvisor", RW)


def test_check_records_nothing_and_counts_every_holder() -> None:
    reg = MountRegistry()
    reg.claim("sb-a", "gvisor", RW)
    with pytest.raises(errors.VolumeBusy):
        reg.check(None, "gvisor", RW)  # a fork's copies would write beside their source
    reg.check(None, "gvisor", RO)
    assert reg.users("v") == ["sb-a"]


def test_recovery_records_without_refusing() -> None:
    reg = MountRegistry()
    reg.claim("sb-a", "gvisor", RW)
    reg.claim("sb-b", "gvisor", RW, check=False)
    assert sorted(reg.users("v")) == ["sb-a", "sb-b"]


SHARED = [{"name": "v", "mount_path": "/data", "shared_writes": True}]


def test_shared_writes_mounts_share_but_never_beside_an_exclusive_writer() -> None:
    reg = MountRegistry()
    for i in range(8):
        reg.claim(f"sb-{i}", "gvisor", SHARED)  # a fleet writing one file per episode
    reg.check(None, "gvisor", SHARED)  # its forks and spares too
    with pytest.raises(errors.VolumeBusy, match="shared_writes=True"):
        reg.claim("sb-x", "gvisor", RW)  # a writer that was promised it writes alone
    reg2 = MountRegistry()
    reg2.claim("sb-w", "gvisor", RW)
    with pytest.raises(errors.VolumeBusy):
        reg2.claim("sb-s", "gvisor", SHARED)
    reg2.claim("sb-r", "gvisor", RO)


def test_sdk_volume_sends_shared_writes_and_refuses_contradiction() -> None:
    from rollbox.sdk.volume import Volume
    assert Volume(name="v", shared_writes=True).to_wire()["shared_writes"] is True
    with pytest.raises(errors.InvalidArgument, match="contradict"):
        Volume(name="v", read_only=True, shared_writes=True)
