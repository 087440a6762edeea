"""`RollboxSandboxEnvironment`: inspect-ai's `SandboxEnvironment` on rollbox gVisor sandboxes.

One fresh sandbox per sample (made in `sample_init`, terminated in `sample_cleanup`, and any
left over by `task_cleanup`); commands go through the rollbox SDK to the local daemon.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, TypeVar, Union, overload

import anyio
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from inspect_ai.util import ExecResult as InspectExecResult
from inspect_ai.util._sandbox.environment import SandboxUnavailableError
from inspect_ai.util._sandbox.lifecycle import sandbox_lifecycle_state
from pydantic import BaseModel

from ... import errors
from ...sdk.image import Image
from ...sdk.sandbox import Sandbox, SandboxInstance, default_client
from ...types import ExecResult
from . import scripts
from .config import CONFIG_FILES, RollboxSandboxConfig, load_config
from .scripts import FileStatus

logger = logging.getLogger(__name__)
T = TypeVar("T")

TASK_TAG = "inspect_task"
MAX_EXEC_OUTPUT = 64 * 1024 * 1024  # the daemon's cap per stream of one exec
READ_CHUNK = MAX_EXEC_OUTPUT  # bytes per exec when reading a file (larger files take several)
FILE_TIMEOUT_S = 600.0


@dataclass
class _Live:
    """Sandboxes not yet cleaned up, by task name (what task_cleanup ends)."""

    by_task: dict[str, dict[str, SandboxInstance]] = field(default_factory=dict)
    # Images task_init built (a Dockerfile, a Python version), by configuration: samples boot them.
    built: dict[str, Image] = field(default_factory=dict)


# Used only outside an eval's lifecycle scope (a provider driven directly, as tests do).
_UNSCOPED = _Live()


def _live() -> _Live:
    state = sandbox_lifecycle_state()
    return _UNSCOPED if state is None else state.get(_Live)


@dataclass(frozen=True)
class _Identity:
    """Who the sandbox's commands run as without any wrapper, and the sample's directory."""

    uid: int | None
    name: str
    workdir: str


async def _in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking SDK call in a worker thread; the SDK's errors become inspect's."""
    try:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), abandon_on_cancel=True)
    except (errors.SandboxTerminated, errors.SandboxLost, errors.SandboxNotFound, errors.DaemonUnavailable) as e:
        raise SandboxUnavailableError(str(e)) from e
    except errors.InvalidArgument as e:
        raise ValueError(str(e)) from e


@sandboxenv(name="rollbox")
class RollboxSandboxEnvironment(SandboxEnvironment):
    """A rollbox sandbox as an inspect sandbox environment (`sandbox="rollbox"`).

    Thread/task safety: several tasks may exec in one environment at once.
    """

    def __init__(self, instance: SandboxInstance, config: RollboxSandboxConfig, identity: _Identity) -> None:
        super().__init__()
        self.instance = instance
        self.config = config
        self._identity = identity

    @property
    def sandbox_id(self) -> str:
        return self.instance.sandbox_id

    # ---- provider lifecycle ------------------------------------------------------------

    @classmethod
    def config_files(cls) -> list[str]:
        return list(CONFIG_FILES)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return load_config(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Checks the configuration and builds its image once (a Dockerfile, a Python version:
        each step a cached layer), so a bad one fails the task before any sample starts and
        the samples boot the built image.

        Raises:
            ValueError: a bad configuration or a Dockerfile rollbox cannot build (the message
                names its line). rollbox's ImageBuildError: a build step failed (its output
                is in the message).
        """
        cfg = load_config(config)
        try:
            image = cfg.to_image()
        except errors.InvalidArgument as e:
            raise ValueError(str(e)) from None
        live = _live()
        live.by_task.setdefault(task_name, {})
        if image.needs_build:
            image_id = await _in_thread(image.build)
            live.built[cfg.model_dump_json()] = Image.from_id(image_id)

    @staticmethod
    def _image(cfg: RollboxSandboxConfig) -> Image:
        """The image a sample boots: the one task_init built for this configuration, else the
        configuration's own (built, cached, when the sandbox is made)."""
        built = _live().built.get(cfg.model_dump_json())
        return built if built is not None else cfg.to_image()

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        """Boots one fresh sandbox for the sample and returns it as "default".

        Raises:
            ValueError: a bad configuration. SandboxUserUnsupportedError: `user` cannot be
                used in this image. rollbox errors (ImageNotFound, RuntimeMissing,
                DaemonUnavailable, ...) when no sandbox can be made; nothing is left behind.
        """
        cfg = load_config(config)
        try:
            spec = Sandbox(image=cls._image(cfg), cpu=cfg.cpu, memory=cfg.memory, disk=cfg.disk, env=dict(cfg.env),
                           block_network=not cfg.network, allow_list=cfg.allow_list if cfg.network else None,
                           keep_warm_seconds=cfg.keep_warm_seconds, tags={TASK_TAG: task_name[:200]})
        except errors.InvalidArgument as e:
            raise ValueError(str(e)) from None
        instance = await _in_thread(spec.create)
        live = _live().by_task.setdefault(task_name, {})
        live[instance.sandbox_id] = instance
        try:
            identity = await cls._identify(instance, cfg)
        except BaseException:
            live.pop(instance.sandbox_id, None)
            with anyio.CancelScope(shield=True):
                await _terminate(instance)
            raise
        return {"default": cls(instance, cfg, identity)}

    @classmethod
    async def _identify(cls, instance: SandboxInstance, cfg: RollboxSandboxConfig) -> _Identity:
        r = await _in_thread(instance.exec, *scripts.identity_argv(), timeout=60)
        uid_s, home, pwd, name = (r.stdout.decode(errors="replace").split("\n") + ["", "", "", ""])[:4]
        uid = int(uid_s) if r.exit_code == 0 and uid_s.isdigit() else None
        base = _Identity(uid=uid, name=name, workdir=pwd or "/")
        env = cls(instance, cfg, base)
        workdir = cfg.workdir
        if cfg.user is not None and not env._is_base(cfg.user):
            as_user = await env.exec(scripts.identity_argv(), user=cfg.user, timeout=60)
            if not as_user.success:
                raise SandboxUserUnsupportedError(f"rollbox sandbox: default user {cfg.user!r}: {as_user.stderr.strip()}")
            home = as_user.stdout.split("\n")[1] if as_user.stdout.count("\n") >= 1 else ""
            if workdir is None:
                probe = await env.exec(["/bin/sh", "-c", 'test -d "$1" && test -w "$1"', "sh", home or "/"], user=cfg.user)
                workdir = home if home and probe.success else "/"
        if cfg.workdir is not None:
            owner = cfg.user if cfg.user is not None and base.uid == 0 and not env._is_base(cfg.user) else None
            made = await _in_thread(instance.exec, *scripts.make_workdir_argv(cfg.workdir, owner), timeout=60)
            if made.exit_code != 0:
                raise ValueError(f"rollbox sandbox: cannot make workdir {cfg.workdir!r}: "
                                 f"{made.stderr.decode(errors='replace').strip()}")
        return _Identity(uid=uid, name=name, workdir=workdir or base.workdir)

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        """Terminates the sample's sandboxes (also when the sample failed or was cancelled)."""
        live = _live().by_task.get(task_name, {})
        with anyio.CancelScope(shield=True):
            for env in environments.values():
                if isinstance(env, RollboxSandboxEnvironment):
                    live.pop(env.sandbox_id, None)
                    await _terminate(env.instance)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        """Terminates any sandbox of the task still running; with `cleanup=False`
        (`--no-sandbox-cleanup`) leaves them and says how to remove them."""
        left = _live().by_task.pop(task_name, {})
        if not cleanup:
            if left:
                logger.warning("rollbox sandboxes kept (--no-sandbox-cleanup): %s; remove them with "
                               "`rollbox rm %s`", ", ".join(left), " ".join(left))
            return
        with anyio.CancelScope(shield=True):
            for instance in left.values():
                await _terminate(instance)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:  # noqa: A002 - inspect's parameter name
        """`inspect sandbox cleanup rollbox [ID]`: terminates that sandbox, or every sandbox
        an inspect task made (those tagged `inspect_task`) on the local daemon."""
        client = default_client()
        if id is not None:
            await _terminate(SandboxInstance(id, client))
            return
        rows = await _in_thread(client.request, "GET", "/sandboxes")
        for row in rows:
            if TASK_TAG in (row.get("tags") or {}):
                await _terminate(SandboxInstance(row["sandbox_id"], client))

    # ---- commands -----------------------------------------------------------------------

    def _is_base(self, user: str) -> bool:
        """Whether `user` is who commands run as without a wrapper."""
        ident = self._identity
        return user == ident.name or (ident.uid is not None and user == str(ident.uid))

    def _argv(self, cmd: list[str], user: str | None, env: dict[str, str] | None) -> list[str]:
        target = user if user is not None else self.config.user
        if target is None or self._is_base(target):
            return list(cmd)
        if self._identity.uid != 0:
            raise SandboxUserUnsupportedError(
                f"rollbox sandbox {self.sandbox_id} runs commands as "
                f"{self._identity.name or self._identity.uid!r} (the image's user), not root: it cannot run as {target!r}")
        set_home = not env or not ({"HOME", "USER", "LOGNAME"} & env.keys())
        return scripts.as_user_argv(target, list(cmd), set_home=set_home)

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self._identity.workdir, path))

    async def _run(self, argv: list[str], *, stdin: bytes | str | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout: float | None, max_output: int) -> ExecResult:
        res: ExecResult = await _in_thread(self.instance.exec, *argv, timeout=timeout, env=env, cwd=cwd,
                                           stdin=stdin, max_output=max_output)
        if res.exit_code == scripts.USER_UNSUPPORTED_STATUS and scripts.USER_UNSUPPORTED_MARK.encode() in res.stderr:
            raise SandboxUserUnsupportedError(res.stderr.decode(errors="replace").strip())
        return res

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,  # noqa: A002
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> InspectExecResult[str]:
        """Runs `cmd` (argv; `cmd[0]` found through the sandbox's PATH) in the sandbox.

        Args:
            cmd: the command and its arguments. input: stdin (str is UTF-8), then closed.
            cwd: working directory; relative to the sample's directory. env: extra variables.
            user: a user name or uid of the image's /etc/passwd (None: the configured user).
            timeout: seconds; on expiry the command's whole process tree is killed.
            timeout_retry, concurrency: accepted for the interface; a rollbox timeout is a
                kill inside the sandbox, never a transport hiccup, so nothing is retried.

        Returns:
            inspect's ExecResult; output decoded as UTF-8 (invalid bytes replaced). An
            unknown user is a failed result whose stderr says "unable to find user NAME".

        Raises:
            TimeoutError: `timeout` expired. PermissionError: `cmd[0]` is not executable.
            OutputLimitExceededError: a stream passed inspect's exec output limit.
            SandboxUserUnsupportedError: the sandbox cannot run as `user` (its image runs as
                a non-root user, or it has no setpriv). SandboxUnavailableError: the sandbox
                is gone. ValueError: bad arguments (e.g. an invalid variable name).
        """
        if not cmd:
            raise ValueError("exec needs a command, e.g. ['ls', '-l']")
        argv = self._argv(cmd, user, env)
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        res = await self._run(argv, stdin=input, cwd=self._path(cwd) if cwd else self._identity.workdir,
                              env=env, timeout=timeout, max_output=min(limit, MAX_EXEC_OUTPUT))
        if res.timed_out:
            raise TimeoutError(f"command {shlex.join(cmd)[:200]} timed out after {timeout} s")
        stdout, stderr = res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace")
        if _launch_refused(res, cmd[0]):
            raise PermissionError(errno.EACCES, f"Permission denied: cannot run {cmd[0]}", cmd[0])
        if res.truncated:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                                           stdout if len(res.stdout) >= len(res.stderr) else stderr)
        code = 137 if res.oom_killed or res.exit_code is None else res.exit_code
        return InspectExecResult(success=code == 0, returncode=code, stdout=stdout, stderr=stderr)

    # ---- files --------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Writes `contents` (str as UTF-8) to `file` as the default user, parents made.

        Raises:
            IsADirectoryError, NotADirectoryError (a parent is a file), PermissionError,
            TimeoutError (600 s), SandboxUnavailableError; RuntimeError for anything else
            (e.g. the disk cap: "No space left on device").
        """
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        argv = self._argv(scripts.write_file_argv(self._path(file)), None, None)
        res = await self._run(argv, stdin=data, timeout=FILE_TIMEOUT_S, max_output=64 * 1024)
        if res.timed_out:
            raise TimeoutError(f"write_file {file}: timed out after {FILE_TIMEOUT_S:g} s")
        if res.exit_code != 0:
            raise _file_error("write_file", file, res)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:
        """The contents of `file`, read as the default user (text: strict UTF-8, newlines kept).

        Raises:
            FileNotFoundError, IsADirectoryError, PermissionError (the user, or the file's
            owner, cannot read it), OutputLimitExceededError (over inspect's read limit),
            UnicodeDecodeError (text=True), TimeoutError, SandboxUnavailableError.
        """
        path = self._path(file)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        argv = self._argv(scripts.read_file_argv(path, limit, READ_CHUNK), None, None)
        res = await self._run(argv, timeout=FILE_TIMEOUT_S, max_output=READ_CHUNK)
        if res.timed_out:
            raise TimeoutError(f"read_file {file}: timed out after {FILE_TIMEOUT_S:g} s")
        if res.exit_code == FileStatus.TOO_LARGE:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        if res.exit_code != 0:
            raise _file_error("read_file", file, res)
        size = int(res.stderr.decode().strip().rsplit("\n", 1)[-1] or 0)
        parts = [res.stdout]
        got = len(res.stdout)
        while got < size:
            more = await self._run(self._argv(scripts.read_chunk_argv(path, got, READ_CHUNK), None, None),
                                   timeout=FILE_TIMEOUT_S, max_output=READ_CHUNK)
            if more.timed_out or more.exit_code != 0 or not more.stdout:
                break
            parts.append(more.stdout)
            got += len(more.stdout)
        data = b"".join(parts)
        return data.decode("utf-8") if text else data

    # ---- connection ---------------------------------------------------------------------

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """The shell command that runs a command in this sandbox from the host
        (`rollbox exec ID -- sh`: a script on its stdin; rollbox has no TTY sessions).

        Raises:
            ConnectionError: the sandbox is no longer running.
        """
        if self.instance.terminated:
            raise ConnectionError(f"rollbox sandbox {self.sandbox_id} is not running (terminated)")
        try:
            info = await _in_thread(self.instance.info)
        except SandboxUnavailableError as e:
            raise ConnectionError(f"rollbox sandbox {self.sandbox_id} is not running: {e}") from None
        if info.state not in ("running", "paused"):
            raise ConnectionError(f"rollbox sandbox {self.sandbox_id} is not running ({info.state})")
        shell = ["sh"] if user is None or self._is_base(user) else ["runuser", "-u", user, "--", "sh"]
        prefix = [f"{k}={shlex.quote(os.environ[k])}" for k in ("ROLLBOX_HOME", "ROLLBOX_URL") if os.environ.get(k)]
        command = " ".join([*prefix, shlex.join(["rollbox", "exec", self.sandbox_id, "--", *shell])])
        return SandboxConnection(type="rollbox", command=command, container=self.sandbox_id)


async def _terminate(instance: SandboxInstance) -> None:
    try:
        await anyio.to_thread.run_sync(instance.terminate)
    except errors.RollboxError as e:
        logger.warning("rollbox sandbox %s: terminate failed: %s", instance.sandbox_id, e)


def _launch_refused(res: ExecResult, cmd0: str) -> bool:
    """Whether the launcher itself (the agent, or setpriv for another user) could not execute
    `cmd0` for lack of permission: exit 126 and its one line naming `cmd0`, nothing else. A
    command that itself prints "Permission denied" and exits 126 is an ordinary result."""
    if res.exit_code != 126 or res.stdout:
        return False
    line = res.stderr.decode(errors="replace")
    if line.count("\n") != 1 or not line.rstrip("\n").endswith("Permission denied"):
        return False
    return line.startswith((f"rollbox: cannot run '{cmd0}': ", f"rollbox: cannot run {cmd0!r}: ",
                            f"setpriv: failed to execute {cmd0}: "))


def _file_error(op: str, file: str, res: ExecResult) -> Exception:
    stderr = res.stderr.decode(errors="replace").strip()
    if res.exit_code == FileStatus.IS_A_DIRECTORY:
        return IsADirectoryError(errno.EISDIR, "Is a directory", file)
    if res.exit_code == FileStatus.NOT_FOUND:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    if res.exit_code == FileStatus.PERMISSION_DENIED:
        return PermissionError(errno.EACCES, "Permission denied", file)
    if res.exit_code == FileStatus.NOT_A_DIRECTORY:
        return NotADirectoryError(errno.ENOTDIR, "A parent of the path is not a directory", file)
    if res.oom_killed:
        return SandboxUnavailableError(f"{op} {file}: the sandbox ran out of memory")
    return RuntimeError(f"{op} {file}: exit {res.exit_code}: {stderr[-2000:]}")
