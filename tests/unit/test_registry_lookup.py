"""Registry.lookup's error for a sandbox whose agent channel closed: which ending it reports.

A real SQLite store and a real (never opened) AgentChannel; no daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox import errors
from rollbox.runtime.channel import AgentChannel
from rollbox.server.registry import Live, Registry
from rollbox.server.store import Store

SID = "sb-" + "ab" * 12


def _live(tmp_path: Path) -> Live:
    ch = AgentChannel(SID, tmp_path / "in", tmp_path / "out")
    return Live(sandbox_id=SID, channel=ch, image_id="im-x", cpu=1.0, memory_mib=256, env={}, keep_warm_seconds=None)


def test_closed_channel_not_yet_classified_is_lost_not_terminated(tmp_path: Path) -> None:
    # A sandbox killed from outside: the channel closes first, the process watch classifies
    # the ending a moment later. Until then the caller must get the retryable SandboxLost
    # (it was reported as SandboxTerminated('terminated'), a final error, under load).
    reg = Registry(Store(tmp_path / "db.sqlite"))
    lv = _live(tmp_path)
    lv.channel.fail("the sandbox closed its agent channel")
    reg.live[SID] = lv
    with pytest.raises(errors.SandboxLost):
        reg.lookup(SID)


def test_classified_ending_picks_its_error(tmp_path: Path) -> None:
    reg = Registry(Store(tmp_path / "db.sqlite"))
    lv = _live(tmp_path)
    lv.channel.fail("the sandbox ended (init_exited)")
    lv.exit_reason = "init_exited"
    reg.live[SID] = lv
    with pytest.raises(errors.SandboxTerminated):
        reg.lookup(SID)
    lv.exit_reason = "exited"
    with pytest.raises(errors.SandboxLost):
        reg.lookup(SID)
