"""What one daemon's sandboxes hold on the host right now, counted from the host's side.

Used by the churn test, `make soak` and `rollbox doctor`: after every sandbox has ended, each
count but the prepared network slots must be zero. Counted from the kernel and the filesystem
(not from the daemon's own bookkeeping), so a leak the daemon forgot about still shows.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass

import psutil

from ..config import Paths
from ..network.netns import NetLayout
from ..runtime import cgroups


@dataclass(frozen=True)
class HostInventory:
    """Counts of host objects that belong to one state directory's sandboxes.

    netns / links / nft_elements include the daemon's prepared (ready) network slots: two
    namespaces, one host link and one firewall element per ready slot are expected.
    """

    mounts: int  # mount points under ROLLBOX_HOME/sandboxes (root overlays, writable layers)
    loop_devices: int  # loop devices backed by a file under ROLLBOX_HOME/sandboxes
    cgroups: int  # sandbox cgroup directories under any controller
    netns: int  # network namespaces named for this daemon
    links: int  # host network interfaces named for this daemon
    nft_elements: int  # elements in the daemon's egress firewall map
    processes: int  # runsc processes of this state directory (a runc container's show as runc_containers)
    state_entries: int  # entries in ROLLBOX_HOME/sandboxes
    ready_slots: int = 0  # prepared network slots (from the daemon; 0 when it is down)
    runc_containers: int = 0  # runc tier containers still in runc's state root

    def leaked(self) -> dict[str, int]:
        """Every count beyond what the prepared network slots explain; all zero when clean."""
        r = self.ready_slots
        return {"mounts": self.mounts, "loop_devices": self.loop_devices, "cgroups": self.cgroups,
                "netns": max(0, self.netns - 2 * r), "links": max(0, self.links - r),
                "nft_elements": max(0, self.nft_elements - r), "processes": self.processes,
                "state_entries": self.state_entries, "runc_containers": self.runc_containers}

    def total_leaked(self) -> int:
        return sum(self.leaked().values())

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _lines(argv: list[str]) -> list[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return []


def take(paths: Paths, ready_slots: int = 0) -> HostInventory:
    """Counts what `paths.home`'s sandboxes hold on the host now."""
    under = str(paths.sandboxes) + "/"
    with open("/proc/self/mounts") as f:
        mounts = sum(1 for line in f if line.split()[1].startswith(under))
    loops = sum(1 for ln in _lines(["losetup", "-a"]) if under in ln)
    cg = len(cgroups.leftover_ids(paths.cgroup_parent))
    layout = NetLayout.for_home(str(paths.home))
    nss = sum(1 for ln in _lines(["ip", "netns", "list"]) if ln.split() and ln.split()[0].startswith(layout.prefix + "-"))
    links = sum(1 for ln in _lines(["ip", "-o", "link"])
                if len(ln.split(":")) > 1 and ln.split(":")[1].strip().split("@")[0].startswith(layout.prefix))
    elems = 0
    out = "\n".join(_lines(["nft", "-j", "list", "map", "inet", layout.table, "egress"]))
    if out:
        try:
            elems = len(json.loads(out)["nftables"][1]["map"].get("elem", []))
        except (ValueError, KeyError, IndexError):
            pass
    root_arg = f"--root={paths.runsc_root}"
    procs = sum(1 for p in psutil.process_iter(["cmdline"]) if any(root_arg in a for a in p.info["cmdline"] or ()))
    entries = len(os.listdir(paths.sandboxes)) if paths.sandboxes.is_dir() else 0
    runc = paths.runc_root
    runc_left = sum(1 for p in runc.iterdir() if (p / "state.json").is_file()) if runc.is_dir() else 0
    return HostInventory(mounts, loops, cg, nss, links, elems, procs, entries, ready_slots, runc_left)
