"""`rollbox daemon stop` takes the daemon's own cgroup parents with it (gh-19 item 10)."""

from __future__ import annotations

import os
import subprocess
import sys

from rollbox.client.transport import stop_daemon
from rollbox.runtime.cgroups import CGROUP_ROOT
from tests.system.conftest import side_home


def _parents(parent: str) -> list[str]:
    return [ctl for ctl in os.listdir(CGROUP_ROOT) if (CGROUP_ROOT / ctl / parent).is_dir()]


def test_daemon_stop_removes_its_cgroup_parents(paths) -> None:
    side = side_home(paths, "stop")
    env = {**os.environ, "ROLLBOX_HOME": str(side.home)}
    code = "import rollbox; sb = rollbox.Sandbox(memory=256).create(); sb.exec('true'); sb.terminate()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=180)
    assert _parents(side.cgroup_parent)  # its sandbox's cgroups lived under them
    stop_daemon(side)
    assert _parents(side.cgroup_parent) == []
