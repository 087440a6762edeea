"""runsc command lines: the platform flag (daemon default, per-command override for restores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.errors import InvalidArgument
from rollbox.runtime.runsc import PLATFORMS, Runsc, platform_from_env


def test_platform_defaults_to_systrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLBOX_PLATFORM", raising=False)
    assert platform_from_env() == "systrap"
    monkeypatch.setenv("ROLLBOX_PLATFORM", " ptrace ")
    assert platform_from_env() == "ptrace"
    assert platform_from_env("systrap") == "systrap"  # an explicit value wins over the variable


@pytest.mark.parametrize("bad", ["kvm", "SYSTRAP", "ptrace --debug"])
def test_an_unknown_platform_names_the_choices(bad: str) -> None:
    with pytest.raises(InvalidArgument, match=", ".join(PLATFORMS)):
        platform_from_env(bad)


def test_argv_uses_the_daemon_platform_unless_a_command_names_its_own() -> None:
    r = Runsc(Path("/run/x"), binary="/bin/true", platform="ptrace")
    assert "--platform=ptrace" in r.argv("list")
    restore = r.argv("restore", platform="systrap")
    assert "--platform=systrap" in restore and "--platform=ptrace" not in restore


def test_delete_removes_what_a_restore_cut_short_left(tmp_path: Path) -> None:
    """CI: a daemon SIGKILLed mid-restore left runsc's lock file and socket without a state
    file; runsc's own delete then fails ("does not exist") and used to leave them for good."""
    import asyncio

    cid = "0123abcd"
    other = tmp_path / "ffff_sandbox:ffff.state"
    for name in (f"{cid}_sandbox:{cid}.lock", f"runsc-{cid}.sock"):
        (tmp_path / name).write_text("")
    other.write_text("{}")
    res = asyncio.run(Runsc(tmp_path, binary="/bin/false").delete(cid))
    assert res.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name]  # another sandbox's state stays


@pytest.mark.parametrize("good", [None, "systrap", "ptrace"])
def test_a_sandbox_platform_is_none_or_one_that_runs_here(good: str | None) -> None:
    from rollbox.config import check_platform
    assert check_platform(good) == good


@pytest.mark.parametrize("bad", ["kvm", "Ptrace", " ptrace", "", 1, ["ptrace"]])
def test_any_other_sandbox_platform_is_invalid_argument(bad: object) -> None:
    from rollbox.config import check_platform
    from rollbox.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match="systrap, ptrace"):
        check_platform(bad)
