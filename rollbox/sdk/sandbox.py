"""Sandbox (the configuration) and SandboxInstance (a live sandbox), Beam-style.

    sb = Sandbox(image=Image.debian(), cpu=1.0, memory=1024, keep_warm_seconds=600).create()
    sb.exec("python3", "-c", "print(6*7)", timeout=5)
    snapshot_id = sb.snapshot_memory()
    copy = Sandbox().create_from_memory_snapshot(snapshot_id)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import secrets
import stat
import sys
import threading
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

from .. import errors
from ..client.default import default_client as default_client  # re-exported for SDK modules
from ..client.transport import Client
from ..types import ExecResult, FileEntry, SandboxInfo
from ._aio import cleaning, synchronized
from .image import BUILD_NOTICE_S, DEBIAN_IMAGE_ID, Image
from .process import SandboxProcesses
from .volume import Volume



def _info(d: dict[str, Any]) -> SandboxInfo:
    return SandboxInfo(**d)


async def _terminate_all(items: list[Any]) -> None:
    """Terminates every SandboxInstance of `items` at once (exceptions in slots are skipped)."""
    await asyncio.gather(*(k.terminate.aio() for k in items if isinstance(k, SandboxInstance)),
                         return_exceptions=True)


@dataclass(frozen=True)
class Sandbox:
    """How to make a sandbox. Nothing runs until `create()`.

    Args:
        image: the root filesystem (default `Image.debian()`): an `Image`, or a string, read
            as `Image.from_id` when it is a stored image id (`im-...`) and as
            `Image.from_registry` otherwise (`"python:3.11-slim"`).
        cpu: CPU cores, a float (CFS quota), default 1.0.
        memory: memory limit in MiB of the sandbox's processes: a command that takes the
            sandbox past it is SIGKILLed (the biggest exec, as Linux's OOM killer picks) and
            reports exit 137 and `oom_killed=True`; the sandbox and its other processes go on.
            gVisor's own kernel gets headroom above it; the whole sandbox ends as `oom` only
            if that is exceeded too (the last line of defence).
        keep_warm_seconds: seconds without any API call after which the daemon terminates the
            sandbox (the backstop for leaked sandboxes); None or <= 0 keeps it forever. There
            is no cap on a sandbox's lifetime while it is used.
        auto_pause_seconds: idle seconds (no API call, no command running, under 0.15 of a
            core of CPU) after which the daemon pauses the sandbox to disk, so idle sandboxes
            cost no CPU; the next call on it resumes it transparently (same id, files, memory
            and processes; that call waits ~0.3-1 s for the restore). None: the daemon's
            ROLLBOX_AUTO_PAUSE_SECONDS (unset: never); 0: never. Not applied to runc, GPU or
            port-exposing sandboxes. keep_warm_seconds still ends it, paused or not.
        env: environment variables for every command.
        volumes: `Volume(name=..., mount_path=..., read_only=False)` list (created on first use).
            A read-write mount beside another sandbox's read-write mount of the same volume is
            refused with VolumeBusy when either is gVisor (see `Volume`).
        tags: labels recorded with the sandbox's usage (`rollbox usage` sums per tag). Keys
            starting with `rollbox.` are rollbox's own (`rollbox.start`: the token of the
            start request; `rollbox.pool`: the SandboxPool that made it).
        ports: TCP ports in the sandbox to expose on the host at once (`list_urls()` gives
            their URLs; `expose_port()` adds more later).
        block_network: True (the default) blocks every outbound connection. False gives
            outbound access (NAT through the host).
        allow_list: with block_network=False, the only IPv4 CIDRs ("10.0.0.0/8") and host names
            ("pypi.org") the sandbox may reach; names are resolved when it starts. None: anywhere.
            Whatever the policy, a sandbox never reaches the daemon, the host's own addresses,
            other sandboxes or link-local metadata (169.254.0.0/16).

        docker_enabled: run a Docker daemon inside (the image needs Docker, e.g.
            `Image.debian().apt_install("docker.io")`); `sb.docker.run(image, *cmd)` then runs
            nested containers. Its commands get every capability (of gVisor's kernel).
        entrypoint: start the image's Entrypoint + Cmd (OCI config) as the sandbox's main
            process (output in /tmp/.rollbox-entrypoint.log). None (default): when the image
            declares an Entrypoint. Commands run with the image's Env, WorkingDir and User.

        disk: cap on the sandbox's writable layer in MiB (default 4096): writing past it
            fails with ENOSPC inside the sandbox. The layer is a sparse, loop-mounted ext4 file
            of that size under ROLLBOX_HOME (this host kernel has no filesystem quotas): it uses
            host disk only for what is written. None: no cap, files go to the host disk.
            /tmp, /run, /var/tmp and the home directory are on that layer too; /dev/shm is a
            memory-backed tmpfs of a quarter of `memory` (writing past either bound fails
            with ENOSPC, and the sandbox lives on).
        pids: the most processes and threads the sandbox may hold at once (default 512, in
            [16, 4096]), its init agent's ~7 tasks included: a fork past it fails with
            EAGAIN inside, and a fork bomb's exec reports `pids_limited=True`. The host counts
            them too: the sandbox's host cgroup allows 3 * pids + 64 tasks on systrap (which
            keeps a host process per address space inside: ~2.2 per task, measured), pids
            on runc.

        gpu: None, "any" or a model ("H100", "A100", ...): `gpu_count` NVIDIA GPUs through
            gVisor's nvproxy. On a machine without a matching GPU, create() raises
            ResourceUnavailable (never a silent CPU run).

        runtime: "gvisor" (default): gVisor's user-space kernel, memory snapshots, fork, pause.
            "runc": the lighter tier for trusted, lightweight environments (classic
            simulators): namespaces + seccomp + cgroups on the host kernel, a faster start and
            less memory, same API, but WEAKER isolation (a host kernel bug is reachable from
            inside). snapshot_memory/fork/pause raise UnsupportedOperation on it; gpu= and
            docker_enabled are gVisor-only.
        platform: the gVisor platform, "systrap" or "ptrace" (None: the daemon's,
            ROLLBOX_PLATFORM, systrap unless set). Its memory snapshots restore on the same
            platform (so a SandboxPool over them runs there). Measured on a 2-core host with
            runsc 20240729 (README "gVisor platform"): ptrace costs ~20-40% less CPU per
            forked process (HumanEval in container pools: 17-22 programs/s against 12-15 in
            the same runs) and idles at ~0% of a core, but runs file and other syscalls 2-15x
            slower, and keeps a host thread per process that ever ran; systrap is the default.
            Any other value is InvalidArgument; runtime="runc" takes None only.

    A sandbox with neither ports nor outbound access has loopback only (the fastest start).
    Otherwise it gets its own network namespace and gVisor netstack; its memory snapshots
    restore into copies that each have their own network and URLs.
    """

    image: Image = field(default_factory=Image.debian)
    cpu: float = 1.0
    memory: int = 1024
    keep_warm_seconds: float | None = 600
    auto_pause_seconds: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    volumes: list[Volume] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    block_network: bool = True
    allow_list: list[str] | None = None
    entrypoint: bool | None = None
    gpu: str | None = None
    gpu_count: int = 1
    docker_enabled: bool = False
    disk: int | None = 4096
    runtime: str = "gvisor"
    pids: int = 512
    platform: str | None = None
    client: Client | None = field(default=None, compare=False, repr=False)

    def _client(self) -> Client:
        return self.client or default_client()

    def __post_init__(self) -> None:
        if isinstance(self.image, str):  # Daytona/E2B-style: a name where an Image goes
            ref = self.image
            object.__setattr__(self, "image", Image.from_id(ref) if ref.startswith("im-") else Image.from_registry(ref))

    def _check_types(self) -> None:
        if not isinstance(self.image, Image):
            raise errors.InvalidArgument(f"image={self.image!r} must be an Image (Image.debian(), Image.from_id(...), "
                                         "Image.from_registry(...)) or an image name string")
        for name, kinds in (("cpu", (int, float)), ("memory", (int,)), ("pids", (int,))):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, kinds):
                raise errors.InvalidArgument(f"{name}={v!r} must be a number ({' or '.join(k.__name__ for k in kinds)})")

    @cleaning(lambda sb: sb.terminate.aio())  # a cancelled create.aio leaves no sandbox
    async def create(self) -> "SandboxInstance":
        """Boots a fresh sandbox and returns once its first command can run.

        Raises:
            ImageNotFound: the image id is unknown (or a registry has no such image).
            ImageBuildError: a build step of the image failed (its output is in the message).
            RuntimeMissing: runsc is not installed (the message says how to install it).
            DaemonUnavailable: no daemon answers and none could be started.
            SandboxLost: runsc failed to start the sandbox (nothing is left behind).
            InvalidArgument: a port outside 1..65535, an invalid CIDR or host name in
                allow_list, or a name that does not resolve (checked before anything is made).
        """
        self._check_types()
        c = self._client()
        image_id = await self.image.resolve.aio(c)
        # The daemon builds the Debian base on the first create of a state directory (minutes,
        # debootstrap): say so when the wait is long instead of a silent one.
        notice = threading.Timer(BUILD_NOTICE_S, lambda: print(
            "rollbox: still starting the sandbox (the host is busy, or this is the state directory's first "
            "sandbox and the Debian base image is being built: a few minutes, once)...", file=sys.stderr,
            flush=True)) if image_id == DEBIAN_IMAGE_ID else None
        if notice is not None:
            notice.daemon = True
            notice.start()
        try:
            body = await _start(c, "/sandboxes", {
            "image_id": image_id, "cpu": self.cpu, "memory": self.memory, "env": self.env,
            "keep_warm_seconds": self.keep_warm_seconds, "volumes": [v.to_wire() for v in self.volumes],
            "tags": self.tags, "ports": list(self.ports), "block_network": self.block_network,
            "allow_list": None if self.allow_list is None else list(self.allow_list),
            "entrypoint": self.entrypoint, "gpu": self.gpu, "gpu_count": self.gpu_count,
            "docker_enabled": self.docker_enabled, "disk": self.disk, "runtime": self.runtime, "pids": self.pids,
            "auto_pause_seconds": self.auto_pause_seconds, "platform": self.platform})
        finally:
            if notice is not None:
                notice.cancel()
        info = _info(body)
        return SandboxInstance(info.sandbox_id, c, info)

    @cleaning(lambda sb: sb.terminate.aio())
    async def create_from_memory_snapshot(self, snapshot_id: str) -> "SandboxInstance":
        """Restores a memory snapshot into a new sandbox: its processes continue where they were.

        The restored sandbox keeps the snapshot's image, cpu, memory and gVisor platform (a
        checkpoint restores only on the platform it was taken on); `keep_warm_seconds` comes
        from this Sandbox. Raises SnapshotNotFound for an unknown id, InvalidArgument when this
        Sandbox names a platform other than the snapshot's (None: the snapshot's).
        """
        check_id(snapshot_id, errors.SnapshotNotFound, "snapshot")
        c = self._client()
        info = _info(await _start(c, f"/snapshots/{snapshot_id}/restore",
                                  {"keep_warm_seconds": self.keep_warm_seconds, "tags": self.tags,
                                   "auto_pause_seconds": self.auto_pause_seconds, "platform": self.platform}))
        return SandboxInstance(info.sandbox_id, c, info)

    @synchronized
    async def connect(self, sandbox_id: str) -> "SandboxInstance":
        """A handle on an existing sandbox (e.g. one made by another process); a paused
        sandbox is resumed first. Raises SandboxNotFound."""
        check_id(sandbox_id, errors.SandboxNotFound, "sandbox")
        c = self._client()
        info = _info(await c.aio.request("GET", f"/sandboxes/{sandbox_id}"))
        if info.state == "paused":
            info = _info(await c.aio.request("POST", f"/sandboxes/{sandbox_id}/resume"))
        return SandboxInstance(sandbox_id, c, info)


# Tag on every start: the token that finds a sandbox whose create reply was lost (below).
START_TAG = "rollbox.start"


async def _start(c: Client, path: str, body: dict[str, Any]) -> Any:
    """POSTs a sandbox start (create or restore) carrying a fresh token in its tags. A daemon
    killed with the request out may have made the sandbox, and a restarted daemon re-adopts
    it, while the caller only gets DaemonUnavailable and retries: a second sandbox, the first
    running until its keep_warm_seconds (break-it trial). So on DaemonUnavailable the sandbox
    holding the token is looked for on the (restarted) daemon and terminated, best effort,
    before the error is raised: the error then means nothing was made."""
    token = secrets.token_hex(8)
    body = {**body, "tags": {**(body.get("tags") or {}), START_TAG: token}}
    try:
        return await c.aio.request("POST", path, json=body)
    except errors.DaemonUnavailable:
        with contextlib.suppress(errors.RollboxError):
            for row in await c.aio.request("GET", "/sandboxes"):
                if (row.get("tags") or {}).get(START_TAG) == token:
                    await c.aio.request("DELETE", f"/sandboxes/{row['sandbox_id']}")
        raise


CHUNK = 1 << 20  # bytes per chunk of a streamed upload/download (the daemon relays 4 MiB parts)


def _check_whole(path: str, resp: Any, got: int) -> None:
    """A streamed download is the file as it was when the read began, or an error.

    Raises:
        InvalidState: fewer bytes than the file had (it was truncated, removed or became
            unreadable while it was read); read it again.
    """
    want = int(resp.headers.get("x-rollbox-size", got))
    if got < want:
        raise errors.InvalidState(f"{path} changed while it was read ({got} of {want} bytes came): it was truncated, "
                                  "removed or became unreadable meanwhile; nothing was kept, read it again")


def _utf8(path: str) -> bool:
    """Whether `path` can travel in a URL (streamed routes); surrogate-escaped (non-UTF-8)
    names (and anything that is no plausible path: the JSON routes answer those with typed
    errors) take the JSON routes, whose body carries them."""
    if not isinstance(path, str) or len(path) > 4096:  # PATH_MAX
        return False
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_id(value: object, error: type[errors.RollboxError], what: str) -> str:
    """An id that can be part of a URL path; anything else cannot exist (raises `error`)."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise error(f"{what} {value!r} not found (ids look like 'sb-...' / 'sn-...')")
    return value


class SandboxFileSystem:
    """`sb.fs`: files inside the sandbox, read and written through its agent."""

    def __init__(self, sb: "SandboxInstance") -> None:
        self._sb = sb

    def _content(self) -> str:
        return f"/sandboxes/{self._sb.sandbox_id}/files/content"

    @synchronized
    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Writes `data` (str is UTF-8 encoded) to absolute `path`, creating parent dirs; the
        file appears whole or not at all. Streamed as a raw body: any size the sandbox's disk
        holds (ENOSPC inside is an error, nothing is left)."""
        raw = data.encode() if isinstance(data, str) else data
        if self._sb._streams_files and _utf8(path):
            await self._sb._client.aio.send_raw("PUT", self._content(), raw, params={"path": path, "mode": mode})
            return
        await self._sb._call("POST", "files/write", {"path": path, "data": base64.b64encode(raw).decode(), "mode": mode})

    @synchronized
    async def read_file(self, path: str) -> bytes:
        """Returns the file's bytes (streamed: any size; episode containers and non-UTF-8
        names: up to 64 MiB). Raises FileNotFoundInSandbox."""
        if self._sb._streams_files and _utf8(path):
            async with self._sb._client.aio.stream_raw(self._content(), params={"path": path}) as (resp, chunks):
                data = b"".join([c async for c in chunks])
            _check_whole(path, resp, len(data))
            return data
        r = await self._sb._call("POST", "files/read", {"path": path})
        return base64.b64decode(r["data"])

    @synchronized
    async def list_files(self, path: str) -> list[FileEntry]:
        """Entries of directory `path`, sorted by name."""
        r = await self._sb._call("POST", "files/list", {"path": path})
        return [FileEntry(**{k: e[k] for k in ("name", "path", "is_dir", "size", "mode", "mtime")})
                for e in r["entries"]]

    @synchronized
    async def remove(self, path: str) -> None:
        """Removes a file or a directory tree."""
        await self._sb._call("POST", "files/remove", {"path": path})

    @synchronized
    async def upload_file(self, local_path: str | os.PathLike[str], sandbox_path: str, mode: int | None = None) -> None:
        """Copies a file of this machine into the sandbox at absolute `sandbox_path`, streamed
        (any size; the file appears whole or not at all; mode: the local file's permission bits
        unless given). Raises InvalidArgument (not a regular file), FileNotFoundError (no such
        local file)."""
        st = os.stat(local_path)
        if not stat.S_ISREG(st.st_mode):
            raise errors.InvalidArgument(f"upload_file: {local_path} is not a regular file")
        bits = stat.S_IMODE(st.st_mode) if mode is None else mode
        if not self._sb._streams_files or not _utf8(sandbox_path):
            with open(local_path, "rb") as f:
                raw = f.read()
            await self.write_file.aio(sandbox_path, raw, bits)
            return

        def chunks() -> Iterator[bytes]:
            with open(local_path, "rb") as f:
                while block := f.read(CHUNK):
                    yield block
        await self._sb._client.aio.send_raw("PUT", self._content(), chunks(), params={"path": sandbox_path,
                                                                                      "mode": bits})

    @synchronized
    async def download_file(self, sandbox_path: str, local_path: str | os.PathLike[str]) -> int:
        """Copies the sandbox's file at absolute `sandbox_path` to `local_path` on this machine
        (written whole or not at all); returns its size in bytes. Paths and symlinks are resolved
        inside the sandbox: a link to /etc/passwd gives the sandbox's, never the host's.
        Streamed: any size, never held in memory whole. Raises FileNotFoundInSandbox,
        InvalidArgument (not a regular file), DaemonUnavailable (the transfer was cut short)."""
        tmp = f"{os.fspath(local_path)}.rollbox-partial"
        size = 0
        try:
            with open(tmp, "wb") as f:
                if not self._sb._streams_files or not _utf8(sandbox_path):
                    data = await self.read_file.aio(sandbox_path)
                    f.write(data)
                    size = len(data)
                else:
                    async with self._sb._client.aio.stream_raw(self._content(),
                                                               params={"path": sandbox_path}) as (resp, chunks):
                        async for block in chunks:
                            f.write(block)
                            size += len(block)
                    _check_whole(sandbox_path, resp, size)
            os.replace(tmp, local_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return size


class SandboxDocker:
    """Docker inside a `docker_enabled=True` sandbox (gVisor's Docker-in-gVisor mode: nested
    containers share the sandbox's network; images live in the sandbox's /tmp)."""

    def __init__(self, sb: "SandboxInstance") -> None:
        self._sb = sb

    @synchronized
    async def run(self, image: str, *cmd: str, args: list[str] | None = None,
                  timeout: float | None = None) -> ExecResult:
        """`docker run --rm --network=host [args] IMAGE CMD...` inside the sandbox."""
        res: ExecResult = await self._sb.exec.aio("docker", "run", "--rm", "--network=host", *(args or []), image, *cmd,
                                        timeout=timeout)
        return res

    @synchronized
    async def load(self, archive: bytes) -> ExecResult:
        """`docker load` of an image archive (what `docker save` writes)."""
        path = "/tmp/.rollbox-docker-load.tar"
        await self._sb.fs.write_file.aio(path, archive)
        res: ExecResult = await self._sb.exec.aio("docker", "load", "-i", path, timeout=600)
        return res


class SandboxInstance:
    """A live sandbox. Also a context manager: leaving the block terminates it.

    Thread-safe: several threads may exec in one sandbox at once.
    """

    def __init__(self, sandbox_id: str, client: Client, info: SandboxInfo | None = None) -> None:
        self.sandbox_id = sandbox_id
        self._client = client
        self._info = info
        self.fs = SandboxFileSystem(self)
        self._streams_files = True  # the streamed file routes (an episode container has only the JSON ones)
        self.docker = SandboxDocker(self)
        self.process = SandboxProcesses(self)
        self.terminated = False
        # Set by exec results; SandboxPool reads them to classify an episode.
        self.saw_timeout = False
        self.saw_oom = False
        self.saw_sandbox_oom = False

    def __repr__(self) -> str:
        return f"SandboxInstance({self.sandbox_id!r})"

    def __enter__(self) -> "SandboxInstance":
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    async def __aenter__(self) -> "SandboxInstance":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.terminate.aio()

    @property
    def ttfc_ms(self) -> float | None:
        """Milliseconds the daemon took from the create/restore request to a usable agent."""
        return self._info.ttfc_ms if self._info else None

    async def _call(self, method: str, sub: str, body: Any = None) -> Any:
        return await self._client.aio.request(method, f"/sandboxes/{self.sandbox_id}/{sub}", json=body)

    @synchronized
    async def exec(self, *args: str, timeout: float | None = None, env: dict[str, str] | None = None,
             cwd: str | None = None, stdin: bytes | str | None = None,
             max_output: int | None = None, user: str | int | None = None) -> ExecResult:
        """Runs a command (argv, no shell) and waits for it.

        Args:
            *args: the command and its arguments, e.g. `exec("python3", "-c", "print(1)")`.
            timeout: seconds; on expiry the command's whole process tree (children, background
                jobs, setsid'd descendants that keep their environment) is killed and the result has `timed_out=True`,
                `exit_code=None`. None: no limit.
            env: extra environment variables. cwd: working directory (default: the image's
                WorkingDir, else $HOME where that directory exists, else /).
            stdin: bytes (or UTF-8 str) fed to stdin, then closed; None closes stdin at once.
            max_output: bytes kept per stream (default 8 MiB; at most 64 MiB); more is
                drained and dropped, and `truncated=True`. 0 keeps nothing (the byte counts
                `stdout_bytes`/`stderr_bytes` still say how much there was).
            user: run as this user of the image (a name, "name:group", or a uid); default:
                the image's User.

        Returns:
            ExecResult. A nonzero exit is not an exception.

        Raises:
            InvalidArgument: an unknown user ("unable to find user NAME: no matching entries in
                passwd file").
            SandboxTerminated: the sandbox was terminated before. SandboxLost: it died mid-exec
                for a reason other than memory (memory gives `oom_killed=True`).
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            raise errors.InvalidArgument(f"timeout={timeout!r} must be a number of seconds or None")
        if max_output is not None and (isinstance(max_output, bool) or not isinstance(max_output, int)):
            raise errors.InvalidArgument(f"max_output={max_output!r} must be an int (bytes) or None")
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = tuple(args[0])
        sin = None
        if stdin is not None:
            sin = base64.b64encode(stdin.encode() if isinstance(stdin, str) else stdin).decode()
        r = await self._call("POST", "exec", {"argv": list(args), "env": env or {}, "cwd": cwd, "stdin": sin,
                                        "timeout": timeout, "max_output": max_output, "user": user})
        res = ExecResult.from_wire(r)
        self.saw_timeout |= res.timed_out
        self.saw_oom |= res.oom_killed
        self.saw_sandbox_oom |= res.sandbox_oom
        return res

    @synchronized
    async def expose_port(self, port: int) -> str:
        """The URL ("http://127.0.0.1:PORT") on which the host reaches `port` in this sandbox,
        for as long as the sandbox lives. Exposing a port twice returns the same URL.

        Raises InvalidArgument for a port outside 1..65535 or a sandbox created without
        networking (give `ports=` or `block_network=False` when creating it).
        """
        return str((await self._call("POST", "ports", {"port": port}))["url"])

    @synchronized
    async def list_urls(self) -> dict[int, str]:
        """{port in the sandbox: host URL} for every exposed port."""
        return {int(p): u for p, u in (await self._call("GET", "ports")).items()}

    @synchronized
    async def update_network_permissions(self, block_network: bool = True, allow_list: list[str] | None = None) -> None:
        """Replaces the outbound policy at once, open connections included (same arguments as
        `Sandbox`). Raises InvalidArgument as `Sandbox.create` does."""
        self._info = _info(await self._call("PUT", "network", {"block_network": block_network,
                                                          "allow_list": allow_list}))

    @synchronized
    async def snapshot_memory(self, ttl: float | None = None) -> str:
        """Captures memory, processes (with open sockets) and files; the sandbox keeps running.

        Args:
            ttl: seconds the store keeps the snapshot; None keeps it until deleted.

        Returns the snapshot id for `Sandbox().create_from_memory_snapshot(id)` or `SandboxPool`.
        Raises ResourceExhausted when the store's disk is full (nothing stored is touched),
        UnsupportedOperation on a runc sandbox (memory snapshots need gVisor).
        """
        return str((await self._call("POST", "snapshot", {"ttl": ttl}))["snapshot_id"])

    @synchronized
    async def pause(self) -> str:
        """Checkpoints the sandbox to the store and frees its CPU and memory.

        Any later call (exec, files, `resume()`, `Sandbox().connect(id)`) brings it back exactly
        where it was. Returns the paused state's snapshot id: restore it into copies to branch
        (it is kept until the sandbox resumes).
        """
        return str((await self._call("POST", "pause"))["snapshot_id"])

    @synchronized
    async def resume(self) -> None:
        """Brings a paused sandbox back (same id, same processes and files)."""
        self._info = _info(await self._call("POST", "resume"))

    @synchronized
    async def update_ttl(self, keep_warm_seconds: float | None) -> None:
        """Sets keep_warm_seconds: idle seconds before the daemon kills it (None or -1: never)."""
        self._info = _info(await self._client.aio.request("PATCH", f"/sandboxes/{self.sandbox_id}",
                                                json={"keep_warm_seconds": keep_warm_seconds}))

    @synchronized
    async def usage(self) -> dict[str, Any]:
        """Per-second usage: wall_s, run_s, boot_s, cpu_seconds, peak_memory_bytes, gpu_seconds,
        reserved_cpu_seconds, reserved_gib_seconds."""
        return dict(await self._call("GET", "usage"))

    @synchronized
    async def create_image_from_filesystem(self) -> str:
        """Saves the sandbox's files (not its processes) as a new image; returns its id."""
        return str((await self._call("POST", "image"))["image_id"])

    @cleaning(lambda copies: _terminate_all(copies))
    async def fork(self, count: int, *, keep_warm_seconds: float | None = 600,
             return_exceptions: bool = False) -> list["SandboxInstance"]:
        """`count` live copies of this sandbox from one memory capture; this one keeps running.

        Each copy continues from the captured state independently, sees its own entropy and has
        `ROLLBOX_FORK_INDEX` (0..count-1) in the environment of the commands it starts.

        Returns:
            A list of length `count`, in fork-index order. With `return_exceptions=True` a
            failed copy is its exception in its slot; otherwise the first failure terminates the
            copies that did start and is raised.
        """
        out = await self._call("POST", "fork", {"count": count, "keep_warm_seconds": keep_warm_seconds})
        kids: list[Any] = []
        for item in out:
            if "sandbox" in item:
                info = _info(item["sandbox"])
                kids.append(SandboxInstance(info.sandbox_id, self._client, info))
            else:
                kids.append(errors.from_wire(item["error"], 500))
        failures = [k for k in kids if isinstance(k, Exception)]
        if failures and not return_exceptions:
            await _terminate_all(kids)
            raise failures[0]
        return kids

    @synchronized
    async def info(self) -> SandboxInfo:
        return _info(await self._client.aio.request("GET", f"/sandboxes/{self.sandbox_id}"))

    @synchronized
    async def terminate(self) -> None:
        """Stops the sandbox and removes everything it made on the host. Idempotent."""
        if self.terminated:
            return
        try:
            await self._client.aio.request("DELETE", f"/sandboxes/{self.sandbox_id}")
        except errors.SandboxNotFound:
            pass
        self.terminated = True
