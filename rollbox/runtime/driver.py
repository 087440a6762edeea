"""The runtime driver protocol: what the service needs from an isolation runtime.

Two drivers implement it: `runsc.Runsc` (gVisor, the default: a user-space kernel per
sandbox, memory snapshots) and `runc.Runc` (namespaces + seccomp + cgroups on the host kernel:
faster and lighter, weaker isolation, no memory snapshots on this host because CRIU fails).
"""

from __future__ import annotations

import asyncio
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Protocol, TypeVar

from .. import errors

RUNTIMES = ("gvisor", "runc")
T = TypeVar("T")
# errnos of a host short of something a start needs: more of it may be free on a retry.
_EXHAUSTED = {errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM}


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: bytes
    stderr: bytes


async def _spawn(argv: list[str], what: str, **kw: object) -> asyncio.subprocess.Process:
    """Starts a runtime CLI. Raises ResourceExhausted (retryable) when the host cannot start a
    process (out of processes, memory or file descriptors), RuntimeMissing when the binary
    cannot be run at all; both name the condition."""
    try:
        return await asyncio.create_subprocess_exec(*argv, **kw)  # type: ignore[arg-type]
    except OSError as e:
        if e.errno in _EXHAUSTED:
            raise errors.ResourceExhausted(f"could not start `{what}`: {e.strerror or e} (errno {e.errno}); the "
                                           "host is out of processes, memory or file descriptors: retry, or run "
                                           "fewer sandboxes at once") from e
        raise errors.RuntimeMissing(f"could not run `{what}` ({argv[0]}): {e}") from e


async def _finish(proc: asyncio.subprocess.Process, done: Awaitable[T], what: str, timeout: float) -> T:
    """Awaits `done` (the process's output or exit) for `timeout` seconds. Past that the process
    is killed, waited for, and SandboxLost raised; a process that exited by itself just then
    (gone before the kill reached it) is not an error: its result is returned."""
    fut = asyncio.ensure_future(done)
    try:
        return await asyncio.wait_for(asyncio.shield(fut), timeout)
    except asyncio.TimeoutError:
        try:
            proc.kill()
        except ProcessLookupError:  # it exited on its own: asyncio already closed its transport
            return await fut
        await proc.wait()
        fut.cancel()
        raise errors.SandboxLost(f"`{what}` did not finish in {timeout:g} s (killed)") from None
    except BaseException:  # cancelled: as before, the process is left to finish
        fut.cancel()
        raise


def _settle(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_exited(pids: list[int], timeout: float) -> bool:
    """Waits up to `timeout` seconds for every process in `pids` to exit (a zombie counts: its
    reaper is elsewhere). True when all have; a pid already gone counts as exited. A pidfd per
    process, readable at its exit: no polling of /proc."""
    loop = asyncio.get_running_loop()
    fds: list[int] = []
    waits: list[asyncio.Future[None]] = []
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            fds.append(fd)
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _settle, fut)
            waits.append(fut)
        if not waits:
            return True
        _done, pending = await asyncio.wait(waits, timeout=timeout)
        return not pending
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)


async def run_command(argv: list[str], *, what: str, timeout: float) -> RunResult:
    """Runs a runtime CLI verb to completion, output captured.

    Raises SandboxLost when it outlives `timeout` seconds (it is killed first); `what` names
    the verb in that message; ResourceExhausted or RuntimeMissing when it cannot start (`_spawn`).
    """
    proc = await _spawn(argv, what, stdin=asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await _finish(proc, proc.communicate(), what, timeout)
    return RunResult(proc.returncode or 0, out, err)


async def spawn_detached(argv: list[str], *, stdin_fd: int, stdout_fd: int, log_path: Path, what: str,
                         timeout: float) -> RunResult:
    """Runs a detaching `run`/`restore`: the container inherits stdin/stdout (the agent channel).

    stderr goes to `log_path` (a pipe would stay open in the sandbox and never reach EOF); the
    runtime runs in its own session so that signals to the daemon do not reach the sandbox.
    Returns the exit code and the log's last 2,000 bytes; raises SandboxLost after `timeout`
    seconds (the runtime CLI is killed; what it started is the caller's to clean up), and
    ResourceExhausted or RuntimeMissing when it cannot start (`_spawn`).
    """
    with open(log_path, "ab") as log:
        proc = await _spawn(argv, what, stdin=stdin_fd, stdout=stdout_fd, stderr=log, start_new_session=True)
    rc = await _finish(proc, proc.wait(), what, timeout)
    tail = log_path.read_bytes()[-2000:] if log_path.exists() else b""
    return RunResult(rc, b"", tail)


class Driver(Protocol):
    """One runtime's lifecycle verbs, against its own state root."""

    name: str
    supports_snapshots: bool

    def check(self) -> None:
        """Raises RuntimeMissing (with the install hint) when the runtime is absent."""

    def bundle_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The OCI spec (bundle.oci_spec's) with this runtime's own changes, for write_bundle."""

    async def start_detached(self, verb: str, container_id: str, bundle: Path, *, stdin_fd: int, stdout_fd: int,
                             log_path: Path, extra: tuple[str, ...] = (), networked: bool = False,
                             gpu: bool = False, privileged: bool = False, platform: str | None = None,
                             timeout: float = 60.0) -> RunResult:
        """Starts (`run`) or restores (`restore`) a container whose init gets stdin/stdout.
        `platform`: gVisor's (None: the runtime's default); a runtime without one ignores it."""

    async def delete(self, container_id: str) -> RunResult:
        """Force-deletes the container (killing what runs in it); waits until it is gone."""

    def forget(self, container_id: str) -> None:
        """Removes the runtime's state files for a container it could not delete."""

    def known(self, container_id: str) -> bool:
        """Whether the runtime has state for the container under its root (from its state
        files, not from what a command printed)."""

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



def start_failed(sandbox_id: str, exc: Exception, timeout_s: float) -> errors.RollboxError:
    """The typed, retryable error for a sandbox start that failed with an untyped `exc` (its
    host side already removed): ResourceExhausted when the host is short of something,
    SandboxLost otherwise; the message names the condition."""
    if isinstance(exc, asyncio.TimeoutError):
        return errors.SandboxLost(f"sandbox {sandbox_id} did not answer within {timeout_s:g} s of starting; "
                                  "see `rollbox doctor`", sandbox_id=sandbox_id)
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, OSError) and exc.errno in _EXHAUSTED:
        return errors.ResourceExhausted(f"starting sandbox {sandbox_id} failed, the host is short of resources "
                                        f"({what}); nothing of it is left: retry, or run fewer sandboxes at once",
                                        sandbox_id=sandbox_id)
    return errors.SandboxLost(f"starting sandbox {sandbox_id} failed ({what}); nothing of it is left: retry",
                              sandbox_id=sandbox_id)
