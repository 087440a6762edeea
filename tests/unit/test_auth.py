"""BearerAuth as a plain ASGI middleware (no server): TCP needs the token, the unix socket not."""

from __future__ import annotations

import asyncio
from typing import Any

from rollbox.server.auth import BearerAuth


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "app-reached"})


def _run(scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    asyncio.run(BearerAuth(_app, "s3cret")(scope, receive, send))
    return sent


TCP = ("127.0.0.1", 7420)


def test_http_over_tcp_needs_the_token() -> None:
    sent = _run({"type": "http", "server": TCP, "headers": []})
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 401
    sent = _run({"type": "http", "server": TCP, "headers": [(b"authorization", b"Bearer s3cret")]})
    assert sent == [{"type": "app-reached"}]


def test_unix_socket_requests_pass_without_a_token() -> None:
    assert _run({"type": "http", "server": ("/var/lib/rollbox/rollbox.sock", None), "headers": []}) == \
        [{"type": "app-reached"}]


def test_a_websocket_without_the_token_is_closed_not_sent_http_messages() -> None:
    sent = _run({"type": "websocket", "server": TCP, "headers": [(b"authorization", b"Bearer wrong")]})
    assert [m["type"] for m in sent] == ["websocket.close"] and sent[0]["code"] == 1008


def test_an_unexpected_error_is_a_typed_500_on_the_same_connection() -> None:
    from rollbox.server.answers import TypedServerErrors

    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(TypedServerErrors(broken)({"type": "http", "method": "GET", "path": "/x"}, None, send))
    assert sent[0]["status"] == 500
    assert b'"code": "internal"' in sent[1]["body"] and b"RuntimeError: boom" in sent[1]["body"]
