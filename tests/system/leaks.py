"""The end-of-session leak check (tests/conftest.py runs it once every test and fixture is done):
nothing a test sandbox made may remain on the host."""

from __future__ import annotations

import os
import subprocess
import time

from rollbox.client.default import default_client
from rollbox.config import Paths
from rollbox.runtime import cgroups

CGROUP_GRACE_S = 15.0  # the watchdog removes a cgroup the kernel still called busy within a few 1 s passes


def leftovers(paths: Paths) -> list[str]:
    """Everything of a terminated test sandbox still on the host, each as one line; [] if none.

    Terminates the sandboxes still live first: this is the suite's own state directory
    (tests/conftest.py), so everything in it is a test's. A live sandbox is not a leak here;
    what its teardown leaves behind is.
    """
    client = default_client()
    for s in client.request("GET", "/sandboxes"):
        client.request("DELETE", f"/sandboxes/{s['sandbox_id']}")
    out: list[str] = []
    runsc = subprocess.run(["runsc", "--root", str(paths.runsc_root), "list", "-quiet"],
                           capture_output=True, text=True).stdout.split()
    out += [f"runsc container {c}" for c in runsc]
    if paths.runc_root.exists():
        runc = subprocess.run(["runc", "--root", str(paths.runc_root), "list", "-q"],
                              capture_output=True, text=True).stdout.split()
        out += [f"runc container {c}" for c in runc]
    out += [f"sandbox directory {paths.sandboxes / d}" for d in os.listdir(paths.sandboxes)]
    with open("/proc/self/mounts") as f:
        out += [f"mount {line.split()[1]}" for line in f if str(paths.sandboxes) in line]
    deadline = time.monotonic() + CGROUP_GRACE_S
    while cgroups.leftover_ids(paths.cgroup_parent) and time.monotonic() < deadline:
        time.sleep(0.5)
    out += [f"cgroup {c}" for c in sorted(cgroups.leftover_ids(paths.cgroup_parent))]
    procs = subprocess.run(["pgrep", "-f", f"runsc-sandbox --root={paths.runsc_root}"], capture_output=True,
                           text=True).stdout.split()
    out += [f"runsc-sandbox process {p}" for p in procs]
    out += [f"internal snapshot {s['snapshot_id']}" for s in client.request("GET", "/snapshots") if s["internal"]]
    return out


class LeakError(AssertionError):
    """Something a test sandbox made outlived it (listed in the message)."""


def check_no_leftovers(paths: Paths) -> None:
    """Raises LeakError naming every leftover (see `leftovers`)."""
    found = leftovers(paths)
    if found:
        raise LeakError(f"{len(found)} leftovers of test sandboxes on the host ({paths.home}): "
                        + "; ".join(found[:50]))
