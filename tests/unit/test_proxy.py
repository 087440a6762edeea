"""The exposed-port proxy (rollbox.network.proxy) without a sandbox: a local target stands in
for it (gh-19, items 6 and 11).

A GET on an exposed port with nothing listening got only `RemoteDisconnected` (the proxy
closed the connection without a word); it gets an HTTP 502 naming the port and saying that
nothing listens, or that a server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from rollbox.network import proxy
from rollbox.network.proxy import PortForwarder, listening

SID = "sb-" + "a" * 24
# /proc/net/tcp and tcp6 as gVisor writes them: 127.0.0.1:8000 and [::1]:8000 listening (0A),
# 0.0.0.0:8001 listening, and an established connection on 8000.
TCP = b"""  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 2 0 0 0 0 0 -1
   1: 00000000:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 2 0 0 0 0 0 -1
   2: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 5 2 0 0 0 0 0 -1
"""
TCP6 = b"""  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1F40 00000000000000000000000000000000:0000 0A
"""


def test_listening_reads_proc_net_tcp_tables() -> None:
    assert listening(TCP, 8000) == ["127.0.0.1"]
    assert listening(TCP, 8001) == ["0.0.0.0"]
    assert listening(TCP6, 8000) == ["::1"]
    assert listening(TCP, 9) == [] and listening(b"garbage\nnot a table at all\n", 8000) == []


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _get(fwd: PortForwarder, port: int, target: str = "127.0.0.1") -> tuple[int, str]:
    """GET through a listener for `port` of a stand-in sandbox at `target`."""
    async def go() -> tuple[int, str]:
        url = await fwd.expose(SID, port, target)

        def fetch() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()
        try:
            return await asyncio.to_thread(fetch)
        finally:
            await fwd.close(SID)
    return asyncio.run(go())


def test_nothing_listening_is_a_502_naming_the_port_gh19() -> None:
    port = _closed_port()
    status, body = _get(PortForwarder(), port)
    assert status == 502
    assert f"nothing is listening on port {port} of sandbox {SID}" in body and "0.0.0.0" in body


def test_a_server_on_loopback_only_is_named_with_the_fix_gh19() -> None:
    port = _closed_port()
    table = TCP.replace(b"1F40", f"{port:04X}".encode())

    async def read_file(sandbox_id: str, path: str) -> bytes:
        assert sandbox_id == SID
        if path == "/proc/net/tcp":
            return table
        raise FileNotFoundError(path)  # no tcp6 table: still an answer

    status, body = _get(PortForwarder(read_file=read_file), port)
    assert status == 502
    assert f"listens on 127.0.0.1:{port} only" in body and "Bind it to 0.0.0.0" in body


def test_a_sandbox_that_does_not_accept_in_time_is_a_504(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy, "CONNECT_TIMEOUT_S", 0.3)

    async def never(*_a: Any) -> Any:
        await asyncio.sleep(60)

    monkeypatch.setattr(proxy, "connect_marked", never)
    status, body = _get(PortForwarder(), 8000)
    assert status == 504 and "did not accept the connection within 0.3 s" in body


@pytest.mark.skipif(os.geteuid() != 0, reason="SO_MARK needs CAP_NET_ADMIN (root)")
def test_connections_to_the_sandbox_carry_the_daemons_mark_gh19() -> None:
    """The host's firewall lets only marked connections reach a sandbox (firewall.py)."""
    marks: list[int] = []

    async def go() -> bytes:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            await w.drain()
            w.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        real = proxy.connect_marked

        async def spy(host: str, p: int, mark: int) -> Any:
            r, w = await real(host, p, mark)
            marks.append(w.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_MARK))
            return r, w

        proxy.connect_marked = spy  # type: ignore[assignment]
        fwd = PortForwarder(mark=0x72620ABC)
        try:
            url = await fwd.expose(SID, port, "127.0.0.1")
            return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        finally:
            proxy.connect_marked = real  # type: ignore[assignment]
            await fwd.close(SID)
            server.close()

    assert asyncio.run(go()) == b"ok"
    assert marks == [0x72620ABC]
