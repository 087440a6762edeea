"""The SDK's connections to the daemon under many threads (gh-19, item 5).

2,000 execs at concurrency 64 once failed with `DaemonUnavailable ... [Errno 9] Bad file
descriptor`: httpcore's sync pool lets any thread close an idle-looking connection of the pool,
and decides so without the connection's lock (2 in 30,000 requests at 128 threads against a
local uvicorn). The SDK's requests now all run on one event loop (rollbox.client.portal), whose
async pool no other thread touches; these tests drive it from many threads at once.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from rollbox.client.transport import Client
from rollbox.config import Paths


class _Stub:
    def __init__(self, sock: str) -> None:
        app = FastAPI()

        @app.post("/x")
        async def x() -> dict[str, Any]:
            await asyncio.sleep(random.random() * 0.002)
            return {"ok": 1}

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"ok": True}

        self.server = uvicorn.Server(uvicorn.Config(app, uds=sock, log_level="warning", timeout_keep_alive=300))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the stub daemon did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "daemon.sock")
    stub = _Stub(path)
    yield path
    stub.stop()


def test_many_threads_share_the_connections_without_a_failure_gh19(sock: str, tmp_path: Path) -> None:
    c = Client(f"unix://{sock}", paths=Paths(tmp_path), autostart=False)
    failures: list[str] = []

    def call(_i: int) -> None:
        try:
            assert c.request("POST", "/x", json={}) == {"ok": 1}
        except Exception as e:  # noqa: BLE001
            failures.append(repr(e))

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(call, range(3000)))
    c.close()
    assert failures == []


def test_a_daemon_that_restarted_and_dropped_idle_connections_is_reached_again(tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    stub = _Stub(path)
    c = Client(f"unix://{path}", paths=Paths(tmp_path), autostart=False)
    with ThreadPoolExecutor(16) as pool:  # leaves 16 idle connections in the pool
        assert all(pool.map(lambda _i: c.request("POST", "/x", json={}), range(64)))
    stub.stop()  # closes them all
    stub = _Stub(path)
    try:
        with ThreadPoolExecutor(16) as pool:
            assert all(r == {"ok": 1} for r in pool.map(lambda _i: c.request("POST", "/x", json={}), range(64)))
    finally:
        c.close()
        stub.stop()


def test_a_daemon_gone_or_dropping_the_connection_is_daemon_unavailable(tmp_path: Path) -> None:
    """httpcore's errors come out as httpx's, which the client turns into DaemonUnavailable."""
    import socket

    from rollbox import errors

    c = Client(f"unix://{tmp_path / 'none.sock'}", paths=Paths(tmp_path), autostart=False)
    with pytest.raises(errors.DaemonUnavailable, match="no rollbox daemon answers"):
        c.request("POST", "/x", json={})
    path = str(tmp_path / "drop.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    srv.settimeout(0.2)
    stop = threading.Event()

    def drop() -> None:  # answers the health probe, then reads the request and hangs up
        while not stop.is_set():
            try:
                conn, _addr = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(10)
                if b"/health" in conn.recv(65536):
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                    conn.recv(65536)

    t = threading.Thread(target=drop, daemon=True)
    t.start()
    c = Client(f"unix://{path}", paths=Paths(tmp_path), autostart=False)
    try:
        with pytest.raises(errors.DaemonUnavailable, match="lost the rollbox daemon .* during POST /x"):
            c.request("POST", "/x", json={})
    finally:
        stop.set()
        t.join(10)
        srv.close()
        c.close()


def _answers_stub(sock: str) -> _Stub:
    """A stub whose routes answer what the client must decode: echoes, typed errors, non-JSON."""
    stub = _Stub.__new__(_Stub)
    app = FastAPI()

    @app.api_route("/echo/{name}", methods=["GET", "POST", "DELETE", "PUT"])
    async def echo(name: str, request: Request) -> dict[str, Any]:
        return {"name": name, "method": request.method, "query": str(request.url.query),
                "body": (await request.body()).decode(), "ctype": request.headers.get("content-type"),
                "auth": request.headers.get("authorization")}

    @app.get("/typed")
    async def typed() -> JSONResponse:
        return JSONResponse({"code": "sandbox_not_found", "message": "no sandbox sb-x", "sandbox_id": "sb-x"}, 404)

    @app.get("/bare500")
    async def bare500() -> PlainTextResponse:
        return PlainTextResponse("Internal Server Error", 500)

    @app.get("/text")
    async def text() -> PlainTextResponse:
        return PlainTextResponse("not json")

    @app.post("/strict")
    async def strict(n: int) -> dict[str, int]:
        return {"n": n}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"ok": True}

    stub.server = uvicorn.Server(uvicorn.Config(app, uds=sock, log_level="warning"))
    stub.thread = threading.Thread(target=stub.server.run, daemon=True)
    stub.thread.start()
    deadline = time.monotonic() + 20
    while not stub.server.started:
        assert time.monotonic() < deadline, "the stub daemon did not start"
        time.sleep(0.02)
    return stub


@pytest.mark.parametrize("path_kind", ["httpcore", "httpx"])
def test_json_requests_decode_the_same_on_the_direct_and_the_httpx_path(tmp_path: Path, path_kind: str) -> None:
    """JSON requests to the local socket skip httpx's models (`AsyncClient._send_json`); both
    paths must send the same request and raise the same typed errors."""
    from rollbox import errors

    sock = str(tmp_path / "d.sock")
    stub = _answers_stub(sock)
    c = Client(f"unix://{sock}", paths=Paths(tmp_path), autostart=False, token="tok")
    if path_kind == "httpx":
        c.aio._pool = None
    try:
        r = c.request("POST", "/echo/a b", json={"x": "é"}, params={"status": "ok", "all": True, "n": None,
                                                                      "ids": ["1", "2"]})
        assert r == {"name": "a b", "method": "POST", "query": "status=ok&all=true&n=&ids=1&ids=2",
                     "body": '{"x": "\\u00e9"}', "ctype": "application/json", "auth": "Bearer tok"}
        assert c.request("DELETE", "/echo/z")["body"] == ""
        with pytest.raises(errors.SandboxNotFound, match="no sandbox sb-x") as e:
            c.request("GET", "/typed")
        assert e.value.sandbox_id == "sb-x"
        with pytest.raises(errors.DaemonUnavailable, match="failed GET /bare500 without an answer"):
            c.request("GET", "/bare500")
        with pytest.raises(errors.ApiError, match="not JSON"):
            c.request("GET", "/text")
        with pytest.raises(errors.InvalidArgument, match="invalid request to /strict: n: "):
            c.request("POST", "/strict", params={"n": "x"})
        with pytest.raises(errors.InvalidArgument, match="not valid UTF-8"):
            c.request("GET", "/echo/\udcff")
        with pytest.raises(errors.InvalidArgument):
            c.request("GET", "/echo/x", params={"path": "\udcff"})
    finally:
        c.close()
        stub.stop()
