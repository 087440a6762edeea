"""httpcore's network backend on asyncio's own streams (no anyio layer per read and write).

httpcore runs on asyncio through anyio, whose stream wrappers, cancel scopes and sniffio
lookups cost more CPU per request than the request itself on the daemon's unix socket (measured
with a local uvicorn stub: see the closing note of gh-18's change). The SDK's loop only ever
runs asyncio, so this backend uses asyncio's streams directly.
Follows httpcore's `AsyncNetworkBackend` / `AsyncNetworkStream` interface (httpcore/_backends/base.py).
"""

from __future__ import annotations

import asyncio
import typing
from typing import Any

import httpcore


class _Stream(httpcore.AsyncNetworkStream):
    """A connection as asyncio's (reader, writer) pair: its socket stays registered with the
    loop, so a read is no add/remove of the descriptor (what `loop.sock_recv` does each time)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            if timeout is None:
                return await self._reader.read(max_bytes)
            return await asyncio.wait_for(self._reader.read(max_bytes), timeout)
        except TimeoutError as e:
            raise httpcore.ReadTimeout(str(e)) from e
        except OSError as e:
            raise httpcore.ReadError(str(e)) from e

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            if timeout is None:
                await self._writer.drain()
            else:
                await asyncio.wait_for(self._writer.drain(), timeout)
        except TimeoutError as e:
            raise httpcore.WriteTimeout(str(e)) from e
        except OSError as e:
            raise httpcore.WriteError(str(e)) from e

    async def aclose(self) -> None:
        self._writer.close()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.UnsupportedProtocol("TLS is not used to reach a rollbox daemon")

    def get_extra_info(self, info: str) -> Any:
        sock = self._writer.get_extra_info("socket")
        if info == "is_readable":  # an idle connection the daemon closed: not reused
            # No poll(2) of the socket: it stays registered with the loop, which has read the
            # daemon's EOF by the time a request looks here. httpcore asks this of every idle
            # connection twice per request (its pool's bookkeeping): with dozens open, the polls
            # were the biggest share of the SDK's CPU per request (sampled in `SandboxPool.map`).
            return self._reader.at_eof() or len(self._reader._buffer) > 0  # type: ignore[attr-defined]
        if info == "socket":
            return sock
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Unix-socket and TCP connections for httpcore's async pool, on the running asyncio loop."""

    async def _open(self, opening: Any, timeout: float | None) -> _Stream:
        try:
            reader, writer = await (opening if timeout is None else asyncio.wait_for(opening, timeout))
        except TimeoutError as e:
            raise httpcore.ConnectTimeout(str(e)) from e
        except OSError as e:
            raise httpcore.ConnectError(str(e)) from e
        return _Stream(reader, writer)

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: typing.Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        stream = await self._open(asyncio.open_connection(host, port, limit=LIMIT), timeout)
        sock = stream.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return stream

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: typing.Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        return await self._open(asyncio.open_unix_connection(path, limit=LIMIT), timeout)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


LIMIT = 1 << 20  # bytes a connection's reader buffers before it stops reading (asyncio's flow control)
