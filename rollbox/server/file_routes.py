"""Streamed file transfer (gh-18): raw request and response bodies, no base64 in JSON and no
size cap that comes only from buffering.

    PUT /sandboxes/{id}/files/content?path=/abs/path&mode=420   body: the file's bytes
    GET /sandboxes/{id}/files/content?path=/abs/path            answer: the file's bytes

The daemon relays in CHUNK-sized parts to the agent (whose protocol frames stay JSON): an
upload is written to a hidden temporary file beside `path` part by part and renamed over it
by the last part, so the file appears whole or not at all (a client that disconnects midway
leaves nothing; the partial file is removed); a download reads ranges until the end of the
file, the first range read before the answer starts so that a missing file is a typed 404.
The daemon holds at most one part per transfer in memory. Paths that are not valid UTF-8 use
the JSON routes (files/write, files/read), whose body can carry surrogate escapes.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from .. import errors

if TYPE_CHECKING:
    from .service import SandboxService

CHUNK = 4 << 20  # bytes per agent part: one frame of ~5.6 MB of base64


def _check_path(path: str) -> None:
    if not path.startswith("/") or "\0" in path:
        raise errors.InvalidArgument(f"path {path!r} must be absolute, e.g. '/work/a.py'")


def add_file_routes(app: FastAPI, service: "SandboxService") -> None:
    agent = service.execfiles.agent

    @app.put("/sandboxes/{sandbox_id}/files/content", summary="Write a file from the raw request body (streamed)")
    async def put_content(sandbox_id: str, path: str, request: Request, mode: int = 0o644) -> dict[str, Any]:
        _check_path(path)
        token = secrets.token_hex(8)
        part = size = 0
        buf = bytearray()

        async def send(data: bytes, last: bool) -> None:
            nonlocal part, size
            await agent(sandbox_id, "write_file", path=path, upload=token, part=part, last=last, mode=mode,
                        data=base64.b64encode(data).decode())
            part += 1
            size += len(data)

        try:
            async for chunk in request.stream():
                buf += chunk
                while len(buf) >= CHUNK:
                    await send(bytes(buf[:CHUNK]), last=False)
                    del buf[:CHUNK]
            await send(bytes(buf), last=True)
        except BaseException:
            if part:  # a temporary file exists in the sandbox: remove it
                with contextlib.suppress(errors.RollboxError):
                    await agent(sandbox_id, "write_file", path=path, upload=token, abort=True)
            raise
        return {"path": path, "size": size}

    @app.get("/sandboxes/{sandbox_id}/files/content", summary="Read a file as the raw answer body (streamed)",
             response_class=StreamingResponse)
    async def get_content(sandbox_id: str, path: str) -> StreamingResponse:
        _check_path(path)
        first = await agent(sandbox_id, "read_file", path=path, offset=0, length=CHUNK)

        async def body() -> AsyncIterator[bytes]:
            data = base64.b64decode(first["data"])
            offset = len(data)
            yield data
            while data and offset < int(first.get("size") or 0):
                try:
                    r = await agent(sandbox_id, "read_file", path=path, offset=offset, length=CHUNK)
                except errors.RollboxError:
                    # Removed or unreadable midway: the answer is already under way, so it ends
                    # short of x-rollbox-size and the client raises (see sdk fs.read_file).
                    return
                data = base64.b64decode(r["data"])
                offset += len(data)
                if data:
                    yield data

        # No Content-Length: the file may grow or shrink while it is read; its size when the
        # read began is in x-rollbox-size.
        return StreamingResponse(body(), media_type="application/octet-stream",
                                 headers={"x-rollbox-size": str(int(first.get("size") or 0))})
