"""Volume: a named persistent directory that sandboxes mount, read-write or read-only.

    vol = Volume(name="trajectories", mount_path="/data")
    sb = Sandbox(volumes=[vol]).create()          # created on first use
    sb.exec("sh", "-c", "echo step1 > /data/ep0.txt")
    vol.read_file("/ep0.txt")                     # from the host, through the daemon
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..client.default import default_client
from ..client.transport import Client
from ..names import check_volume_name
from ..types import FileEntry
from ._aio import synchronized


@dataclass(frozen=True)
class Volume:
    """A named volume and where sandboxes see it.

    Args:
        name: 1-63 characters of [a-z0-9._-]; the volume is created on first use.
        mount_path: absolute path inside the sandbox (e.g. "/data"); not "/", /proc, /dev, /sys.
        read_only: mount it read-only. A read-write mount is refused with VolumeBusy while
            another sandbox mounts the volume read-write and either of them is gVisor: gVisor
            cannot keep concurrent writes to one file intact (two sandboxes appending to one
            file overwrite each other's lines), so a volume has one gVisor writer at a time,
            beside any number of read-only mounts; runc sandboxes may share a read-write mount.
        shared_writes: waive that guarantee for a fleet whose sandboxes each write their own
            files (one output file per episode): every sandbox mounting the volume with
            shared_writes=True may write it at once (pools, forks and warm spares included).
            Two of them writing ONE file (appends, a shared log) can lose lines. Such mounts
            are still refused beside a plain read-write mount of the volume.

    Host-side methods take paths relative to the volume root ("/ep0.txt" = <mount_path>/ep0.txt)
    and never leave the volume (`..` and symlinks raise InvalidArgument).

    Raises:
        InvalidArgument: a name outside that alphabet (it becomes part of request URLs).
    """

    name: str
    mount_path: str = "/data"
    read_only: bool = False
    shared_writes: bool = False
    client: Client | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_volume_name(self.name)
        if self.read_only and self.shared_writes:
            raise errors.InvalidArgument(f"volume {self.name!r}: read_only=True and shared_writes=True contradict; "
                                         "pick one")

    def _c(self) -> Client:
        return self.client or default_client()

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "mount_path": self.mount_path, "read_only": self.read_only,
                "shared_writes": self.shared_writes}

    async def _call(self, op: str, body: dict[str, Any]) -> Any:
        return await self._c().aio.request("POST", f"/volumes/{self.name}/files/{op}", json=body)

    @synchronized
    async def create(self) -> "Volume":
        """Creates the volume now (it is also created when a sandbox first mounts it)."""
        await self._c().aio.request("PUT", f"/volumes/{self.name}")
        return self

    @synchronized
    async def write_file(self, path: str, data: bytes | str) -> None:
        """Writes a file into the volume from the host (atomic rename; creates parents)."""
        raw = data.encode() if isinstance(data, str) else data
        await self._call("write", {"path": path, "data": base64.b64encode(raw).decode()})

    @synchronized
    async def read_file(self, path: str) -> bytes:
        """Raises NotFound when there is no such file."""
        return base64.b64decode((await self._call("read", {"path": path}))["data"])

    @synchronized
    async def list_files(self, path: str = "/") -> list[FileEntry]:
        return [FileEntry(**e) for e in (await self._call("list", {"path": path}))["entries"]]

    @synchronized
    async def remove(self, path: str) -> None:
        await self._call("remove", {"path": path})

    @synchronized
    async def delete(self) -> None:
        """Deletes the volume and its files. Raises InvalidState while a sandbox mounts it."""
        await self._c().aio.request("DELETE", f"/volumes/{self.name}")

    @staticmethod
    def list(client: Client | None = None) -> list[dict[str, Any]]:
        """Every volume: name, host path, size in bytes, file count."""
        return list((client or default_client()).request("GET", "/volumes"))
