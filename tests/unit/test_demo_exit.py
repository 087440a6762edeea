"""`rollbox demo humaneval` (what `make demo` runs) fails only when containment did: a slow
program's timeout is a status, an episode that reached the host or saw a trace is a failure."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from rollbox.cli.main import app
from rollbox.demos import humaneval


@pytest.mark.parametrize("breached,code", [(False, 0), (True, 1)])
def test_demo_exit_status_follows_containment(monkeypatch: pytest.MonkeyPatch, breached: bool, code: int) -> None:
    monkeypatch.setattr(humaneval, "run_demo", lambda **kw: {"breached": breached})
    res = CliRunner().invoke(app, ["demo", "humaneval", "--limit", "1"])
    assert res.exit_code == code, res.output


def test_rm_rf_root_that_times_out_counts_as_contained() -> None:
    statuses: dict[str, Any] = {kind: st for kind, (_body, st) in humaneval.ADVERSARIAL.items()}
    assert "timeout" in statuses["rm_rf_root"] and "timeout" in statuses["alloc_4gib"]
