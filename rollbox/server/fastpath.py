"""`POST /sandboxes/{id}/exec` served without FastAPI's per-request machinery (gh-15).

An exec is the call an RL reward server makes most (`exec("true")` is ~25 ms end to end
here). Profiled with py-spy at 1 kHz over 600 execs, the daemon's CPU for one went about
one part to the exec itself and three parts to FastAPI and Starlette around it: the routing
of ~100 routes in order, dependency solving, the body's validation into the model, the
answer's serialisation and validation, and the exception and exit-stack middleware.

This ASGI layer answers that one route itself, with the same model (`ExecRequest`, pydantic
validating the JSON body directly), the same service call and the same answers: the
result's wire form (200) or a RollboxError's typed body and status. A body the model refuses
goes on to FastAPI's route, which answers it as it always did; so does everything else, and
the route's OpenAPI entry stays FastAPI's. It sits inside `TypedServerErrors`, so an
unexpected exception still becomes a typed 500.
"""

from __future__ import annotations

import email.message
import re
from typing import TYPE_CHECKING, Any

from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, ValidationError

from .. import errors
from .answers import render

if TYPE_CHECKING:
    from .service import SandboxService

_EXEC = re.compile(r"/sandboxes/([^/]+)/exec")


def _answer_body(content: Any) -> bytes:
    """As the route renders its answer: the JSON form FastAPI's encoder would make of it
    (bytes as text, say) when it is not plain JSON already; app.JSONResponse's rendering."""
    try:
        return render(content)
    except TypeError:
        return render(jsonable_encoder(content))


def _is_json(scope: dict[str, Any]) -> bool:
    """The request says its body is JSON, decided as FastAPI decides before parsing one
    (its first Content-Type read by `email.message`, which calls a malformed type text/plain)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            message = email.message.Message()
            message["content-type"] = bytes(value).decode("latin-1")
            subtype = message.get_content_subtype()
            return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))
    return False


class ExecFastPath:
    """ASGI middleware answering `POST /sandboxes/{id}/exec` (see the module's docstring);
    every other request, and an exec whose body the model refuses, goes on to `app`."""

    def __init__(self, app: Any, service: "SandboxService", model: type[BaseModel]) -> None:
        self.app = app
        self.service = service
        self.model = model

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            m = _EXEC.fullmatch(scope["path"])
            if m is not None:
                await self._exec(m.group(1), scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _exec(self, sandbox_id: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went: nobody to answer (FastAPI's route would not run either)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        body: Any = None
        if _is_json(scope):
            try:
                body = self.model.model_validate_json(raw)
            except ValidationError:
                pass
        if body is None:
            # A body the model refuses is rare: FastAPI's own route answers it, in its own
            # shapes (422 details, 400 for a body it cannot read), from the bytes read here.
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": raw, "more_body": False}
                message: dict[str, Any] = await receive()
                return message

            await self.app(scope, replay, send)
            return
        status = 200
        try:
            content: Any = await self.service.exec(sandbox_id, body.argv, env=body.env, cwd=body.cwd,
                                                   stdin=body.stdin, timeout=body.timeout,
                                                   max_output=body.max_output, user=body.user)
        except errors.RollboxError as e:
            status, content = e.status, e.to_wire()
        data = _answer_body(content)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
