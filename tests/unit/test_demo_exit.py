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


def test_demo_refuses_runc_without_containers_before_any_snapshot(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """New-user trial: `--isolation sandbox --runtime runc` printed the gVisor banner and made a
    snapshot before failing; the flag check comes first now."""
    import pytest

    from rollbox import errors
    from rollbox.demos import humaneval

    def no_snapshot(*_a, **_k):  # type: ignore[no-untyped-def]
        raise AssertionError("a snapshot was made for flags that must be refused")
    monkeypatch.setattr(humaneval, "prepare_snapshot", no_snapshot)
    with pytest.raises(errors.InvalidArgument, match="isolation='container'"):
        humaneval.run_demo(isolation="sandbox", runtime="runc", limit=1)
