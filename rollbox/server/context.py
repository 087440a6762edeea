"""The host handles every room of the service shares: state paths, runtime drivers, the SQLite
store, image/snapshot/volume stores, the network manager, the reaper and the metrics.

Built once by the façade (`service.SandboxService`); the rooms hold it instead of each other.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from ..config import Paths
from ..images.store import ImageStore
from ..network.manager import NetworkManager
from ..runtime.driver import Driver
from ..runtime.mounts import DiskTemplates
from ..runtime.reaper import Reaper
from ..runtime.runc import Runc
from ..runtime.runsc import Runsc
from ..snapshots.store import SnapshotStore
from ..volumes.store import VolumeStore
from .metrics import Metrics
from .registry import Registry
from .store import Store


@dataclass
class ServiceContext:
    paths: Paths
    runsc: Runsc
    runc: Runc
    # The runtime drivers by name (driver.RUNTIMES): gVisor is the default.
    drivers: dict[str, Driver]
    store: Store
    cg: str  # the cgroup parent of every sandbox's cgroups
    images: ImageStore
    snapshots: SnapshotStore
    volumes: VolumeStore
    net: NetworkManager
    reaper: Reaper
    metrics: Metrics
    registry: Registry
    # The agent new sandboxes boot from, pinned at daemon start (runtime/agentdir.py).
    agent_src: Path
    # Formatted disk images that capped sandboxes' writable layers are copied from.
    disk_templates: DiskTemplates | None = None

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.paths.sandboxes / sandbox_id

    def upper_dir(self, sandbox_id: str) -> Path:
        """The sandbox's writable layer: everything it wrote (on a capped tmpfs with `disk`)."""
        return self.sandbox_dir(sandbox_id) / "disk" / "upper"

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        """Removes a snapshot's directory and row, in use or not (callers check)."""
        await asyncio.to_thread(self.snapshots.remove, snapshot_id)
        self.store.delete_snapshot(snapshot_id)
