"""The daemon's side of a quiesced channel (gh-19): runtime/channel.py `quiesced` against a real
agent (both kinds) on the FIFOs a sandbox gets, and against one that predates `quiesce`."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import signal
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.runtime.channel import AgentChannel, make_fifos, open_for_sandbox
from tests.unit.conftest import NATIVE_AGENT_PATH, agent_command

_HDR = struct.Struct(">I")


@pytest.fixture(params=["python", "native"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "native" and not os.access(NATIVE_AGENT_PATH, os.X_OK):
        pytest.skip("the native agent is not built (`make agent`)")
    return str(request.param)


@pytest.fixture
def fifos(tmp_path: Path) -> Iterator[tuple[Path, Path, int, int]]:
    fin, fout = make_fifos(tmp_path)
    sb_in, sb_out = open_for_sandbox(fin, fout)
    yield fin, fout, sb_in, sb_out
    os.close(sb_in)
    os.close(sb_out)


async def _channel(fin: Path, fout: Path) -> AgentChannel:
    ch = AgentChannel("sb-test", fin, fout, b"")  # the host has no key file: the agents sign with b""
    ch.open()
    return ch


@pytest.fixture
def proc(kind: str, fifos: tuple[Path, Path, int, int]) -> Iterator[subprocess.Popen[bytes]]:
    """The agent as a sandbox runs it: stdin and stdout are the FIFOs."""
    _, _, sb_in, sb_out = fifos
    p = subprocess.Popen(agent_command(kind), stdin=sb_in, stdout=sb_out, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    yield p
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(5)


async def _agent_channel(fifos: tuple[Path, Path, int, int]) -> AgentChannel:
    ch = await _channel(fifos[0], fifos[1])
    await ch.wait_ready(60)
    return ch


def test_requests_wait_outside_a_quiesced_block(proc, fifos) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        ch = await _agent_channel(fifos)
        try:
            async with ch.quiesced(hold_s=30) as how:
                assert how == "held"
                ping = asyncio.ensure_future(ch.request("ping", wait_s=30))
                await asyncio.sleep(0.3)
                assert not ping.done()
                assert ch._held  # not even written: the agent's input stays at a frame boundary
            assert (await asyncio.wait_for(ping, 10))["ok"] is True
            assert ch._held is None
            assert (await ch.request("ping", wait_s=10))["ok"] is True
        finally:
            ch.close()
    asyncio.run(main())


def test_transfers_in_flight_both_ways_come_through_whole(proc, fifos, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Large frames in both directions while the channel is quiesced and released, as a fork
    # during a streamed read_file or write_file does: all of them arrive intact.
    data = os.urandom(6 << 20)
    (tmp_path / "src").write_bytes(data)
    b64 = base64.b64encode(data).decode()

    async def main() -> None:
        ch = await _agent_channel(fifos)
        try:
            for i in range(3):
                io = [ch.request("read_file", wait_s=60, path=str(tmp_path / "src"), max_bytes=len(data)),
                      ch.request("write_file", wait_s=60, path=str(tmp_path / f"dst{i}"), data=b64, mode=0o600)]
                tasks = [asyncio.ensure_future(c) for c in io]
                await asyncio.sleep(0.01 * i)
                async with ch.quiesced(hold_s=30) as how:
                    assert how == "held"
                    await asyncio.sleep(0.05)  # the checkpoint
                read, wrote = await asyncio.wait_for(asyncio.gather(*tasks), 60)
                assert base64.b64decode(read["data"]) == data
                assert wrote["size"] == len(data) and (tmp_path / f"dst{i}").read_bytes() == data
            assert not ch.corrupted and ch.closed_reason is None
        finally:
            ch.close()
    asyncio.run(main())


def test_an_answer_too_late_holds_nothing(proc, fifos) -> None:  # type: ignore[no-untyped-def]
    # No answer in wait_s: the block runs anyway and the resume names the hold, so the agent,
    # answering only later, does not then hold its output for hold_s.
    async def main() -> None:
        ch = await _agent_channel(fifos)
        try:
            async with ch.quiesced(hold_s=60, wait_s=0) as how:
                assert how == "no_answer"
            t0 = asyncio.get_running_loop().time()
            assert (await ch.request("ping", wait_s=30))["ok"] is True
            assert asyncio.get_running_loop().time() - t0 < 5
        finally:
            ch.close()
    asyncio.run(main())


def test_quiesces_run_one_at_a_time(proc, fifos) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        ch = await _agent_channel(fifos)
        inside: list[int] = []

        async def checkpoint(n: int) -> None:
            async with ch.quiesced(hold_s=30) as how:
                assert how == "held"
                inside.append(n)
                assert len(inside) == 1
                await asyncio.sleep(0.1)
                inside.remove(n)

        try:
            await asyncio.wait_for(asyncio.gather(checkpoint(1), checkpoint(2)), 30)
            assert (await ch.request("ping", wait_s=10))["ok"] is True
        finally:
            ch.close()
    asyncio.run(main())


def _old_agent(fin: Path, fout: Path, seen: list[str], stop: threading.Event) -> None:
    """An agent from before `quiesce`: unknown ops get agent.py's KeyError reply."""
    rfd, wfd = os.open(fin, os.O_RDONLY), os.open(fout, os.O_WRONLY)
    try:
        while not stop.is_set():
            hdr = os.read(rfd, 4)
            if len(hdr) < 4:
                return
            n, body = _HDR.unpack(hdr)[0], b""
            while len(body) < n:
                body += os.read(rfd, n - len(body))
            req = json.loads(body[32:])
            seen.append(req["op"])
            rep = {"id": req["id"], "ok": True} if req["op"] == "ping" else \
                {"id": req["id"], "ok": False, "error": "agent_error", "message": f"KeyError: '{req['op']}'"}
            data = json.dumps(rep).encode()
            os.write(wfd, _HDR.pack(32 + len(data)) + hmac.new(b"", data, hashlib.sha256).digest() + data)
    finally:
        os.close(rfd)
        os.close(wfd)


def test_an_agent_without_quiesce_still_gets_its_requests_in_order(fifos) -> None:  # type: ignore[no-untyped-def]
    fin, fout, _, _ = fifos
    seen: list[str] = []
    stop = threading.Event()
    t = threading.Thread(target=_old_agent, args=(fin, fout, seen, stop), daemon=True)
    t.start()

    async def main() -> None:
        ch = await _channel(fin, fout)
        try:
            async with ch.quiesced(hold_s=30) as how:
                assert how == "old_agent"
                ping = asyncio.ensure_future(ch.request("ping", wait_s=30))
                await asyncio.sleep(0.1)
                assert not ping.done()
            assert (await asyncio.wait_for(ping, 10))["ok"] is True
            ch.resume_restored()  # a restore of an old snapshot: answered with an error, ignored
            assert (await ch.request("ping", wait_s=10))["ok"] is True
        finally:
            stop.set()
            ch.close()
    asyncio.run(main())
    assert seen == ["quiesce", "resume", "ping", "resume", "ping"]


