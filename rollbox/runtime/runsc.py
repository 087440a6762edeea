"""The `runsc` CLI, one coroutine per verb. The only module that builds runsc command lines.

Flags follow ../shared/PLATFORM.md: the systrap platform (no KVM needed), `--overlay2=none`
because the root filesystem is a host overlayfs per sandbox (its upper directory is the
sandbox's filesystem snapshot), and `--network=none` (loopback only) for sandboxes without networking. A networked sandbox runs
gVisor's netstack (`--network=sandbox`) in the namespace its spec names, started through the
work-around PLATFORM.md records: runsc takes any namespace where
/proc/sys/net/core/rmem_default exists for the root one, so it runs in a private mount
namespace with a tmpfs over /proc/sys/net. `--net-disconnect-ok` lets a checkpoint drop open
TCP connections instead of failing (a server that has answered a request keeps one in
TIME_WAIT for a minute).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import psutil

from ..config import DEFAULT_PLATFORM, PLATFORMS, RUNSC_INSTALL_HINT, platform_from_env
from ..errors import RuntimeMissing
from .driver import RunResult, run_command, spawn_detached, wait_exited

INSTALL_HINT = RUNSC_INSTALL_HINT
__all__ = ["DEFAULT_PLATFORM", "INSTALL_HINT", "PLATFORMS", "Runsc", "platform_from_env"]

NETNS_WRAPPER = ("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                 'mount -t tmpfs rollbox-netns /proc/sys/net && exec "$@"', "rollbox-runsc")


def _role_in(argv: list[str] | None, container_id: str) -> str | None:
    """"sandbox" or "gofer" when `argv` is that runsc process of `container_id` (runsc names
    them runsc-sandbox / runsc-gofer and passes the id on their command line), else None."""
    if argv and argv[0] in ("runsc-sandbox", "runsc-gofer") and any(container_id in a for a in argv):
        return argv[0].removeprefix("runsc-")
    return None


def _runsc_role(pid: int, container_id: str) -> str | None:
    """`_role_in` for one pid (None when it is gone or unreadable)."""
    try:
        return _role_in(psutil.Process(pid).cmdline(), container_id)
    except psutil.Error:
        return None


def runsc_processes(container_id: str) -> list[tuple[int, str]]:
    """(pid, "sandbox" | "gofer") of the runsc processes that serve one container, found by
    scanning every process's command line (psutil)."""
    found = ((p.pid, _role_in(p.info["cmdline"], container_id)) for p in psutil.process_iter(["cmdline"]))
    return [(pid, role) for pid, role in found if role is not None]


RunscResult = RunResult  # the name this module used before the driver protocol


class Runsc:
    """Runs runsc verbs against one state root (`--root`). Safe to share between tasks.

    The gVisor driver of the runtime protocol (driver.Driver)."""

    name = "gvisor"
    supports_snapshots = True

    def __init__(self, root: Path, *, binary: str | None = None, platform: str = DEFAULT_PLATFORM,
                 network: str = "none") -> None:
        self.root = root
        self.binary = binary or shutil.which("runsc") or ""
        self.platform = platform
        self.network = network

    def check(self) -> None:
        """Raises RuntimeMissing with the install hint when runsc is absent."""
        if not self.binary or not os.access(self.binary, os.X_OK):
            raise RuntimeMissing(f"gVisor runsc is not installed: {INSTALL_HINT}")

    def argv(self, *verb: str, networked: bool = False, gpu: bool = False, privileged: bool = False,
             platform: str | None = None) -> list[str]:
        """platform: this command's gVisor platform (default: the daemon's); a restore must use
        the platform its checkpoint was taken on (a systrap image does not restore on ptrace)."""
        self.check()
        net = ["--network=sandbox", "--net-disconnect-ok"] if networked else [f"--network={self.network}"]
        # nvproxy: the sandbox's GPU ioctls go to the host driver (gvisor.dev/docs/user_guide/gpu).
        nv = ["--nvproxy", "--nvproxy-docker"] if gpu else []
        if privileged:
            nv.append("--net-raw")  # Docker inside needs raw sockets
        return [self.binary, "--root", str(self.root), f"--platform={platform or self.platform}", *net, *nv,
                "--overlay2=none", *verb]

    async def run(self, *verb: str, timeout: float = 60.0) -> RunscResult:
        return await run_command(self.argv(*verb), what=f"runsc {' '.join(verb)}", timeout=timeout)

    @staticmethod
    def bundle_spec(spec: dict[str, Any]) -> dict[str, Any]:
        """gVisor runs bundle.oci_spec as it is."""
        return spec

    async def start_detached(self, verb: str, container_id: str, bundle: Path, *, stdin_fd: int,
                             stdout_fd: int, log_path: Path, extra: tuple[str, ...] = (), networked: bool = False, gpu: bool = False,
                             privileged: bool = False, platform: str | None = None,
                             timeout: float = 60.0) -> RunscResult:
        """`runsc run|restore -detach` (driver.spawn_detached: stdin/stdout are the agent channel).

        networked: gVisor's netstack in the network namespace named by the bundle's spec.
        """
        argv = self.argv(verb, "-detach", *extra, "--bundle", str(bundle), container_id, networked=networked, gpu=gpu,
                         privileged=privileged, platform=platform)
        if networked:
            argv = [*NETNS_WRAPPER, *argv]
        return await spawn_detached(argv, stdin_fd=stdin_fd, stdout_fd=stdout_fd, log_path=log_path,
                                    what=f"runsc {verb} of {container_id}", timeout=timeout)

    async def list_ids(self) -> list[str]:
        res = await self.run("list", "-quiet", timeout=30)
        return [line for line in res.stdout.decode().split() if line]

    async def checkpoint(self, container_id: str, image_path: Path, *, leave_running: bool) -> RunscResult:
        extra = ["--leave-running"] if leave_running else []
        # Uncompressed pages restore faster (PLATFORM.md: ~190-250 ms vs ~220-310 ms).
        return await self.run("checkpoint", "--image-path", str(image_path), "--compression=none",
                              *extra, container_id, timeout=300)

    async def delete(self, container_id: str) -> RunscResult:
        """Ends the container's sandbox and removes runsc's state of it. A sandbox whose state
        file names live processes is ended here (`_kill`); otherwise `runsc delete -force`."""
        if await self._kill(container_id):
            return RunscResult(0, b"", b"")
        res = await self.run("delete", "-force", container_id, timeout=20)
        # runsc leaves its control socket behind when a sandbox died badly (and then refuses
        # to create a container with the same id), and a restore cut short by a daemon crash
        # leaves its lock file without a state file (CI: `runsc state` left after a SIGKILL
        # mid-map). Without a state file runsc knows nothing more of it: remove the rest.
        if not self.known(container_id):
            self.forget(container_id)
        return res

    async def _kill(self, container_id: str, wait_s: float = 10.0) -> bool:
        """What `runsc delete -force` does to a one-container sandbox (SIGKILL its sandbox and
        gofer processes, wait for them to go, remove the state files under --root), without a
        runsc process: one fewer Go binary start per episode (a no-op `runsc delete` alone costs
        7 ms of CPU here, `perf stat`; a real one also loads and locks the container's state
        and talks to its sandbox). The caller reaps (the daemon is the
        processes' subreaper). False, with nothing done, when the state file is missing or
        names no live process of this container: runsc then deletes it."""
        state = self.root / f"{container_id}_sandbox:{container_id}.state"
        try:
            d = json.loads(state.read_text())
            listed = [(int(d["sandbox"]["pid"]), "sandbox"), (int(d["goferPid"]), "gofer")]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        found = [pid for pid, role in listed if pid > 0 and _runsc_role(pid, container_id) == role]
        if not found:
            return False
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not await wait_exited(found, wait_s):
            return False  # runsc tries next (and the teardown kills by id after it)
        self.forget(container_id)
        return True

    def processes(self, container_id: str) -> list[tuple[int, str]]:
        """(pid, "sandbox" | "gofer") from runsc's state file, checked against each pid's
        command line; a scan of /proc when the file is missing or stale. The scan reads every
        process's cmdline: with hundreds of sandboxes up it was a fifth of the daemon's time."""
        state = self.root / f"{container_id}_sandbox:{container_id}.state"
        try:
            d = json.loads(state.read_text())
            listed = [(int(d["sandbox"]["pid"]), "sandbox"), (int(d["goferPid"]), "gofer")]
        except (OSError, ValueError, KeyError, TypeError):
            return runsc_processes(container_id)
        found = [(pid, role) for pid, role in listed if pid > 0 and _runsc_role(pid, container_id) == role]
        return found or runsc_processes(container_id)

    def known(self, container_id: str) -> bool:
        """runsc keeps `<id>_sandbox:<id>.state` under its root for every container it knows."""
        return (self.root / f"{container_id}_sandbox:{container_id}.state").exists()

    def forget(self, container_id: str) -> None:
        """Removes runsc's own state files for a container it could not delete."""
        for p in self.root.glob(f"*{container_id}*"):
            try:
                p.unlink()
            except OSError:
                pass
