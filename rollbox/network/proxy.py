"""Exposed ports: a TCP listener on the host per (sandbox, port), relaying to the sandbox.

The host port comes from the kernel (bind to port 0), so concurrent creates never collide and a
port is free again the moment its listener closes. Listeners run on the daemon's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

log = logging.getLogger("rollbox.proxy")
CONNECT_TIMEOUT_S = 10.0
CHUNK = 1 << 16


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


class PortForwarder:
    """Listeners for every exposed port of every sandbox of one daemon.

    bind_host: the host address listeners bind (127.0.0.1: reachable from this host only);
    url_host: the host name put in URLs (defaults to bind_host).
    """

    def __init__(self, bind_host: str = "127.0.0.1", url_host: str | None = None) -> None:
        self.bind_host = bind_host
        self.url_host = url_host or bind_host
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
                up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*ex.target), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError):
                writer.close()
                ex.conns.discard(task)
                return
            try:
                await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
            finally:
                for w in (writer, up_w):
                    w.close()
                ex.conns.discard(task)

        try:
            server = await asyncio.start_server(handle, self.bind_host, host_port, reuse_address=True)
        except OSError:
            if not host_port:
                raise
            server = await asyncio.start_server(handle, self.bind_host, 0, reuse_address=True)
        ex = _Exposed(server, server.sockets[0].getsockname()[1], (target_ip, port))
        holder.append(ex)
        ports[port] = ex
        return self.url(ex.host_port)

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
