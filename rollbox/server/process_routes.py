"""HTTP routes of background processes (server/processes.py; gh-16).

    POST   /sandboxes/{sid}/processes                  start one; returns at once with its pid
    GET    /sandboxes/{sid}/processes                  those running and recently ended
    GET    /sandboxes/{sid}/processes/{pid}            one's status
    GET    /sandboxes/{sid}/processes/{pid}/output     its output as a stream (chunked NDJSON)
    POST   /sandboxes/{sid}/processes/{pid}/stdin      write to (and/or close) its stdin
    POST   /sandboxes/{sid}/processes/{pid}/kill       signal its whole tree
    POST   /sandboxes/{sid}/processes/{pid}/resize     resize its terminal (pty=True only)
    POST   /sandboxes/{sid}/run_code                   a snippet in the sandbox's persistent interpreter

Episode containers (server/episodes.py) have none of these: their routes answer
UnsupportedOperation.
"""

# No `from __future__ import annotations`: FastAPI must see the request models.
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from .. import errors
from .processes import MAX_RETAINED, Processes

if TYPE_CHECKING:
    from .service import SandboxService

NDJSON = "application/x-ndjson"


class StartProcess(BaseModel):
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    user: StrictStr | StrictInt | None = Field(None, description="user name or uid; null: the image's User")
    pty: StrictBool = Field(False, description="run under a terminal (stdout and stderr merged)")
    cols: int = Field(80, ge=1, le=65535)
    rows: int = Field(24, ge=1, le=65535)
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False, description="seconds, then the tree is killed")
    max_retained: int | None = Field(None, ge=0, le=MAX_RETAINED, description=(
        "bytes of the start of each stream kept for the process's life (default 1 MiB); the most recent 1 MiB "
        "is kept besides"))


class StdinWrite(BaseModel):
    data: str = Field("", description="base64 bytes")
    close: StrictBool = Field(False, description="close stdin after writing (a pty gets ^D)")


class KillProcess(BaseModel):
    signal: int = Field(9, ge=1, le=64, description="9: SIGKILL (default), 15: SIGTERM, ...")


class ResizeTerminal(BaseModel):
    cols: int = Field(ge=1, le=65535)
    rows: int = Field(ge=1, le=65535)


class RunCode(BaseModel):
    code: str
    language: str = "python"
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)


def add_process_routes(app: FastAPI, service: "SandboxService") -> Processes:
    """Registers the routes on `app`."""
    procs = Processes(service.execfiles)
    app.state.processes = procs

    @app.post("/sandboxes/{sandbox_id}/processes")
    async def start_process(sandbox_id: str, body: StartProcess) -> dict[str, Any]:
        r = await procs.start(sandbox_id, body.argv, env=body.env, cwd=body.cwd, user=body.user, pty=body.pty,
                              cols=body.cols, rows=body.rows, timeout=body.timeout, max_retained=body.max_retained)
        return {"pid": r["pid"], "started_at": r["started_at"]}

    @app.get("/sandboxes/{sandbox_id}/processes")
    async def list_processes(sandbox_id: str) -> dict[str, Any]:
        return {"processes": await procs.list(sandbox_id)}

    @app.get("/sandboxes/{sandbox_id}/processes/{pid}")
    async def process_status(sandbox_id: str, pid: int) -> dict[str, Any]:
        return await procs.status(sandbox_id, pid)

    @app.get("/sandboxes/{sandbox_id}/processes/{pid}/output", response_class=StreamingResponse,
             responses={200: {"content": {NDJSON: {}}, "description": (
                 "chunked NDJSON: {stream, data (base64), offset, truncated} per chunk as it is written, then "
                 "{exit: {running, exit_code, signal, timed_out, pids_limited, stdout_total, stderr_total}}")}})
    async def process_output(sandbox_id: str, pid: int, stdout: int = 0, stderr: int = 0, follow: bool = True,
                             timeout: float | None = None) -> StreamingResponse:
        """Streams the process's output from byte offsets `stdout`/`stderr` (0: the first
        retained byte) until it ends (follow=true) or what is there now (follow=false), or
        for at most `timeout` seconds (then the exit line says running=true)."""
        if timeout is not None and not timeout >= 0:
            raise errors.InvalidArgument(f"timeout={timeout} must be >= 0 seconds")
        lines = await procs.stream(sandbox_id, pid, stdout, stderr, follow, stopping=lambda: bool(app.state.stopping),
                                   timeout=timeout)
        return StreamingResponse(lines, media_type=NDJSON)

    @app.post("/sandboxes/{sandbox_id}/processes/{pid}/stdin")
    async def process_stdin(sandbox_id: str, pid: int, body: StdinWrite) -> dict[str, Any]:
        r = await procs.write(sandbox_id, pid, body.data, body.close)
        return {"pid": r["pid"], "written": r["written"]}

    @app.post("/sandboxes/{sandbox_id}/processes/{pid}/kill")
    async def process_kill(sandbox_id: str, pid: int, body: KillProcess) -> dict[str, Any]:
        r = await procs.kill(sandbox_id, pid, body.signal)
        return {"pid": r["pid"], "killed": r["killed"]}

    @app.post("/sandboxes/{sandbox_id}/processes/{pid}/resize")
    async def process_resize(sandbox_id: str, pid: int, body: ResizeTerminal) -> dict[str, Any]:
        await procs.resize(sandbox_id, pid, body.cols, body.rows)
        return {"pid": pid}

    @app.post("/sandboxes/{sandbox_id}/run_code")
    async def run_code(sandbox_id: str, body: RunCode) -> dict[str, Any]:
        return await procs.run_code(sandbox_id, body.code, body.language, body.timeout)

    @app.api_route("/sandboxes/{sandbox_id}/containers/{container_id}/processes{rest:path}",
                   methods=["GET", "POST"], include_in_schema=False)
    @app.api_route("/sandboxes/{sandbox_id}/containers/{container_id}/run_code{rest:path}",
                   methods=["GET", "POST"], include_in_schema=False)
    async def container_processes(sandbox_id: str, container_id: str, rest: str) -> None:
        raise errors.UnsupportedOperation(
            f"background processes are not available in episode containers (container {container_id}); use "
            "exec in the container, or sb.process on a sandbox", sandbox_id=sandbox_id)

    return procs
