"""`POST /sandboxes/{id}/exec` answered by `ExecFastPath` (gh-15: a third of the daemon's CPU
per exec) gives what the FastAPI route it stands in front of gives: the same statuses and
bodies for a result, a typed error, and each kind of body the model refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from rollbox import errors
from rollbox.server.answers import JSONResponse, add_error_handlers
from rollbox.server.app import ExecRequest
from rollbox.server.fastpath import ExecFastPath


class StubService:
    """The service's exec boundary: records the call, answers or raises as told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], dict[str, Any]]] = []

    async def exec(self, sandbox_id: str, argv: list[str], **kw: Any) -> dict[str, Any]:
        self.calls.append((sandbox_id, argv, kw))
        if sandbox_id == "sb-gone":
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
        if argv == ["nan"]:  # answers that are not plain JSON: the route's encoder makes them so
            return {"exit_code": 0, "duration_s": float("nan"), "stdout": b"abc"}
        return {"exit_code": 0, "stdout": "aGk=", "stderr": "", "argv": argv, "name": "caf\u00e9"}


def _apps(service: StubService) -> tuple[FastAPI, FastAPI]:
    """The FastAPI route as app.py declares it, without and with the fast path in front."""
    def make(fast: bool) -> FastAPI:
        app = FastAPI(default_response_class=JSONResponse)
        add_error_handlers(app)

        @app.post("/sandboxes/{sandbox_id}/exec")
        async def exec_(sandbox_id: str, body: ExecRequest) -> dict[str, Any]:
            return await service.exec(sandbox_id, body.argv, env=body.env, cwd=body.cwd, stdin=body.stdin,
                                      timeout=body.timeout, max_output=body.max_output, user=body.user)

        if fast:
            app.add_middleware(ExecFastPath, service=service, model=ExecRequest)  # type: ignore[arg-type]
        return app
    return make(False), make(True)


BODIES: list[Any] = [
    {"argv": ["echo", "hi"], "env": {"A": "1"}, "cwd": "/tmp", "timeout": 5, "max_output": 10, "user": 1000},
    {"argv": ["true"], "user": "nobody", "stdin": "aGk="},
    {"argv": ["nan"]},
    {},  # argv missing
    {"argv": "true"},  # not a list
    {"argv": ["true"], "timeout": -1},
    {"argv": ["true"], "timeout": "NaN"},
    {"argv": ["true"], "max_output": 1 << 40},
    {"argv": ["true"], "user": 1.5},
    {"argv": ["true"], "env": {"A": 1}},
    [1, 2],
]


JSON = {"content-type": "application/json"}
RAW: list[tuple[bytes, dict[str, str]]] = [
    (b"{oops\xff", JSON),  # not UTF-8: FastAPI's 400
    (b"[1,", JSON),  # not JSON
    (b"", JSON),
    (b"null", JSON),
    (b'{"argv": ["true"], "timeout": NaN}', JSON),
    (b'{"argv": ["true"]}', {"content-type": "text/plain"}),
    (b'{"argv": ["true"]}', {}),
    (b'{"argv": ["true"]}', {"content-type": "application/merge-patch+json; charset=utf-8"}),
    # Break-it trial: a type email.message calls text/plain ran the exec where FastAPI gave a 422.
    (b'{"argv": ["true"]}', {"content-type": "application/x/y+json"}),
    (b'{"argv": ["true"]}', {"content-type": "application//+json"}),
]


def _both(service: StubService, path: str, **kw: Any) -> list[tuple[int, Any]]:
    slow, fast = _apps(service)

    async def go() -> list[tuple[int, Any]]:
        out = []
        for app in (slow, fast):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d") as c:
                r = await c.post(path, **kw)
                out.append((r.status_code, r.json()))
        return out

    return asyncio.run(go())


@pytest.mark.parametrize("sandbox_id,body", [("sb-1", b) for b in BODIES] + [("sb-gone", {"argv": ["true"]})])
def test_the_fast_path_answers_as_the_route_does(sandbox_id: str, body: Any) -> None:
    service = StubService()
    (s_status, s_body), (f_status, f_body) = _both(service, f"/sandboxes/{sandbox_id}/exec", json=body)
    assert (f_status, f_body) == (s_status, s_body)
    if s_status in (200, 404):
        assert len(service.calls) == 2 and service.calls[0] == service.calls[1]  # the same call, with the same arguments


@pytest.mark.parametrize("content,headers", RAW)
def test_bodies_that_are_not_json_get_fastapis_own_answers(content: bytes, headers: dict[str, str]) -> None:
    service = StubService()
    slow, fast = _both(service, "/sandboxes/sb-1/exec", content=content, headers=headers)
    assert fast == slow and slow[0] in (200, 400, 422), slow


def test_other_routes_and_methods_go_on_to_the_app() -> None:
    service = StubService()
    _, fast = _apps(service)

    async def go() -> tuple[int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fast), base_url="http://d") as c:
            return ((await c.get("/sandboxes/sb-1/exec")).status_code,
                    (await c.post("/sandboxes/sb-1/exec/x", json={"argv": ["true"]})).status_code)

    assert asyncio.run(go()) == (405, 404) and service.calls == []
