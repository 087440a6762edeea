"""Who may talk to the daemon.

The unix socket is the local door: mode 0600 in a 0700 state directory (root only), or 0660
for a configured group (`ROLLBOX_SOCKET_GROUP`). The TCP listener (`rollbox serve --listen`)
is the remote door and requires `Authorization: Bearer <token>` on every request (RFC 6750),
compared in constant time; the token is `ROLLBOX_TOKEN` or the file `ROLLBOX_HOME/token`,
made (0600, 256 random bits) on first use.
"""

from __future__ import annotations

import grp
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..config import Paths

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def load_or_create_token(paths: Paths) -> str:
    """The TCP listener's bearer token: ROLLBOX_TOKEN, else ROLLBOX_HOME/token (created)."""
    env = os.environ.get("ROLLBOX_TOKEN", "").strip()
    if env:
        return env
    f = paths.home / "token"
    try:
        tok = f.read_text().strip()
        if tok:
            return tok
    except FileNotFoundError:
        pass
    tok = secrets.token_urlsafe(32)
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(tok + "\n")
    return tok


def secure_socket(path: Path, home: Path) -> None:
    """Root only (0600), or root and `ROLLBOX_SOCKET_GROUP` (0660, state directory 0710)."""
    group = os.environ.get("ROLLBOX_SOCKET_GROUP", "").strip()
    if not group:
        os.chmod(path, 0o600)
        return
    gid = grp.getgrnam(group).gr_gid  # KeyError: a group that does not exist
    os.chown(path, -1, gid)
    os.chmod(path, 0o660)
    os.chown(home, -1, gid)
    os.chmod(home, 0o710)


class BearerAuth:
    """ASGI middleware: requests that came over TCP need the bearer token; unix-socket ones
    (uvicorn gives them a server address of (path, None)) are already limited by the
    socket's mode. Anything that is not clearly a unix socket needs the token."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str) -> None:
        self.app = app
        self._want = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        over_unix = isinstance(server, (tuple, list)) and len(server) == 2 and server[1] is None
        if scope["type"] in ("http", "websocket") and not over_unix:
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self._want):
                if scope["type"] == "websocket":
                    # A WebSocket handshake is refused with a close (the server answers 403);
                    # http.response.* messages are not valid on a websocket scope.
                    await send({"type": "websocket.close", "code": 1008, "reason": "rollbox: bearer token needed"})
                    return
                body = json.dumps({"code": "unauthorized", "sandbox_id": None,
                                   "message": "this rollbox daemon's TCP listener needs `Authorization: Bearer "
                                              "<token>`: set ROLLBOX_TOKEN to the token in ROLLBOX_HOME/token "
                                              "on the daemon's host"}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"www-authenticate", b'Bearer realm="rollbox"')]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
