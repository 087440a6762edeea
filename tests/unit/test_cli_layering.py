"""The CLI talks to the daemon only through the client: `image build-base` asks the daemon
(POST /images/debian) and never writes the image store itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_build_base_goes_through_the_daemon(tmp_path: Path) -> None:
    env = dict(os.environ, ROLLBOX_HOME=str(tmp_path / "home"), ROLLBOX_URL=f"unix://{tmp_path}/no-daemon.sock")
    r = subprocess.run([sys.executable, "-m", "rollbox", "image", "build-base"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "DaemonUnavailable" in r.stderr and "no rollbox daemon answers" in r.stderr, r.stderr
    assert not (tmp_path / "home").exists()  # no store made behind a daemon's back
