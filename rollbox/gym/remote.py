"""The trainer's side of a sandboxed env: the sandbox, the env server in it, the connection.

Per-step path: a TCP connection to the env server, through the port the daemon exposes on the
host's loopback (measured here: ~0.25 ms per round trip at p50, against ~3 ms for a file write
and ~6 ms for a file read through the agent, and ~18 ms for an exec). The server is started
once per image and captured in a memory snapshot with numpy and gymnasium imported; every env
is a restore of it (no interpreter start, no imports).

Sandboxes are kept alive while their env is open: TCP traffic does not count as API activity
for `keep_warm_seconds`, so a background thread touches them; when the trainer exits, that
stops and the daemon's keep_warm backstop ends what it leaves behind.
"""

from __future__ import annotations

import atexit
import importlib.resources
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..client.transport import daemon_running
from ..sdk.image import Image
from ..sdk.sandbox import Sandbox, SandboxInstance, default_client
from .channel import Channel, EnvTimeout, RemoteEnvError, _Broken, _TimedOut, remote_error

__all__ = ["Channel", "EnvTimeout", "RemoteEnvError", "Remote", "SandboxSettings", "ServerSnapshot", "remote_error"]

PORT = 7700  # inside the sandbox's own network namespace
REMOTE_DIR = "/opt/rollbox-gym"
PACKAGE = "rollbox_gym_remote"
SERVER_LOG = "/tmp/rollbox-gym.log"
SHIPPED = ("wire.py", "spaces.py", "server.py")
BASE_TTL_S = 3600.0  # a base snapshot that expires is made again on the next make()
@dataclass(frozen=True)
class SandboxSettings:
    """How env sandboxes are made (see `rollbox.gym.make`)."""

    image: Image
    cpu: float = 1.0
    memory: int = 1024
    keep_warm_seconds: float = 600.0
    timeout: float | None = None
    connect_timeout: float = 120.0
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerSnapshot:
    """A memory snapshot of a sandbox whose env server listens (and maybe holds an env)."""

    snapshot_id: str
    token: str
    owned: bool = True  # deleted when this process is done with it


class Remote:
    """One sandbox with an env server, and the connection to it."""

    def __init__(self, sandbox: SandboxInstance, channel: Channel, settings: SandboxSettings, token: str) -> None:
        self.sandbox = sandbox
        self.channel = channel
        self.settings = settings
        self.token = token
        self.closed = False
        _keepalive.add(self)

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.sandbox_id

    def send(self, op: str, **args: Any) -> None:
        try:
            self.channel.send(op, **args)
        except (_Broken, _TimedOut) as e:
            raise self._lost(e) from None

    def recv(self) -> Any:
        try:
            return self.channel.recv()
        except (_Broken, _TimedOut) as e:
            raise self._lost(e) from None

    def call(self, op: str, **args: Any) -> Any:
        self.send(op, **args)
        return self.recv()

    def _lost(self, e: Exception) -> errors.RollboxError:
        sid = self.sandbox_id
        if isinstance(e, _TimedOut):
            self.terminate()
            return EnvTimeout(f"the env in sandbox {sid} did not answer within {self.settings.timeout:g} s; "
                              "its sandbox was terminated", sandbox_id=sid)
        try:
            info = self.sandbox.info()
            state = f"sandbox state {info.state}" + (f" ({info.exit_reason})" if info.exit_reason else "")
        except errors.RollboxError as ie:
            state = f"sandbox unreachable: {ie}"
        log = ""
        try:
            log = self.sandbox.fs.read_file(SERVER_LOG).decode(errors="replace")[-1500:]
        except errors.RollboxError:
            pass
        self.terminate()
        return errors.SandboxLost(f"lost the env in sandbox {sid}: {e} ({state})"
                                  + (f"; its server log ends:\n{log}" if log else ""), sandbox_id=sid)

    def detach(self) -> None:
        """Closes the connection cleanly (the server goes back to accept(), the env stays)."""
        self.call("detach")
        self.channel.close()

    def reconnect(self) -> None:
        url = self.sandbox.list_urls()[PORT]
        self.channel = _connect(url, self.token, self.sandbox_id, self.settings)

    def terminate(self) -> None:
        """Closes the connection and terminates the sandbox (idempotent)."""
        if self.closed:
            return
        self.closed = True
        _keepalive.discard(self)
        self.channel.close()
        try:
            self.sandbox.terminate()
        except errors.RollboxError:
            pass


def _connect(url: str, token: str, sandbox_id: str, settings: SandboxSettings) -> Channel:
    try:
        return Channel(url, token, sandbox_id, timeout=settings.timeout, connect_timeout=settings.connect_timeout)
    except _Broken as e:
        raise errors.SandboxLost(f"sandbox {sandbox_id}: {e}", sandbox_id=sandbox_id) from None


def restore(snap: ServerSnapshot, settings: SandboxSettings) -> Remote:
    """A new sandbox restored from `snap`, connected.

    Raises SnapshotNotFound (the snapshot is gone), SandboxLost (it did not come up)."""
    sb = Sandbox(keep_warm_seconds=settings.keep_warm_seconds, tags=settings.tags).create_from_memory_snapshot(
        snap.snapshot_id)
    try:
        url = sb.list_urls()[PORT]
        return Remote(sb, _connect(url, snap.token, sb.sandbox_id, settings), settings, snap.token)
    except BaseException:
        sb.terminate()
        raise


def capture(remote: Remote, ttl: float | None = None) -> ServerSnapshot:
    """A memory snapshot of `remote` as it is now (its env included); `remote` goes on."""
    remote.detach()
    try:
        sid = remote.sandbox.snapshot_memory(ttl=ttl)
    finally:
        remote.reconnect()
    return ServerSnapshot(sid, remote.token)


# ---- the per-image base: a server with gymnasium imported, in a memory snapshot ---------------

_bases: dict[tuple[str, float, int], ServerSnapshot] = {}
_bases_lock = threading.Lock()


def _ship(sb: SandboxInstance, token: str) -> None:
    src = importlib.resources.files(__package__)
    sb.fs.write_file(f"{REMOTE_DIR}/{PACKAGE}/__init__.py", b"")
    for name in SHIPPED:
        sb.fs.write_file(f"{REMOTE_DIR}/{PACKAGE}/{name}", src.joinpath(name).read_bytes())
    sb.fs.write_file(f"{REMOTE_DIR}/token", token, mode=0o600)


def base_snapshot(settings: SandboxSettings) -> ServerSnapshot:
    """The image's warm server snapshot (made once per image, cpu and memory in this process).

    Raises:
        InvalidArgument: the image has no python3 with gymnasium and numpy (the message has
            the server's output and the fix).
        ImageNotFound, ImageBuildError: from building the image.
    """
    c = default_client()
    image_id = settings.image.resolve(c)
    key = (image_id, float(settings.cpu), int(settings.memory))
    with _bases_lock:
        if key in _bases:
            return _bases[key]
        token = secrets.token_hex(16)
        sb = Sandbox(image=Image.from_id(image_id), cpu=settings.cpu, memory=settings.memory, ports=[PORT],
                     keep_warm_seconds=max(settings.connect_timeout * 2, 300), tags=settings.tags).create()
        try:
            _ship(sb, token)
            started = sb.exec("sh", "-c", f"cd {REMOTE_DIR} && nohup python3 -m {PACKAGE}.server --port {PORT} "
                              f"--token-file {REMOTE_DIR}/token >{SERVER_LOG} 2>&1 & echo $!", timeout=30)
            pid = started.stdout.decode().strip()
            url = sb.list_urls()[PORT]
            deadline = time.monotonic() + settings.connect_timeout
            while True:
                try:
                    ch = Channel(url, token, sb.sandbox_id, timeout=settings.timeout, connect_timeout=1.0)
                    break
                except _Broken:
                    alive = sb.exec("sh", "-c", f"kill -0 {pid} 2>/dev/null || {{ echo exited:; cat {SERVER_LOG}; }}", timeout=30)
                    if alive.stdout or time.monotonic() > deadline:
                        out = alive.stdout.decode(errors="replace")[-1500:] or "(still starting)"
                        raise errors.InvalidArgument(
                            f"the env server did not start in image {image_id}: {out}\nThe image needs python3 "
                            "with gymnasium and numpy, e.g. Image.debian().pip_install('numpy', 'gymnasium')"
                        ) from None
            ch.send("detach")
            ch.recv()
            ch.close()
            snap = ServerSnapshot(sb.snapshot_memory(ttl=BASE_TTL_S), token)
        finally:
            sb.terminate()
        _bases[key] = snap
        return snap


def restore_base(settings: SandboxSettings) -> Remote:
    """A new env server from the image's base snapshot (made again if it expired)."""
    snap = base_snapshot(settings)
    try:
        return restore(snap, settings)
    except errors.SnapshotNotFound:
        with _bases_lock:
            for k, v in list(_bases.items()):
                if v == snap:
                    del _bases[k]
        return restore(base_snapshot(settings), settings)


def delete_snapshot(snap: ServerSnapshot, wait_s: float = 30.0) -> None:
    """Deletes the snapshot, waiting out restores of it still in progress (best effort: its
    TTL is the backstop)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            default_client().request("DELETE", f"/snapshots/{snap.snapshot_id}")
            return
        except errors.InvalidState:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        except errors.RollboxError:
            return


# ---- keep-alive and clean-up ----------------------------------------------------------------

class _Keepalive:
    """Touches open envs' sandboxes so keep_warm_seconds counts from the trainer's exit, not
    from the last API call (steps go over TCP, which the daemon does not see as activity)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[Remote] = set()
        self._thread: threading.Thread | None = None

    def add(self, r: Remote) -> None:
        with self._lock:
            self._live.add(r)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rollbox-gym-keepalive", daemon=True)
                self._thread.start()

    def discard(self, r: Remote) -> None:
        with self._lock:
            self._live.discard(r)

    def snapshot(self) -> list[Remote]:
        with self._lock:
            return list(self._live)

    def _run(self) -> None:
        last: dict[int, float] = {}
        while True:
            time.sleep(5.0)
            now = time.monotonic()
            for r in self.snapshot():
                period = max(5.0, r.settings.keep_warm_seconds / 4)
                if now - last.get(id(r), 0.0) >= period:
                    last[id(r)] = now
                    try:
                        r.sandbox.update_ttl(r.settings.keep_warm_seconds)
                    except errors.RollboxError:
                        pass


_keepalive = _Keepalive()
background = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollbox-gym")


def release() -> None:
    """Terminates every env sandbox this process still has open and deletes the base
    snapshots it made (run at exit). A local daemon that is no longer running is not started
    again for this: its keep_warm and snapshot TTLs end what is left."""
    c = default_client()
    if c.autostart and not daemon_running(c.paths):
        return
    for r in _keepalive.snapshot():
        r.terminate()
    with _bases_lock:
        for snap in _bases.values():
            delete_snapshot(snap)
        _bases.clear()


@atexit.register
def _at_exit() -> None:
    release()
    background.shutdown(wait=True)
