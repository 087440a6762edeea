"""The daemon's end of the in-sandbox agent channel: two named FIFOs, framed JSON, asyncio.

The agent (agent/agent.py) is the sandbox's init process; its stdin/stdout are the FIFOs
`in` and `out` in the sandbox directory. The sandbox holds both FIFOs open read-write, so
the daemon can close and reopen its ends (a daemon restart) without the agent seeing EOF.
The daemon opens its own file descriptions (gVisor makes the ones it was handed
non-blocking, and flags are per description).

Frame: 4-byte big-endian length + payload; requests and replies match on `id`. A request is a
UTF-8 JSON object; a reply is HMAC-SHA256(key, json) + json, with the per-sandbox key the
agent read (and deleted) at boot. A reply that fails the check was written into the channel by
a process inside the sandbox: the channel is then `corrupted` and the sandbox is ended.

Checkpoints (gh-19): `runsc checkpoint` captures the agent as it is, and a frame half-written
at that moment is cut in two: a restored copy writes the rest of a reply (or waits for the rest
of a request) on a channel whose reader expects a header, and even the source, left running,
was seen to garble its stream (ended as corrupted). So a checkpoint runs inside
`quiesced()`: new requests are held here, the `quiesce` request goes out after whatever is
half-written, and the agent answers it only once no reply of its is half-written, then writes
nothing more until `resume` (or `hold_s`). Both directions then stand at a frame boundary,
in the source and in every copy; a copy's daemon sends `resume` first (`resume_restored`). A
command still running is no obstacle: its reply simply waits. The normal request path pays one
attribute test.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import os
import secrets
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Callable

from ..errors import AgentFailed, SandboxLost

_HDR = struct.Struct(">I")
MAC_LEN = 32
MAX_FRAME = 512 * 1024 * 1024
QUIESCE_WAIT_S = 10.0  # for the agent to finish the reply it is writing and answer `quiesce`


class AgentError(AgentFailed):
    """The agent answered with an error (`kind` is its code, e.g. `not_found`); kinds with a
    better class are converted by the daemon (server/execfiles.py AGENT_ERRORS), the rest
    reach the client as AgentFailed (code `agent_error`)."""

    def __init__(self, kind: str, message: str, *, sandbox_id: str | None = None) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.kind = kind


def make_fifos(directory: Path) -> tuple[Path, Path]:
    fin, fout = directory / "in", directory / "out"
    for p in (fin, fout):
        if not p.exists():
            os.mkfifo(p, 0o600)
    return fin, fout


def open_for_sandbox(fifo_in: Path, fifo_out: Path) -> tuple[int, int]:
    """The descriptors to hand to `runsc run/restore` as stdin/stdout (read-write: never EOF)."""
    return os.open(fifo_in, os.O_RDWR), os.open(fifo_out, os.O_RDWR)


class AgentChannel:
    """Request/reply over the FIFOs. One per live sandbox; all methods run on one event loop."""

    def __init__(self, sandbox_id: str, fifo_in: Path, fifo_out: Path, key: bytes = b"") -> None:
        self.sandbox_id = sandbox_id
        self.key = key
        self.corrupted = False
        self._fifo_in = fifo_in
        self._fifo_out = fifo_out
        self._in_fd = -1
        self._out_fd = -1
        self._buf = bytearray()
        self._wbuf = bytearray()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        # Ids start at a random offset: a reply left in the FIFO by a previous daemon
        # (crash mid-request) can then never match a new request.
        self._ids = itertools.count(secrets.randbelow(1 << 40) + 1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed_reason: str | None = None
        self.on_lost: Callable[[str], None] | None = None
        # While quiesced: the request frames held back (sent on release), else None.
        self._held: bytearray | None = None
        self._gate: asyncio.Lock | None = None  # one quiesce at a time

    def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._out_fd = os.open(self._fifo_out, os.O_RDONLY | os.O_NONBLOCK)
        self._in_fd = os.open(self._fifo_in, os.O_WRONLY | os.O_NONBLOCK)
        self._loop.add_reader(self._out_fd, self._on_readable)

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Waits for the agent's first `ready` frame (a fresh boot, not a restore)."""
        assert self._ready is not None
        return await asyncio.wait_for(asyncio.shield(self._ready), timeout)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._out_fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError as e:
            self.fail(f"reading from the agent failed: {e}")
            return
        if not chunk:
            self.fail("the sandbox closed its agent channel (it exited)")
            return
        self._buf += chunk
        while len(self._buf) >= 4:
            (n,) = _HDR.unpack_from(self._buf)
            if n > MAX_FRAME or n < MAC_LEN:
                self.corrupted = True
                self.fail(f"the channel carried a {n}-byte frame: something inside the sandbox wrote into it")
                return
            if len(self._buf) < 4 + n:
                break
            mac = bytes(self._buf[4:4 + MAC_LEN])
            body = bytes(self._buf[4 + MAC_LEN:4 + n])
            del self._buf[:4 + n]
            if not hmac.compare_digest(mac, hmac.new(self.key, body, hashlib.sha256).digest()):
                self.corrupted = True
                self.fail("a reply failed authentication: something inside the sandbox wrote into the agent channel")
                return
            try:
                msg = json.loads(body)
            except ValueError:
                continue
            self._dispatch(msg)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if msg.get("event") == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(msg)
            return
        fut = self._pending.pop(msg.get("id", -1), None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _on_writable(self) -> None:
        assert self._loop is not None
        try:
            n = os.write(self._in_fd, self._wbuf)
        except BlockingIOError:
            return
        except OSError as e:
            self._loop.remove_writer(self._in_fd)
            self.fail(f"writing to the agent failed: {e}")
            return
        del self._wbuf[:n]
        if not self._wbuf:
            self._loop.remove_writer(self._in_fd)

    def _send(self, msg: dict[str, Any], *, now: bool = False) -> None:
        """Queues one signed request frame; held back while quiesced unless `now`."""
        data = json.dumps(msg, separators=(",", ":")).encode()
        # Requests are authenticated too: root in the sandbox can open the agent's stdin
        # (/proc/1/fd/0), so an unsigned request could be swapped for a forged one.
        mac = hmac.new(self.key, data, hashlib.sha256).digest()
        frame = _HDR.pack(len(mac) + len(data)) + mac + data
        if self._held is not None and not now:
            self._held += frame
            return
        self._write(frame)

    def _write(self, frame: bytes) -> None:
        assert self._loop is not None
        was_empty = not self._wbuf
        self._wbuf += frame
        if was_empty:
            self._on_writable()
            if self._wbuf and self._in_fd >= 0:
                self._loop.add_writer(self._in_fd, self._on_writable)

    async def request(self, op: str, wait_s: float | None = 30.0, **fields: Any) -> dict[str, Any]:
        """Sends one request and waits for its reply.

        Raises:
            SandboxLost: the channel closed (the sandbox died) or no reply came in `timeout` s.
            AgentError: the agent ran the request and reported a failure.
        """
        return await self._request(op, wait_s, fields, now=False)

    async def _request(self, op: str, wait_s: float | None, fields: dict[str, Any], *, now: bool) -> dict[str, Any]:
        if self.closed_reason is not None:
            raise SandboxLost(f"sandbox {self.sandbox_id}: {self.closed_reason}", sandbox_id=self.sandbox_id)
        assert self._loop is not None
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[rid] = fut
        self._send({"id": rid, "op": op, **fields}, now=now)
        try:
            reply = await asyncio.wait_for(fut, wait_s)
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            raise SandboxLost(f"sandbox {self.sandbox_id}: the agent did not answer `{op}` in "
                              f"{wait_s} s", sandbox_id=self.sandbox_id) from None
        finally:
            self._pending.pop(rid, None)
        if "lost" in reply:
            raise SandboxLost(f"sandbox {self.sandbox_id}: {reply['lost']}", sandbox_id=self.sandbox_id)
        if not reply.get("ok"):
            raise AgentError(str(reply.get("error")), str(reply.get("message")), sandbox_id=self.sandbox_id)
        return reply

    @contextlib.asynccontextmanager
    async def quiesced(self, hold_s: float, wait_s: float = QUIESCE_WAIT_S) -> AsyncIterator[str]:
        """Holds the channel at a frame boundary in both directions for the block (a checkpoint).

        hold_s: seconds the agent holds its output at most (it goes on by itself after that,
        should this daemon die before the release).
        wait_s: seconds to wait for the agent's answer; without one the block runs anyway.

        Yields how it went: "held" (both directions at a boundary), "old_agent" (an agent
        without `quiesce`: requests are held, but a reply may be half-written) or "no_answer"
        (none in `wait_s`: an overloaded or dead agent; the block runs regardless). On leaving,
        `resume` and then the requests held meanwhile are sent, in order.
        """
        if self._gate is None:
            self._gate = asyncio.Lock()
        async with self._gate:
            token = secrets.token_hex(8)
            self._held = bytearray()
            try:
                try:
                    reply = await self._request("quiesce", wait_s, {"token": token, "hold_s": hold_s}, now=True)
                    how = "held" if reply.get("held") else "no_answer"
                except AgentError:
                    how = "old_agent"
                except SandboxLost:
                    how = "no_answer"
                yield how
            finally:
                held, self._held = self._held, None
                if self.closed_reason is None:
                    # `resume` names the hold, so that a `quiesce` the agent runs only now
                    # (it answered too late) holds nothing.
                    self._send({"id": next(self._ids), "op": "resume", "token": token})
                    if held:
                        self._write(bytes(held))

    def resume_restored(self) -> None:
        """Releases the output of an agent captured quiesced (a restored copy, or a sandbox whose
        previous daemon died during a checkpoint): sent before anything else, its answer unread."""
        self._send({"id": next(self._ids), "op": "resume"})

    def fail(self, reason: str) -> None:
        """Marks the channel dead and wakes every waiter with `reason`."""
        if self.closed_reason is None:
            self.closed_reason = reason
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result({"lost": reason})
        self._pending.clear()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(SandboxLost(f"sandbox {self.sandbox_id}: {reason}",
                                                  sandbox_id=self.sandbox_id))
            self._ready.exception()  # mark retrieved: nobody may be waiting
        self._detach()
        if self.on_lost is not None:
            cb, self.on_lost = self.on_lost, None
            cb(reason)

    def _detach(self) -> None:
        if self._loop is not None:
            for fd, rm in ((self._out_fd, self._loop.remove_reader), (self._in_fd, self._loop.remove_writer)):
                if fd >= 0:
                    try:
                        rm(fd)
                    except (ValueError, OSError):
                        pass
        for fd in (self._out_fd, self._in_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._out_fd = self._in_fd = -1

    def close(self, reason: str = "the sandbox was terminated") -> None:
        self.on_lost = None
        self.fail(reason)
