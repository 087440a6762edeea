"""The daemon's /metrics move with real work, and `rollbox top --once` renders them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rollbox.cli.top import MetricsSample
from rollbox.sdk.sandbox import default_client


def _scrape() -> MetricsSample:
    return MetricsSample.parse(default_client().get_text("/metrics"))


def test_metrics_move_after_create_and_exec(make_sandbox) -> None:
    before = _scrape()
    sb = make_sandbox(memory=256)
    for _ in range(3):
        assert sb.exec("true").ok
    runc = make_sandbox(runtime="runc", memory=256)
    assert runc.exec("true").ok
    after = _scrape()
    assert after.total("rollbox_starts_total", kind="create", runtime="gvisor") \
        == before.total("rollbox_starts_total", kind="create", runtime="gvisor") + 1
    assert after.total("rollbox_starts_total", runtime="runc") == before.total("rollbox_starts_total", runtime="runc") + 1
    assert after.total("rollbox_exec_seconds_count") >= before.total("rollbox_exec_seconds_count") + 4
    assert after.total("rollbox_start_seconds_count") >= before.total("rollbox_start_seconds_count") + 2
    assert after.total("rollbox_sandboxes", state="running", runtime="runc") >= 1
    assert after.total("rollbox_sandboxes", state="running", runtime="gvisor") >= 1
    assert after.total("rollbox_admission_limit") >= 2


def test_restore_failures_are_counted(make_sandbox) -> None:
    import rollbox
    import pytest

    before = _scrape().total("rollbox_start_failures_total")
    with pytest.raises(rollbox.RollboxError):
        make_sandbox(runtime="runc", memory=256, image=rollbox.Image.from_id("im-000000000000000000000000"))
    # Unknown images fail before a start is attempted: not a start failure.
    assert _scrape().total("rollbox_start_failures_total") == before


def test_top_once_renders() -> None:
    out = subprocess.run([sys.executable, "-m", "rollbox", "top", "--once", "--interval", "0.2"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "sandboxes" in out.stdout and "admission limit" in out.stdout
    # Piped (not a terminal), the live view appends a frame per interval instead of printing
    # nothing until it is stopped.
    proc = subprocess.Popen([sys.executable, "-m", "rollbox", "top", "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    time.sleep(3)
    proc.terminate()
    out_text, _ = proc.communicate(timeout=30)
    assert out_text.count("admission limit") >= 2, out_text[-2000:]
