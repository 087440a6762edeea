"""Teardown is all-or-retried (gh-19): a sandbox shows `terminated` only when everything it made
on the host is gone; a step that fails (here: its cgroup kept busy by a host process) leaves
it `terminating`, and the watchdog retries until the step succeeds."""

from __future__ import annotations

import subprocess
import time

import rollbox
from rollbox.runtime import cgroups
from tests.system.conftest import host_traces


def test_busy_cgroup_keeps_terminating_until_the_retry_removes_it(paths) -> None:
    sb = rollbox.Sandbox(memory=256).create()
    cid = sb.sandbox_id.removeprefix("sb-")
    dirs = cgroups.controller_dirs(cid, paths.cgroup_parent)
    assert dirs
    # A host process inside the sandbox's cgroup: rmdir answers EBUSY until it exits.
    squatter = subprocess.Popen(["sleep", "60"])
    try:
        (dirs[0] / "cgroup.procs").write_text(str(squatter.pid))
        sb.terminate()
        assert str(sb.info().state) == "terminating"
        assert [t for t in host_traces(paths, sb.sandbox_id) if t.startswith("cgroup")]
        time.sleep(2)
        assert str(sb.info().state) == "terminating"  # not called done while its cgroup is there
    finally:
        squatter.kill()
        squatter.wait()
    deadline = time.monotonic() + 30
    while str(sb.info().state) != "terminated":
        assert time.monotonic() < deadline, f"teardown never retried: {host_traces(paths, sb.sandbox_id)}"
        time.sleep(0.3)
    assert host_traces(paths, sb.sandbox_id) == []
