"""Background processes of a sandbox (gh-16): the daemon's side, a relay to the agent.

The process table lives in the sandbox's agent (runtime/agent/procs.py), so the daemon keeps no
state: a daemon restart, a client exiting, a memory snapshot or a fork loses no process or its
retained output. Output is streamed to clients from a loop of `proc_read` long-polls (each waits
up to 10 s inside the agent for new bytes), never by the client polling.

run_code is built on the same ops: a persistent interpreter (runtime/agent/code_driver.py,
`/.rollbox/code_driver.py` in the sandbox) started as a background process on first use and
spoken to over its stdin/stdout.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from .. import errors
from ..runtime.bundle import AGENT_MOUNT
from .execfiles import ARG_MAX, ExecFiles, check_user, user_message
from .validation import check_env

READ_WAIT_S = 10.0  # one long-poll inside the agent
STOP_CHECK_S = 0.25  # how often a waiting stream looks whether the daemon is stopping
STREAMS = ("stdout", "stderr")
MAX_RETAINED = 64 * 1024 * 1024  # the most a request may ask the agent to keep per stream
CODE_DRIVER = f"{AGENT_MOUNT}/code_driver.py"
DRIVER_ARGV = ["python3", "-u", CODE_DRIVER]
RESULT_PREFIX = b"\x1eROLLBOX-RESULT "
LANGUAGES = ("python",)


class Processes:
    """`/sandboxes/{id}/processes/...` and `/run_code` of the HTTP API (server/process_routes.py)."""

    def __init__(self, execfiles: ExecFiles) -> None:
        self.execfiles = execfiles
        # run_code's one-at-a-time lock per sandbox, held only while a call uses it: an entry
        # goes with its last user, so the sandboxes that ended leave nothing behind.
        self._code_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def _op(self, sandbox_id: str, op: str, **fields: Any) -> dict[str, Any]:
        """One agent op; the sandbox counts as active (its keep_warm timer restarts)."""
        lv = await self.execfiles.running(sandbox_id)
        lv.last_active = time.monotonic()
        try:
            return await self.execfiles.agent(sandbox_id, op, **fields)
        except errors.InvalidArgument as e:
            raise type(e)(user_message(e.message), sandbox_id=sandbox_id) from None
        except errors.ApiError:
            raise
        except errors.RollboxError as e:
            if type(e) in (errors.RollboxError, errors.AgentFailed) and (
                    "unknown op" in e.message.lower() or f"KeyError: '{op}'" in e.message):
                raise errors.UnsupportedOperation(
                    f"sandbox {sandbox_id}'s agent has no background processes ({op}): it is an older build; "
                    "start a fresh sandbox, or force the Python agent with ROLLBOX_AGENT=python", sandbox_id=sandbox_id
                ) from None
            raise

    async def start(self, sandbox_id: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                    user: str | int | None = None, pty: bool = False, cols: int = 80, rows: int = 24,
                    timeout: float | None = None, max_retained: int | None = None) -> dict[str, Any]:
        """Starts `argv` in the background; returns {pid, started_at}.

        Raises:
            InvalidArgument: bad argv/env/timeout/size, an unknown user, a command not found.
        """
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv) or not argv[0]:
            raise errors.InvalidArgument("process.exec needs a non-empty list of string arguments without NUL bytes, "
                                         "e.g. process.exec('python3', '-m', 'http.server')")
        if sum(len(a) for a in argv) + sum(len(k) + len(v) for k, v in (env or {}).items()) > ARG_MAX:
            raise errors.InvalidArgument(f"arguments and environment exceed {ARG_MAX} bytes; pass data as a file")
        check_env(env or {})
        if timeout is not None and timeout <= 0:
            raise errors.InvalidArgument(f"timeout={timeout} must be a positive number of seconds, or None")
        lv = await self.execfiles.running(sandbox_id)
        return await self._op(sandbox_id, "proc_start", argv=argv, env=env or {}, cwd=cwd or lv.workdir,
                              user=lv.user if user is None else check_user(user), pty=pty, cols=cols, rows=rows,
                              timeout=timeout, max_retained=max_retained)

    async def list(self, sandbox_id: str) -> list[dict[str, Any]]:
        return list((await self._op(sandbox_id, "proc_list"))["processes"])

    async def status(self, sandbox_id: str, pid: int) -> dict[str, Any]:
        """Raises ProcessNotFound."""
        return _entry(await self._op(sandbox_id, "proc_status", pid=pid))

    async def read(self, sandbox_id: str, pid: int, stdout: int = 0, stderr: int = 0, wait: float = 0.0,
                   max_bytes: int | None = None) -> dict[str, Any]:
        """One proc_read: bytes past the offsets (waiting up to `wait` s for some)."""
        fields: dict[str, Any] = {"pid": pid, "offsets": {"stdout": stdout, "stderr": stderr},
                                  "wait": max(0.0, min(wait, READ_WAIT_S))}
        if max_bytes:
            fields["max_bytes"] = max_bytes
        return await self._op(sandbox_id, "proc_read", **fields)

    async def stream(self, sandbox_id: str, pid: int, stdout: int = 0, stderr: int = 0, follow: bool = True,
                     stopping: Callable[[], bool] = lambda: False,
                     timeout: float | None = None) -> AsyncIterator[bytes]:
        """NDJSON lines: {"stream", "data" (base64), "offset", "truncated"} per chunk, then one
        {"exit": {running, exit_code, signal, timed_out, pids_limited, stdout_total, stderr_total}}
        (or {"error": {code, message, sandbox_id}} when the sandbox ends or is lost meanwhile)
        once the process ended and every byte was sent (or at once when `follow` is false and
        nothing more is there). The first read happens before the response starts, so an unknown
        pid is a typed 404 rather than a broken stream. When `stopping()` turns true (the
        daemon is going down) the stream ends without its exit line, at once rather than at
        the next long-poll's end; the SDK then asks the next daemon from where it was.
        `timeout`: seconds after which the stream ends with an exit line saying running=true
        (what `wait(timeout)` needs, without a client-side thread left reading)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        offsets = {"stdout": stdout, "stderr": stderr}
        first = await self.read(sandbox_id, pid, stdout, stderr, wait=0.0)

        async def lines() -> AsyncIterator[bytes]:
            try:
                async for line in follow_lines(first):
                    yield line
            except errors.RollboxError as e:
                # The answer has started: the error travels as the stream's last line.
                yield _line({"error": e.to_wire()})

        async def follow_lines(first: dict[str, Any]) -> AsyncIterator[bytes]:
            r = first
            while True:
                more = False
                for s in STREAMS:
                    part = r[s]
                    if part["data"]:
                        n = len(base64.b64decode(part["data"]))
                        yield _line({"stream": s, "data": part["data"], "offset": part["offset"],
                                     "truncated": part["truncated"]})
                        offsets[s] = part["offset"] + n
                    more |= offsets[s] < part["total"]
                expired = deadline is not None and time.monotonic() >= deadline
                if not more and (not r["running"] or not follow or expired):
                    yield _line({"exit": {k: r.get(k) for k in ("running", "exit_code", "signal", "timed_out",
                                                                "pids_limited")}
                                 | {"stdout_total": r["stdout"]["total"], "stderr_total": r["stderr"]["total"]}})
                    return
                wait = 0.0 if more else READ_WAIT_S if deadline is None else \
                    max(0.0, min(READ_WAIT_S, deadline - time.monotonic()))
                poll = asyncio.ensure_future(self.read(sandbox_id, pid, offsets["stdout"], offsets["stderr"], wait=wait))
                # A client gone (or a sandbox ending) mid-poll must not leave a failed poll
                # unretrieved ("Task exception was never retrieved" in the log).
                poll.add_done_callback(lambda f: f.cancelled() or f.exception())
                try:
                    while not poll.done():
                        await asyncio.wait({poll}, timeout=STOP_CHECK_S)
                        if stopping() and not poll.done():
                            poll.cancel()
                            return
                finally:
                    if not poll.done():
                        poll.cancel()
                r = poll.result()

        return lines()

    async def write(self, sandbox_id: str, pid: int, data_b64: str, close: bool = False) -> dict[str, Any]:
        """Raises StdinClosed, ProcessNotFound, InvalidArgument (data not base64)."""
        try:
            base64.b64decode(data_b64, validate=True)
        except ValueError:
            raise errors.InvalidArgument("stdin data must be base64-encoded bytes") from None
        return await self._op(sandbox_id, "proc_write", pid=pid, data=data_b64, close=close)

    async def kill(self, sandbox_id: str, pid: int, signal: int = 9) -> dict[str, Any]:
        if not 1 <= signal <= 64:
            raise errors.InvalidArgument(f"signal={signal} must be a signal number 1..64 (9: SIGKILL, 15: SIGTERM)")
        return await self._op(sandbox_id, "proc_kill", pid=pid, signal=signal)

    async def resize(self, sandbox_id: str, pid: int, cols: int, rows: int) -> dict[str, Any]:
        """Raises NotAPty for a process started without pty=True."""
        return await self._op(sandbox_id, "proc_resize", pid=pid, cols=cols, rows=rows)

    # ---- run_code --------------------------------------------------------------------------

    async def run_code(self, sandbox_id: str, code: str, language: str = "python",
                       timeout: float | None = None) -> dict[str, Any]:
        """Runs `code` in the sandbox's persistent interpreter (started on first use); returns
        {stdout, stderr, value, error}. One snippet at a time per sandbox.

        Raises:
            InvalidArgument: a language other than "python". InvalidState: the interpreter
                ended (state is lost; the next call starts a fresh one) or ran past `timeout`.
        """
        if language not in LANGUAGES:
            raise errors.InvalidArgument(f"run_code language={language!r} is not supported; supported: "
                                         f"{', '.join(LANGUAGES)}")
        lock = self._code_locks.setdefault(sandbox_id, asyncio.Lock())
        async with lock:
            pid = await self._driver(sandbox_id)
            st = await self.status(sandbox_id, pid)
            offset = st["stdout_total"]
            rid = secrets.token_hex(8)
            req = json.dumps({"id": rid, "code": code}).encode() + b"\n"
            await self.write(sandbox_id, pid, base64.b64encode(req).decode())
            deadline = None if timeout is None else time.monotonic() + timeout
            buf = b""
            while True:
                wait = READ_WAIT_S if deadline is None else max(0.0, min(READ_WAIT_S, deadline - time.monotonic()))
                r = await self.read(sandbox_id, pid, stdout=offset, stderr=1 << 62, wait=wait)
                data = base64.b64decode(r["stdout"]["data"])
                offset = r["stdout"]["offset"] + len(data)
                buf += data
                for line in buf.split(b"\n")[:-1]:
                    if line.startswith(RESULT_PREFIX):
                        reply = json.loads(line[len(RESULT_PREFIX):])
                        if reply.get("id") == rid:
                            reply.pop("id", None)
                            return dict(reply)
                buf = buf[buf.rfind(b"\n") + 1:]
                if not r["running"]:
                    raise errors.InvalidState(f"run_code: the sandbox's Python interpreter ended (exit code "
                                              f"{r.get('exit_code')}) while running the snippet; its state is lost "
                                              "and the next run_code starts a fresh one", sandbox_id=sandbox_id)
                if deadline is not None and time.monotonic() > deadline:
                    await self.kill(sandbox_id, pid)
                    raise errors.InvalidState(f"run_code ran past its timeout of {timeout} s; the interpreter was "
                                              "killed (its state is lost)", sandbox_id=sandbox_id)

    async def _driver(self, sandbox_id: str) -> int:
        """The pid of the sandbox's running interpreter, starting it when there is none (found
        in the agent's table by its argv, so a daemon restart or a restored copy finds it)."""
        for p in await self.list(sandbox_id):
            if p["running"] and p["argv"] == DRIVER_ARGV:
                return int(p["pid"])
        lv = await self.execfiles.running(sandbox_id)
        r = await self._op(sandbox_id, "proc_start", argv=DRIVER_ARGV, env={}, cwd=lv.workdir, user=lv.user, pty=False,
                           cols=80, rows=24, timeout=None, max_retained=0)
        return int(r["pid"])


def _entry(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in ("id", "ok", "agent_s")}


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
