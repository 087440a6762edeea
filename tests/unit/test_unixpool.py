"""The SDK's pool of connections to the daemon's unix socket (rollbox/client/unixpool.py),
against a real uvicorn: its bound, its order, and cancellation (gh-19, item 5)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore
import pytest
import uvicorn
from fastapi import FastAPI

from rollbox.client.netbackend import AsyncioBackend
from rollbox.client.unixpool import UnixPool


class _Server:
    def __init__(self, sock: str) -> None:
        self.order: list[int] = []
        self.now = 0
        self.most = 0
        app = FastAPI()

        @app.post("/x/{i}")
        async def x(i: int, hold: float = 0.0) -> dict[str, Any]:
            self.order.append(i)
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                await asyncio.sleep(hold)
            finally:
                self.now -= 1
            return {"i": i}

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"ok": True}

        self.server = uvicorn.Server(uvicorn.Config(app, uds=sock, log_level="warning", timeout_keep_alive=300))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the stub server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[_Server, str]]:
    sock = str(tmp_path / "d.sock")
    s = _Server(sock)
    yield s, sock
    s.stop()


def _pool(sock: str, n: int) -> UnixPool:
    return UnixPool(sock, max_connections=n, max_idle=n, keepalive_expiry=60.0, network_backend=AsyncioBackend())


async def _post(pool: UnixPool, i: int, hold: float = 0.0) -> int:
    url = httpcore.URL(scheme=b"http", host=b"rollbox", port=None, target=f"/x/{i}?hold={hold}".encode())
    r = await pool.request(b"POST", url, headers=[], content=b"{}", extensions={})
    assert r.status == 200, r.content
    return int(r.content.split(b":")[1].rstrip(b"}"))


def test_requests_beyond_the_bound_wait_and_are_served_in_arrival_order(server: tuple[_Server, str]) -> None:
    srv, sock = server

    async def main() -> list[int]:
        pool = _pool(sock, 2)
        tasks = []
        for i in range(24):
            tasks.append(asyncio.create_task(_post(pool, i, 0.02)))
            await asyncio.sleep(0)  # each reaches the pool before the next starts
        out = await asyncio.gather(*tasks)
        assert pool.connections <= 2
        await pool.aclose()
        return out

    assert asyncio.run(main()) == list(range(24))
    assert srv.most <= 2
    # Two connections take turns: the first two start together, the rest in arrival order.
    assert sorted(srv.order[:2]) == [0, 1] and srv.order[2:] == list(range(2, 24))


def test_a_request_cancelled_while_waiting_gives_its_turn_on(server: tuple[_Server, str]) -> None:
    _srv, sock = server

    async def main() -> None:
        pool = _pool(sock, 1)
        slow = asyncio.create_task(_post(pool, 1, 0.3))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(_post(pool, 2))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await slow == 1
        # The slot the cancelled request waited for is not lost: more requests go through,
        # still on at most one connection.
        assert await asyncio.wait_for(asyncio.gather(*(_post(pool, i) for i in range(3, 8))), 10) == [3, 4, 5, 6, 7]
        assert pool.connections == 1
        await pool.aclose()
        assert pool.connections == 0

    asyncio.run(main())


def test_connections_the_server_closed_are_replaced(tmp_path: Path) -> None:
    sock = str(tmp_path / "d.sock")

    async def round_(pool: UnixPool) -> list[int]:
        return list(await asyncio.gather(*(_post(pool, i, 0.01) for i in range(8))))

    async def main() -> None:
        pool = _pool(sock, 8)
        srv = _Server(sock)
        assert await round_(pool) == list(range(8))
        await asyncio.to_thread(srv.stop)  # closes every idle connection of the pool
        srv = _Server(sock)
        try:
            assert await round_(pool) == list(range(8))
            assert pool.connections <= 8
        finally:
            await pool.aclose()
            await asyncio.to_thread(srv.stop)

    asyncio.run(main())


def test_a_request_costs_the_same_however_many_are_in_flight(server: tuple[_Server, str], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK client's JSON path: httpcore's own pool looked at every connection once per idle
    connection on every request start and end (~n^2 connection checks per request with n in
    flight; 256 in flight held a process to ~10 requests/s, gh-19)."""
    from rollbox.client.aclient import AsyncClient
    from rollbox.config import Paths

    _srv, sock = server
    calls = {"n": 0}
    real = httpcore.AsyncHTTPConnection.is_idle

    def counted(self: httpcore.AsyncHTTPConnection) -> bool:
        calls["n"] += 1
        return real(self)
    monkeypatch.setattr(httpcore.AsyncHTTPConnection, "is_idle", counted)

    async def main(n: int) -> int:
        c = AsyncClient(f"unix://{sock}", paths=Paths(tmp_path), autostart=False)
        try:
            await c.request("POST", "/x/0", json={})  # the health probe and one connection
            calls["n"] = 0
            await asyncio.gather(*(c.request("POST", f"/x/{i}", json={}, params={"hold": 0.3}) for i in range(n)))
            return calls["n"]
        finally:
            await c.aclose()

    per_request = asyncio.run(main(256)) / 256
    assert per_request <= 4, f"{per_request:.0f} connection checks per request with 256 in flight"
