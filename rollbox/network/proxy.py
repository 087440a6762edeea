"""Exposed ports: a TCP listener on the host per (sandbox, port), relaying to the sandbox.

The host port comes from the kernel (bind to port 0), so concurrent creates never collide and a
port is free again the moment its listener closes. Listeners run on the daemon's event loop.
Their connections to the sandbox carry the daemon's packet mark: the host's firewall lets no
other process open a connection to a sandbox (firewall.py).

When the sandbox refuses the connection (nothing listens on the port) the client gets an HTTP
502 saying so, not a connection closed without a word; when a server there listens on
127.0.0.1 only (reachable from inside the sandbox alone), the answer says that and how to
fix it. A sandbox that does not accept in time gets a 504.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from dataclasses import dataclass, field
from typing import Awaitable, Callable

log = logging.getLogger("rollbox.proxy")
CONNECT_TIMEOUT_S = 10.0
CHUNK = 1 << 16
# Seconds an error answer waits for the client to close before the proxy closes.
LINGER_S = 2.0
# Reads a file in a running sandbox: (sandbox_id, path) -> its bytes.
ReadFile = Callable[[str, str], Awaitable[bytes]]


def listening(table: bytes, port: int) -> list[str]:
    """The local addresses that listen on TCP `port` in a /proc/net/tcp or tcp6 table."""
    out = []
    for line in table.decode(errors="replace").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != "0A" or ":" not in fields[1]:  # 0A: LISTEN
            continue
        addr, _, hexport = fields[1].partition(":")
        try:
            if int(hexport, 16) != port:
                continue
            # Each 32-bit word of the address is in host (little-endian) order.
            raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
            out.append(str(ipaddress.ip_address(raw)))
        except ValueError:
            continue
    return out


def http_answer(status: int, reason: str, text: str) -> bytes:
    """A complete plain-text HTTP/1.1 response that closes the connection."""
    body = text.encode() + b"\n"
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


async def refused_text(sandbox_id: str, port: int, read_file: ReadFile | None) -> str:
    """Why the sandbox refused a connection to `port`: nothing listens there, or a server
    listens on loopback only (read from the sandbox's /proc/net/tcp{,6} when it can be)."""
    addrs: list[str] = []
    if read_file is not None:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                addrs += listening(await read_file(sandbox_id, table), port)
            except Exception:  # noqa: BLE001 - no diagnosis is still an answer
                pass
    if addrs and all(ipaddress.ip_address(a).is_loopback for a in addrs):
        where = " and ".join(f"{a}:{port}" if "." in a else f"[{a}]:{port}" for a in sorted(set(addrs)))
        return (f"rollbox: port {port} of sandbox {sandbox_id}: a server listens on {where} only, which is "
                "reachable from inside the sandbox alone, not through its URL. Bind it to 0.0.0.0 (all "
                f"interfaces) instead, e.g. `python3 -m http.server --bind 0.0.0.0 {port}`.")
    return (f"rollbox: nothing is listening on port {port} of sandbox {sandbox_id}. Start a server there "
            f"on 0.0.0.0:{port} (one that has just been started may need a moment before it listens: retry).")


async def connect_marked(host: str, port: int, mark: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection whose packets carry `mark` (SO_MARK; 0: none). Raises OSError."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if mark:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


@dataclass
class _Exposed:
    server: asyncio.base_events.Server
    host_port: int
    target: tuple[str, int]
    conns: set[asyncio.Task[None]] = field(default_factory=set)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(CHUNK):
        pass


class PortForwarder:
    """Listeners for every exposed port of every sandbox of one daemon.

    bind_host: the host address listeners bind (127.0.0.1: reachable from this host only);
    url_host: the host name put in URLs (defaults to bind_host); mark: the packet mark of
    connections to sandboxes (0: none); read_file: reads a file in a sandbox, for saying why
    a connection was refused (None: the answer does not look).
    """

    def __init__(self, bind_host: str = "127.0.0.1", url_host: str | None = None, *, mark: int = 0,
                 read_file: ReadFile | None = None) -> None:
        self.bind_host = bind_host
        self.url_host = url_host or bind_host
        self.mark = mark
        self.read_file = read_file
        self._by_sandbox: dict[str, dict[int, _Exposed]] = {}

    def url(self, host_port: int) -> str:
        return f"http://{self.url_host}:{host_port}"

    async def expose(self, sandbox_id: str, port: int, target_ip: str, host_port: int = 0) -> str:
        """Listens for `port` of the sandbox (idempotent: the same port gives the same URL).
        host_port: a port to take again (after a daemon restart), 0 for any free one."""
        ports = self._by_sandbox.setdefault(sandbox_id, {})
        if port in ports:
            return self.url(ports[port].host_port)
        holder: list[_Exposed] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            ex = holder[0]
            task = asyncio.current_task()
            assert task is not None
            ex.conns.add(task)
            try:
                up_r, up_w = await asyncio.wait_for(connect_marked(*ex.target, self.mark), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as e:
                try:
                    writer.write(await self._failure(e, sandbox_id, port))
                    await writer.drain()
                    writer.write_eof()
                    # Read what the client sent until it closes: closing with its request
                    # unread would reset the connection, and the client might lose the answer.
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(_discard(reader), LINGER_S)
                except (ConnectionError, OSError):
                    pass
                finally:
                    writer.close()
                    ex.conns.discard(task)
                return
            try:
                await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
            finally:
                for w in (writer, up_w):
                    w.close()
                ex.conns.discard(task)

        async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # A connection cancelled by the port closing (its sandbox ended) ends here: left to
            # asyncio's stream callback, the CancelledError was logged as an unhandled exception.
            try:
                await handle(reader, writer)
            except asyncio.CancelledError:
                writer.close()

        try:
            server = await asyncio.start_server(serve_one, self.bind_host, host_port, reuse_address=True)
        except OSError:
            if not host_port:
                raise
            server = await asyncio.start_server(serve_one, self.bind_host, 0, reuse_address=True)
        ex = _Exposed(server, server.sockets[0].getsockname()[1], (target_ip, port))
        holder.append(ex)
        ports[port] = ex
        return self.url(ex.host_port)

    async def _failure(self, e: BaseException, sandbox_id: str, port: int) -> bytes:
        """The HTTP answer for a connection to the sandbox that could not be made."""
        if isinstance(e, ConnectionRefusedError):
            return http_answer(502, "Bad Gateway", await refused_text(sandbox_id, port, self.read_file))
        if isinstance(e, asyncio.TimeoutError):
            return http_answer(504, "Gateway Timeout", f"rollbox: port {port} of sandbox {sandbox_id} did not "
                               f"accept the connection within {CONNECT_TIMEOUT_S:g} s")
        return http_answer(502, "Bad Gateway", f"rollbox: could not connect to port {port} of sandbox {sandbox_id}: {e}")

    def urls(self, sandbox_id: str) -> dict[int, str]:
        return {p: self.url(e.host_port) for p, e in self._by_sandbox.get(sandbox_id, {}).items()}

    def host_ports(self, sandbox_id: str) -> dict[int, int]:
        return {p: e.host_port for p, e in self._by_sandbox.get(sandbox_id, {}).items()}

    async def close(self, sandbox_id: str) -> None:
        """Stops the sandbox's listeners and cuts their connections; frees the host ports."""
        for ex in self._by_sandbox.pop(sandbox_id, {}).values():
            ex.server.close()
            for t in list(ex.conns):
                t.cancel()
            with contextlib.suppress(Exception):
                await ex.server.wait_closed()

    async def close_all(self) -> None:
        for sid in list(self._by_sandbox):
            await self.close(sid)

    def count(self) -> int:
        return sum(len(p) for p in self._by_sandbox.values())
