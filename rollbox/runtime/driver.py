"""The runtime driver protocol: what the service needs from an isolation runtime.

Two drivers implement it: `runsc.Runsc` (gVisor, the default: a user-space kernel per
sandbox, memory snapshots) and `runc.Runc` (namespaces + seccomp + cgroups on the host kernel:
faster and lighter, weaker isolation, no memory snapshots on this host because CRIU fails).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import errors

RUNTIMES = ("gvisor", "runc")


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: bytes
    stderr: bytes


class Driver(Protocol):
    """One runtime's lifecycle verbs, against its own state root."""

    name: str
    supports_snapshots: bool

    def check(self) -> None:
        """Raises RuntimeMissing (with the install hint) when the runtime is absent."""

    async def start_detached(self, verb: str, container_id: str, bundle: Path, *, stdin_fd: int, stdout_fd: int,
                             log_path: Path, extra: tuple[str, ...] = (), networked: bool = False,
                             gpu: bool = False, privileged: bool = False, timeout: float = 60.0) -> RunResult:
        """Starts (`run`) or restores (`restore`) a container whose init gets stdin/stdout."""

    async def delete(self, container_id: str) -> RunResult:
        """Force-deletes the container (killing what runs in it); waits until it is gone."""

    def forget(self, container_id: str) -> None:
        """Removes the runtime's state files for a container it could not delete."""

    async def list_ids(self) -> list[str]:
        """Container ids the runtime knows under its state root."""

    def processes(self, container_id: str) -> list[tuple[int, str]]:
        """(pid, role) of the host processes of a container; role "sandbox" is the one to watch."""


def check_runtime(runtime: str) -> str:
    """Validates a runtime name; raises InvalidArgument naming the choices."""
    if runtime not in RUNTIMES:
        raise errors.InvalidArgument(f"runtime={runtime!r} is not one of {', '.join(map(repr, RUNTIMES))}: "
                                     "'gvisor' (default, strong isolation, memory snapshots) or 'runc' "
                                     "(namespaces + seccomp on the host kernel: faster, weaker isolation)")
    return runtime


def no_snapshots(sandbox_id: str, what: str) -> errors.UnsupportedOperation:
    """The error for a memory-snapshot operation on a sandbox whose runtime cannot capture memory."""
    return errors.UnsupportedOperation(
        f"{what} of sandbox {sandbox_id}: memory snapshots (snapshot_memory, fork, pause) need the gVisor "
        "runtime; this sandbox runs on runc (CRIU does not work on this host). Create it with "
        "runtime='gvisor' (the default), or use create_image_from_filesystem() for its files", sandbox_id=sandbox_id)
