"""`sb.process`: background processes, live output, stdin, terminals and run_code (gh-16).

    p = sb.process.exec("python3", "-m", "http.server", "8000")   # returns at once
    for chunk in p.stdout: ...          # bytes chunks as they are written (from the first byte)
    for text in p.stdout.text(): ...    # str, decoded incrementally (split characters kept whole)
    async for chunk in p.stdout.aio(): ...
    p.stdin.write(b"input\\n"); p.stdin.close()
    p.kill()                            # the whole process tree, daemonised descendants included
    res = p.wait(timeout=10)            # ExecResult
    sb.process.list_processes(); sb.process.get_process(pid)   # re-attach, from any client
    sb.process.run_code("x = 1\\nx + 1").value == "2"

The process table lives in the sandbox's agent: a process survives the client that started it
and daemon restarts, and a memory snapshot, pause or fork carries it (running, with its
retained output) into every restored copy. Retention per stream: the first `max_retained`
bytes (default 1 MiB) for the process's life plus the most recent 1 MiB; a reader that
starts inside a dropped region resumes at the next kept byte and sees `truncated`.
Every call has an awaitable twin: `await sb.process.exec.aio(...)`, `await p.wait.aio()`,
`async for name, chunk in p.logs.aio()`, `await p.stdout.read.aio()`.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import signal as _signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import errors
from ..types import ExecResult
from ..client.portal import PORTAL
from ._aio import cleaning, streaming, synchronized

if TYPE_CHECKING:
    from .sandbox import SandboxInstance

_FAR = 1 << 62  # an offset past any stream's end: "not this stream"
STDIN_CHUNK = 1 << 20  # bytes per stdin request
RESUME_S = 60.0  # how long a stream waits for a restarting daemon before raising DaemonUnavailable
TIMED_OUT_CODE = 124  # poll() of a process its timeout killed (the `timeout` command's status)


@dataclass(frozen=True)
class ProcessInfo:
    """One background process as the sandbox's agent lists it.

    Attributes:
        running: the main process has not exited yet.
        exit_code: its status (128+N when signal N ended it); None while running or when its
            `timeout` killed it (timed_out=True).
        started_at, ended_at: unix seconds (ended_at None while running).
        stdout_total, stderr_total: bytes written so far (retained or not).
    """

    pid: int
    argv: list[str]
    cwd: str | None
    user: str | None
    pty: bool
    running: bool
    exit_code: int | None
    signal: int | None
    timed_out: bool
    started_at: float
    ended_at: float | None
    stdout_total: int
    stderr_total: int

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "ProcessInfo":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


@dataclass(frozen=True)
class CodeError:
    """An exception a run_code snippet raised: its class name, str() and formatted traceback."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class CodeResult:
    """What one run_code snippet did: its captured stdout/stderr (text), repr() of its last
    expression (None when the last statement is not an expression or it is None), and the
    exception it raised (None when it ran through)."""

    stdout: str
    stderr: str
    value: str | None
    error: CodeError | None = None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "CodeResult":
        e = d.get("error")
        return cls(stdout=d.get("stdout") or "", stderr=d.get("stderr") or "", value=d.get("value"),
                   error=CodeError(str(e.get("name")), str(e.get("value")), str(e.get("traceback"))) if e else None)


def decode_chunks(chunks: Iterable[bytes], encoding: str = "utf-8", errors: str = "replace") -> Iterator[str]:
    """Decodes a stream of byte chunks incrementally: a multi-byte character split across two
    chunks comes out whole in the later piece (nothing yielded for a chunk that completes none)."""
    dec = codecs.getincrementaldecoder(encoding)(errors)
    for chunk in chunks:
        text = dec.decode(chunk)
        if text:
            yield text
    tail = dec.decode(b"", final=True)
    if tail:
        yield tail


async def adecode_chunks(chunks: AsyncIterator[bytes], encoding: str = "utf-8",
                         errors: str = "replace") -> AsyncIterator[str]:
    """`decode_chunks` for an async stream of chunks."""
    dec = codecs.getincrementaldecoder(encoding)(errors)
    async for chunk in chunks:
        text = dec.decode(chunk)
        if text:
            yield text
    tail = dec.decode(b"", final=True)
    if tail:
        yield tail


async def _only(pairs: AsyncIterator[tuple[str, bytes]]) -> AsyncIterator[bytes]:
    async for _name, chunk in pairs:
        yield chunk


class OutputStream:
    """`p.stdout` / `p.stderr`: iterate for bytes chunks as the process writes them, from its
    first retained byte until it ends (each iteration starts over: it reads the retained
    output, so a late reader misses nothing the retention cap kept).

    `truncated` is True once an iteration skipped a dropped region."""

    def __init__(self, proc: "SandboxProcess", name: str) -> None:
        self._proc = proc
        self.name = name
        self.truncated = False

    def _achunks(self) -> AsyncIterator[bytes]:
        return _only(self._proc._chunks(self.name))

    def __iter__(self) -> Iterator[bytes]:
        return PORTAL.iterate(self._achunks())

    def aio(self) -> AsyncIterator[bytes]:
        """`async for chunk in p.stdout.aio()`: the same chunks, without blocking the loop."""
        return PORTAL.aiterate(self._achunks())

    def text(self, encoding: str = "utf-8", errors: str = "replace") -> Iterator[str]:
        """The chunks as str, decoded incrementally (see `decode_chunks`)."""
        return PORTAL.iterate(adecode_chunks(self._achunks(), encoding, errors))

    def text_aio(self, encoding: str = "utf-8", errors: str = "replace") -> AsyncIterator[str]:
        """`async for s in p.stdout.text_aio()`."""
        return PORTAL.aiterate(adecode_chunks(self._achunks(), encoding, errors))

    @synchronized
    async def read(self) -> bytes:
        """Everything (retained) until the process ends (`await p.stdout.read.aio()`)."""
        return b"".join([c async for c in self._achunks()])


class ProcessStdin:
    """`p.stdin`: the process's stdin pipe (its terminal for pty=True)."""

    def __init__(self, proc: "SandboxProcess") -> None:
        self._proc = proc

    @synchronized
    async def write(self, data: bytes | str, timeout: float | None = 60.0) -> int:
        """Writes `data` (str is UTF-8 encoded) and returns its length once all of it is in
        the pipe: like a pipe, this blocks while the process does not read, for at most
        `timeout` seconds (None: until it reads or ends).
        Raises StdinClosed after close(), ProcessNotFound, TimeoutError when the process did
        not take it all within `timeout` (the message says how many bytes it took)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        view = memoryview(raw)
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            part = view[:STDIN_CHUNK]
            r = await self._proc._call("POST", "stdin", {"data": base64.b64encode(part).decode(), "close": False})
            view = view[int(r["written"]):]
            if not view:
                return len(raw)
            if until is not None and time.monotonic() > until:
                raise TimeoutError(f"process {self._proc.pid} took {len(raw) - len(view)} of {len(raw)} bytes on "
                                   f"stdin in {timeout} s: it is not reading; write the rest later or kill() it")

    @synchronized
    async def close(self) -> None:
        """Closes stdin (the process reads EOF; a terminal gets ^D). Raises StdinClosed when
        already closed."""
        await self._proc._call("POST", "stdin", {"data": "", "close": True})


class SandboxProcess:
    """A background process in a sandbox (from `sb.process.exec` or `get_process`)."""

    def __init__(self, sb: "SandboxInstance", pid: int) -> None:
        self._sb = sb
        self.pid = pid
        self.stdout = OutputStream(self, "stdout")
        self.stderr = OutputStream(self, "stderr")
        self.stdin = ProcessStdin(self)

    def __repr__(self) -> str:
        return f"SandboxProcess({self._sb.sandbox_id!r}, pid={self.pid})"

    async def _call(self, method: str, sub: str, body: Any = None) -> Any:
        return await self._sb._call(method, f"processes/{self.pid}{'/' + sub if sub else ''}", body)

    async def _events(self, stdout: int, stderr: int, until: float | None = None,
                      follow: bool = True) -> AsyncIterator[dict[str, Any]]:
        """The output stream's events from these offsets until the {"exit"} event (at once,
        with `running` true, after what is retained when not `follow`ing). A daemon
        that restarts (or crashes) meanwhile cuts the answer: it is asked again from the
        offsets reached, for up to RESUME_S seconds (the process lives in the sandbox)."""
        offsets = {"stdout": stdout, "stderr": stderr}
        path = f"/sandboxes/{self._sb.sandbox_id}/processes/{self.pid}/output"
        lost_at: float | None = None
        while True:
            params: dict[str, Any] = {**offsets, "follow": "true" if follow else "false"}
            if until is not None:  # the daemon ends the stream then, with a running=true exit line
                params["timeout"] = max(0.0, until - time.monotonic())
            try:
                async for ev in self._sb._client.aio.stream_lines(path, params=params):
                    lost_at = None
                    if "stream" in ev:
                        offsets[ev["stream"]] = int(ev["offset"]) + len(base64.b64decode(ev["data"]))
                    yield ev
                    if "exit" in ev:
                        return
                # Ended without its exit line: the daemon stopped (it ends streams on the way down).
                raise errors.DaemonUnavailable(f"the daemon ended the stream of {path} early")
            except errors.DaemonUnavailable:
                now = time.monotonic()
                lost_at = now if lost_at is None else lost_at
                if now - lost_at > RESUME_S:
                    raise
                await asyncio.sleep(0.2)
            except errors.InvalidState as e:
                # Paused under the follower: wait (without asking for output, which would resume
                # it) until someone resumes it, then go on from the offsets reached.
                if "was paused" not in str(e):
                    raise
                await self._wait_while_paused()

    async def _wait_while_paused(self) -> None:
        """Returns once the sandbox is not paused (asking its state, which does not resume it)."""
        while (await self._sb.info.aio()).state == "paused":
            await asyncio.sleep(0.5)

    async def _chunks(self, which: str | None = None, follow: bool = True) -> AsyncIterator[tuple[str, bytes]]:
        """(stream, bytes) pairs of `which` (None: both) until the process ends (not
        `follow`ing: until the end of what is retained now)."""
        out = 0 if which in (None, "stdout") else _FAR
        err = 0 if which in (None, "stderr") else _FAR
        async for ev in self._events(out, err, follow=follow):
            if "stream" in ev:
                if ev.get("truncated"):
                    getattr(self, ev["stream"]).truncated = True
                yield ev["stream"], base64.b64decode(ev["data"])

    @streaming
    async def logs(self, follow: bool = True) -> AsyncIterator[tuple[str, bytes]]:
        """("stdout" | "stderr", chunk) pairs of both streams until the process ends (in the
        order the agent read them; their relative order within one read is not kept); with
        `follow=False`, only the output retained so far, then it returns at once.
        `async for name, chunk in p.logs.aio()` too."""
        async for pair in self._chunks(None, follow):
            yield pair

    @synchronized
    async def status(self) -> ProcessInfo:
        """Raises ProcessNotFound when the sandbox's agent does not know the pid (any more)."""
        return ProcessInfo.from_wire(await self._call("GET", ""))

    @synchronized
    async def poll(self) -> int | None:
        """The exit code once the process ended (124 when its timeout killed it), else None."""
        st = await self.status.aio()
        if st.running:
            return None
        return TIMED_OUT_CODE if st.exit_code is None else st.exit_code

    @synchronized
    async def wait(self, timeout: float | None = None) -> ExecResult:
        """Waits for the process to end; returns its ExecResult with its retained output
        (`truncated` when some was dropped; stdout_bytes/stderr_bytes count everything).

        Raises:
            TimeoutError: still running after `timeout` seconds (it keeps running).
        """
        bufs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        truncated = False
        end: dict[str, Any] = {}
        until = None if timeout is None else time.monotonic() + timeout
        async for ev in self._events(0, 0, until):
            if "stream" in ev:
                bufs[ev["stream"]] += base64.b64decode(ev["data"])
                truncated |= bool(ev.get("truncated"))
            elif "exit" in ev:
                end = ev["exit"]
        if end.get("running"):
            raise TimeoutError(f"process {self.pid} in sandbox {self._sb.sandbox_id} is still running after "
                               f"{timeout} s (it keeps running; kill() stops it)")
        st = await self.status.aio()
        return ExecResult(
            exit_code=None if end.get("timed_out") else end.get("exit_code"),
            stdout=bytes(bufs["stdout"]), stderr=bytes(bufs["stderr"]), timed_out=bool(end.get("timed_out")),
            truncated=truncated or len(bufs["stdout"]) < int(end.get("stdout_total") or 0)
            or len(bufs["stderr"]) < int(end.get("stderr_total") or 0),
            duration_s=(st.ended_at or st.started_at) - st.started_at,
            stdout_bytes=int(end.get("stdout_total") or 0), stderr_bytes=int(end.get("stderr_total") or 0),
            pids_limited=bool(end.get("pids_limited")), signal=end.get("signal"))

    @synchronized
    async def kill(self, signal: int = _signal.SIGKILL) -> int:
        """Sends `signal` (default SIGKILL) to the process's whole tree: its process group and
        every descendant, setsid'd or daemonised ones included. Returns how many processes
        were signalled. Raises ProcessNotFound."""
        return int((await self._call("POST", "kill", {"signal": int(signal)}))["killed"])

    @synchronized
    async def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal size of a pty=True process (it gets SIGWINCH). Raises NotAPty."""
        await self._call("POST", "resize", {"cols": cols, "rows": rows})


@dataclass
class SandboxProcesses:
    """`sb.process`: start, list and re-attach to background processes; run_code."""

    _sb: "SandboxInstance" = field(repr=False)

    @cleaning(lambda p: p.kill.aio())  # a cancelled exec.aio leaves no process running
    async def exec(self, *args: str, cwd: str | None = None, env: dict[str, str] | None = None,
             user: str | int | None = None, timeout: float | None = None, pty: bool = False,
             cols: int = 80, rows: int = 24, max_retained: int | None = None) -> SandboxProcess:
        """Starts a command (argv, no shell) in the background and returns at once.

        Args:
            *args: the command and its arguments (or one list).
            cwd: working directory (default: the image's WorkingDir, else $HOME, else /).
            env: extra environment variables. user: a user name or uid of the image (default:
                the image's User).
            timeout: seconds, after which its whole tree is killed (timed_out=True); None: none.
            pty: run under a terminal of `cols` x `rows` (stdout and stderr merged; raw bytes
                both ways; resize() works).
            max_retained: bytes of the start of each stream kept for the process's life
                (default 1 MiB, at most 64 MiB); the most recent 1 MiB is kept besides.

        Raises:
            InvalidArgument: an unknown user ("unable to find user NAME: no matching entries in
                passwd file"), a command not found, a bad argument.
        """
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = tuple(args[0])
        r = await self._sb._call("POST", "processes", {"argv": list(args), "env": env or {}, "cwd": cwd, "user": user,
                                                 "pty": pty, "cols": cols, "rows": rows, "timeout": timeout,
                                                 "max_retained": max_retained})
        return SandboxProcess(self._sb, int(r["pid"]))

    @synchronized
    async def list_processes(self) -> list[ProcessInfo]:
        """Processes started through the API that run, plus the 64 most recently ended (kept
        600 s; a process forgotten from the list has had its remaining tree killed)."""
        return [ProcessInfo.from_wire(d) for d in (await self._sb._call("GET", "processes"))["processes"]]

    @synchronized
    async def get_process(self, pid: int) -> SandboxProcess:
        """A handle on a listed process (from any client). Raises ProcessNotFound."""
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise errors.ProcessNotFound(f"pid {pid!r} is not a process id (an int)", sandbox_id=self._sb.sandbox_id)
        p = SandboxProcess(self._sb, pid)
        await p.status.aio()
        return p

    @synchronized
    async def run_code(self, code: str, language: str = "python", timeout: float | None = None) -> CodeResult:
        """Runs `code` in the sandbox's persistent interpreter (started on first use, kept for
        the sandbox's life: variables and imports carry over between calls). A raised
        exception is a result (`error`), not an exception here.

        Raises:
            InvalidArgument: an unsupported language (only "python").
            InvalidState: the interpreter died or ran past `timeout` (its state is lost).
        """
        return CodeResult.from_wire(await self._sb._call("POST", "run_code", {"code": code, "language": language,
                                                                        "timeout": timeout}))
