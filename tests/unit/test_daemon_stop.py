"""A call in flight when the daemon stops gets a typed, retryable error (gh-19, item 8).

An exec running across `rollbox daemon restart` failed with an untyped
`ApiError("Internal Server Error")`: uvicorn cancels what still runs after its grace period and
answers such a request itself, in plain text. The daemon's middleware now answers it with
`daemon_unavailable`, and the client reads any 5xx without rollbox's error form the same way.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from rollbox import errors
from rollbox.client.transport import Client
from rollbox.config import Paths
from rollbox.server.answers import TypedServerErrors


def test_a_request_cancelled_by_shutdown_is_answered_daemon_unavailable_gh19(tmp_path: Path) -> None:
    from rollbox.server import daemon

    app = FastAPI()

    arrived = threading.Event()

    @app.post("/sandboxes/sb-1/exec")
    async def slow() -> dict[str, Any]:
        arrived.set()
        await asyncio.sleep(30)
        return {}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"ok": True}

    app.state.stopping = False
    app.add_middleware(TypedServerErrors, stopping=lambda: bool(app.state.stopping))
    sock = str(tmp_path / "d.sock")
    config = uvicorn.Config(app, uds=sock, log_level="critical", timeout_graceful_shutdown=0.5)
    server = getattr(daemon, "_Server", None)
    srv = server(config, on_exit=lambda: setattr(app.state, "stopping", True)) if server else uvicorn.Server(config)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.02)
    c = Client(f"unix://{sock}", paths=Paths(tmp_path), autostart=False)
    got: list[BaseException] = []

    def call() -> None:
        try:
            c.request("POST", "/sandboxes/sb-1/exec", json={})
        except BaseException as e:  # noqa: BLE001
            got.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    assert arrived.wait(10)  # the request is in flight in the handler when the stop comes
    srv.handle_exit(signal.SIGTERM, None)  # what `rollbox daemon restart` sends
    caller.join(20)
    t.join(20)
    assert len(got) == 1
    assert isinstance(got[0], errors.DaemonUnavailable) and got[0].retryable, repr(got[0])
    assert "stopped" in str(got[0]) and "POST /sandboxes/sb-1/exec" in str(got[0])
    assert app.state.stopping is True


def _send_through(mw: TypedServerErrors) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(mw({"type": "http", "method": "POST", "path": "/sandboxes/sb-1/exec"}, None, send))
    return sent


def test_an_error_while_stopping_is_daemon_unavailable_not_internal() -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("Cannot operate on a closed database.")  # a store closed under it

    sent = _send_through(TypedServerErrors(broken, stopping=lambda: True))
    assert sent[0]["status"] == 503 and b'"code": "daemon_unavailable"' in sent[1]["body"]
    sent = _send_through(TypedServerErrors(broken))  # not stopping: a bug, loudly internal
    assert sent[0]["status"] == 500 and b'"code": "internal"' in sent[1]["body"]


@pytest.mark.parametrize("status, body", [(500, "Internal Server Error"), (502, "<html>bad gateway</html>")])
def test_a_5xx_without_rollbox_error_form_is_daemon_unavailable(tmp_path: Path, status: int, body: str) -> None:
    c = Client(paths=Paths(tmp_path), autostart=False,
               transport=httpx.MockTransport(lambda req: httpx.Response(status, text=body)))
    c.aio._checked = True
    with pytest.raises(errors.DaemonUnavailable, match=f"HTTP {status}") as e:
        c.request("POST", "/sandboxes/sb-1/exec", json={})
    assert e.value.retryable
    # A typed answer stays what it says.
    c = Client(paths=Paths(tmp_path), autostart=False, transport=httpx.MockTransport(lambda req: httpx.Response(
        500, json={"code": "internal", "message": "boom", "sandbox_id": None})))
    c.aio._checked = True
    with pytest.raises(errors.RollboxError, match="boom") as e2:
        c.request("GET", "/sandboxes")
    assert type(e2.value) is errors.RollboxError and not e2.value.retryable
