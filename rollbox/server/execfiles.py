"""Commands and files in a running sandbox, through its agent: exec (with the limits and
out-of-memory reporting of each runtime) and the file operations."""

from __future__ import annotations

import base64
import logging
import re
import time
from typing import Any

from .. import errors
from ..runtime import cgroups
from ..runtime.channel import AgentError
from .context import ServiceContext
from .registry import Running
from .teardown import DeathWatch
from .validation import check_env, container_id

# Output kept per stream of one exec, in bytes; the rest is counted and dropped (`truncated`).
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024
SANDBOX_OOM_MESSAGE = ("rollbox: the whole sandbox ran out of memory (gVisor's own kernel included) and ended; "
                      "give it more memory (Sandbox(memory=...))\n")
CONTAINER_UPLOAD_MIB = 16
CONTAINER_UPLOAD_B64 = (CONTAINER_UPLOAD_MIB << 20) * 4 // 3 + 4
ARG_MAX = 2 * 1024 * 1024  # bytes of argv + env per exec: Linux's default ARG_MAX (more fails as E2BIG)
AGENT_ERRORS: dict[str, type[errors.RollboxError]] = {
    "not_found": errors.FileNotFoundInSandbox,
    "is_a_directory": errors.InvalidArgument,
    "not_a_directory": errors.InvalidArgument,
    "permission_denied": errors.InvalidArgument,
    "invalid_argument": errors.InvalidArgument,
    "container_not_found": errors.ContainerNotFound,
    # The zygote could not start (no python3 >= 3.9, the pids limit): this sandbox has no
    # episode containers; a client error, not a server fault.
    "container_unavailable": errors.UnsupportedOperation,
    "container_error": errors.SandboxLost,
    # A process of the container killed or stopped its init: the episode's own doing, not the
    # platform's (so not retried); the container is gone, the pooled sandbox is retired.
    "container_ended": errors.InvalidState,
    "process_not_found": errors.ProcessNotFound,
    "stdin_closed": errors.StdinClosed,
    "not_a_pty": errors.NotAPty,
    "resource_exhausted": errors.ResourceExhausted,  # e.g. no thread for a process's reader (pids limit)
}


def container_op(op: str, container: str | None) -> tuple[str, dict[str, str]]:
    """The agent op and extra fields of `op` sent to the sandbox itself (container None) or to
    one of its episode containers (server/episodes.py)."""
    return (op, {}) if container is None else (f"container_{op}", {"cid": container})


log = logging.getLogger("rollbox.exec")


# The native agent's wording for an unknown user; the API says it the inspect-ai/Docker way.
_UNKNOWN_USER = re.compile(r"user '?([^']*?)'? is not in the image's /etc/passwd")


def user_message(message: str) -> str:
    """An agent's error message with an unknown user worded "unable to find user NAME: no
    matching entries in passwd file" whichever agent (native or Python) said it."""
    return _UNKNOWN_USER.sub(r"unable to find user \1: no matching entries in passwd file", message)


def check_user(user: str | int) -> str:
    """The wire form of `user=` (a name or uid, "name:group" too). Raises InvalidArgument."""
    if isinstance(user, bool) or not isinstance(user, (str, int)) or (isinstance(user, int) and user < 0):
        raise errors.InvalidArgument(f"user={user!r} must be a user name or a uid (int >= 0)")
    text = str(user)
    if not text or any(c in text for c in "\0\n"):
        raise errors.InvalidArgument(f"user={user!r} must be a non-empty user name or uid")
    return text


class ExecFiles:
    def __init__(self, ctx: ServiceContext, deathwatch: DeathWatch, running: Running) -> None:
        self.ctx = ctx
        self.deathwatch = deathwatch
        self.running = running

    async def exec(self, sandbox_id: str, argv: list[str], *, env: dict[str, str] | None = None,
                   cwd: str | None = None, stdin: str | None = None, timeout: float | None = None,
                   max_output: int | None = None, container: str | None = None,
                   user: str | int | None = None) -> dict[str, Any]:
        """Runs `argv` in the sandbox (or in its episode container `container`); returns the
        wire form of ExecResult. user: a name or uid of the image (default: the image's User).

        Raises:
            InvalidArgument: bad argv, env, stdin (not base64) or timeout (seconds); an unknown
                user ("unable to find user NAME: no matching entries in passwd file").
        """
        if not argv or not all(isinstance(a, str) for a in argv):
            raise errors.InvalidArgument("exec needs a non-empty list of string arguments, e.g. exec('python3', '-c', 'print(1)')")
        if any("\0" in a for a in argv):
            raise errors.InvalidArgument("exec arguments cannot contain NUL bytes")
        if not argv[0]:
            raise errors.InvalidArgument("exec's command (its first argument) is empty")
        if sum(len(a) for a in argv) + sum(len(k) + len(v) for k, v in (env or {}).items()) > ARG_MAX:
            raise errors.InvalidArgument(f"exec arguments and environment exceed {ARG_MAX} bytes; pass large "
                                         "data as stdin or a file (sb.fs.write_file)")
        check_env(env or {})
        if stdin is not None:
            try:
                base64.b64decode(stdin, validate=True)
            except ValueError:
                raise errors.InvalidArgument("stdin must be base64-encoded bytes") from None
        if timeout is not None and timeout <= 0:
            raise errors.InvalidArgument(f"timeout={timeout} must be a positive number of seconds, or None for no limit")
        lv = await self.running(sandbox_id)
        # The program's name and counts only: arguments and environment values may hold secrets.
        log.debug("exec in %s%s: %s (+%d arguments, %d environment variables, not logged)", sandbox_id,
                  f"/{container}" if container else "", argv[0], len(argv) - 1, len(env or {}))
        cg = self.ctx.cg
        started = time.monotonic()
        cid = container_id(sandbox_id)
        # On runc the kernel's counters are per sandbox and cumulative: what this exec did is
        # the difference (gVisor's own kernel reports its limits through the agent instead).
        before = (cgroups.oom_kill_count(cid, cg), cgroups.pids_max_count(cid, cg)) \
            if lv.runtime == "runc" else (0, 0)
        lv.busy += 1
        try:
            wire_op, extra = container_op("exec", container)
            reply = await self.deathwatch.request(
                lv, wire_op, None if timeout is None else timeout + 30.0, **extra, argv=argv, env=env or {}, cwd=cwd or lv.workdir,
                user=lv.user if user is None else check_user(user),
                stdin=stdin, timeout=timeout, max_output=DEFAULT_MAX_OUTPUT if max_output is None else max_output)
        except errors.RollboxError as e:
            # The last line of defence: the host's limit (the agent's watcher kills the biggest
            # exec first) ended the whole sandbox. Reported on the exec that was running, and
            # every later call raises SandboxTerminated (oom).
            if lv.exit_reason == "oom" or cgroups.oom_killed(container_id(sandbox_id), cg):
                why = base64.b64encode(SANDBOX_OOM_MESSAGE.encode()).decode()
                return {"exit_code": 137, "oom_killed": True, "sandbox_oom": True, "stdout": "", "stderr": why,
                        "timed_out": False, "truncated": False, "duration_s": time.monotonic() - started}
            if isinstance(e, AgentError):
                cls = AGENT_ERRORS.get(e.kind, errors.AgentFailed)
                detail = user_message(e.message) if e.kind in AGENT_ERRORS else f"{e.kind}: {e.message}"
                raise cls(f"exec in sandbox {sandbox_id}: {detail}", sandbox_id=sandbox_id) from None
            raise
        finally:
            lv.busy -= 1
            lv.last_active = time.monotonic()
            self.ctx.metrics.exec_seconds.observe(time.monotonic() - started)
        # On runc the kernel OOM-kills the process, not the sandbox (gVisor's limit covers its
        # kernel too): a SIGKILLed command during which the cgroup saw an OOM kill ran out of
        # memory; a command the pids limit refused forks during is a fork bomb's.
        if lv.runtime == "runc":
            reply["oom_killed"] = (reply.get("exit_code") in (-9, 137) or reply.get("signal") == 9) \
                and cgroups.oom_kill_count(cid, cg) > before[0]
            reply["pids_limited"] = bool(reply.get("pids_limited")) or cgroups.pids_max_count(cid, cg) > before[1]
        else:
            # gVisor: the agent's memory watcher SIGKILLed this command's tree (exit 137) and
            # the sandbox goes on.
            reply["oom_killed"] = bool(reply.get("oom_killed"))
        return reply

    async def agent(self, sandbox_id: str, op: str, container: str | None = None, **fields: Any) -> dict[str, Any]:
        """One agent operation (in episode container `container` when given); the agent's error
        kinds become the matching typed errors."""
        lv = await self.running(sandbox_id)
        # In flight: neither idle for auto-pause nor pausable. A client following a background
        # process's output (proc_read long-polls) keeps it from auto-pause only: an explicit
        # pause() goes ahead and the stream picks up again after the resume.
        streaming = op == "proc_read"
        if streaming:
            lv.streams += 1
        else:
            lv.busy += 1
        try:
            wire_op, extra = container_op(op, container)
            return await self.deathwatch.request(lv, wire_op, 120.0, **extra, **fields)
        except AgentError as e:
            cls = AGENT_ERRORS.get(e.kind, errors.AgentFailed)
            detail = e.message if e.kind in AGENT_ERRORS else f"{e.kind}: {e.message}"
            raise cls(f"{op} in sandbox {sandbox_id}: {detail}", sandbox_id=sandbox_id) from None
        finally:
            if streaming:
                lv.streams -= 1
            else:
                lv.busy -= 1
            lv.last_active = time.monotonic()

    async def write_file(self, sandbox_id: str, path: str, data_b64: str, mode: int = 0o644,
                         container: str | None = None) -> dict[str, Any]:
        """Raises InvalidArgument for a relative path."""
        if not path.startswith("/"):
            raise errors.InvalidArgument(f"path {path!r} must be absolute, e.g. '/work/a.py'")
        if container is not None and len(data_b64) > CONTAINER_UPLOAD_B64:
            # Container uploads travel inline through the agent and the zygote (memory of the
            # pooled sandbox, shared by its episodes), not streamed as a sandbox's are.
            raise errors.InvalidArgument(
                f"{len(data_b64) * 3 // 4} bytes is over the {CONTAINER_UPLOAD_MIB} MiB an episode container takes in "
                f"one write_file; write it in parts, or put large inputs in a Volume or the snapshot")
        return await self.agent(sandbox_id, "write_file", container, path=path, data=data_b64, mode=mode)

    async def read_file(self, sandbox_id: str, path: str, container: str | None = None) -> dict[str, Any]:
        return await self.agent(sandbox_id, "read_file", container, path=path)

    async def list_files(self, sandbox_id: str, path: str, container: str | None = None) -> dict[str, Any]:
        return await self.agent(sandbox_id, "list_files", container, path=path)

    async def remove_file(self, sandbox_id: str, path: str, container: str | None = None) -> dict[str, Any]:
        return await self.agent(sandbox_id, "remove", container, path=path)

    async def agent_request(self, sandbox_id: str, op: str, wait_s: float | None, **fields: Any) -> dict[str, Any]:
        """One raw agent request on a running sandbox (episode pools use it). Raises AgentError
        for the agent's error replies, SandboxLost/SandboxTerminated as the death watch does."""
        return await self.deathwatch.request(await self.running(sandbox_id), op, wait_s, **fields)
