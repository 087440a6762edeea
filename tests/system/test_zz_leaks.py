"""Runs last: nothing a test sandbox made may remain on the host."""

from __future__ import annotations

import os
import subprocess
import time

from rollbox.runtime import cgroups
from rollbox.sdk.sandbox import default_client


def test_no_leftovers_after_suite(paths) -> None:
    client = default_client()
    # This is the suite's own state directory (tests/conftest.py): everything here is ours.
    live = {s["sandbox_id"] for s in client.request("GET", "/sandboxes")}
    for sid in live:
        client.request("DELETE", f"/sandboxes/{sid}")
    out = subprocess.run(["runsc", "--root", str(paths.runsc_root), "list", "-quiet"],
                         capture_output=True, text=True).stdout.split()
    assert out == [], f"runsc containers left: {out}"
    runc = subprocess.run(["runc", "--root", str(paths.runc_root), "list", "-q"],
                          capture_output=True, text=True).stdout.split()
    assert runc == [], f"runc containers left: {runc}"
    assert os.listdir(paths.sandboxes) == []
    with open("/proc/self/mounts") as f:
        assert [line for line in f if str(paths.sandboxes) in line] == []
    # A cgroup the kernel still called busy at teardown (an OOM-killed sandbox's last process
    # still exiting) is the watchdog's to remove within a few of its 1 s passes.
    deadline = time.monotonic() + 15
    while cgroups.leftover_ids(paths.cgroup_parent) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cgroups.leftover_ids(paths.cgroup_parent) == set()
    procs = subprocess.run(["pgrep", "-f", f"runsc-sandbox --root={paths.runsc_root}"], capture_output=True,
                           text=True).stdout.split()
    assert procs == []
    internal = [s for s in client.request("GET", "/snapshots") if s["internal"]]
    assert internal == []
