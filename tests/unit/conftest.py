"""Shared fixtures for rollbox's fast unit tests (no gVisor, no daemon)."""

from __future__ import annotations

import base64
import itertools
import hashlib
import hmac
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import rollbox.runtime.agent.agent as agent_module

AGENT_PATH = Path(agent_module.__file__)
NATIVE_AGENT_PATH = AGENT_PATH.parent / "rollbox-agent"  # built by `make agent`
MARK = "ROLLBOX_EXEC_MARK"
_HDR = struct.Struct(">I")


def pids_with_env_prefix(prefix: bytes) -> list[int]:
    """Live pids whose environment has an entry starting with `prefix`."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if any(e.startswith(prefix) for e in env.split(b"\0")):
            out.append(int(name))
    return out


def pids_with_cmdline(argv: list[str]) -> list[int]:
    """Live (non-zombie) pids whose argv is exactly `argv`."""
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if cmd == want:
            out.append(int(name))
    return out


def agent_command(kind: str) -> list[str]:
    """How to run one agent on the host: "python" (agent.py) or "native" (the Rust binary)."""
    if kind == "native":
        return [str(NATIVE_AGENT_PATH)]
    return [sys.executable, "-u", "-S", str(AGENT_PATH)]


class AgentProcess:
    """Drives an agent (agent.py or the native binary) as a plain host subprocess over its
    stdin/stdout pipes.

    Replies are demultiplexed by `id` by a reader thread, so requests may overlap.
    """

    def __init__(self, kind: str = "python") -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            agent_command(kind),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[Any, dict[str, Any]] = {}
        self._arrival: list[Any] = []
        self._eof = False
        self.ready: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self.ready = self.wait_reply("ready", timeout=60)

    # ---- framing --------------------------------------------------------------------

    def _read_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        assert self.proc.stdout is not None
        while len(buf) < n:
            chunk = os.read(self.proc.stdout.fileno(), n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def _read_loop(self) -> None:
        try:
            while True:
                hdr = self._read_exact(4)
                if hdr is None:
                    break
                (n,) = _HDR.unpack(hdr)
                body = self._read_exact(n)
                if body is None:
                    break
                # Replies are HMAC-SHA256 (32 bytes, empty key on the host: no key file) + JSON.
                mac, body = body[:32], body[32:]
                assert hmac.compare_digest(mac, hmac.new(b"", body, hashlib.sha256).digest())
                msg = json.loads(body)
                key = "ready" if msg.get("event") == "ready" else msg.get("id")
                with self._cond:
                    self._replies[key] = msg
                    self._arrival.append(key)
                    self._cond.notify_all()
        except OSError:
            pass
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def send(self, op: str, **fields: Any) -> int:
        rid = next(self._ids)
        data = json.dumps({"id": rid, "op": op, **fields}).encode()
        assert self.proc.stdin is not None
        with self._lock:
            # Requests are signed like replies (empty key on the host: no key file).
            mac = hmac.new(b"", data, hashlib.sha256).digest()
            self.proc.stdin.write(_HDR.pack(len(mac) + len(data)) + mac + data)
            self.proc.stdin.flush()
        return rid

    def wait_reply(self, rid: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while rid not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply for {rid!r} in {timeout} s")
                if self._eof:
                    raise EOFError(f"agent closed stdout before replying to {rid!r}")
                self._cond.wait(left)
            return self._replies.pop(rid)

    def arrival_order(self) -> list[Any]:
        with self._cond:
            return list(self._arrival)

    def request(self, op: str, timeout: float = 60.0, **fields: Any) -> dict[str, Any]:
        return self.wait_reply(self.send(op, **fields), timeout)

    # ---- helpers -----------------------------------------------------------------------

    pids_with_env_prefix = staticmethod(pids_with_env_prefix)
    pids_with_cmdline = staticmethod(pids_with_cmdline)

    def send_exec(self, argv: list[str], *, timeout: float | None = None, max_output: int | None = None,
                  stdin: bytes | None = None, env: dict[str, str] | None = None, cwd: str | None = None) -> int:
        return self.send("exec", argv=argv, timeout=timeout, max_output=max_output,
                         stdin=base64.b64encode(stdin).decode() if stdin is not None else None,
                         env=env or {}, cwd=cwd)

    def exec(self, argv: list[str], *, wait: float = 15.0, **kw: Any) -> dict[str, Any]:
        reply = self.wait_reply(self.send_exec(argv, **kw), wait)
        if reply.get("ok"):
            reply["stdout_raw"] = base64.b64decode(reply["stdout"])
            reply["stderr_raw"] = base64.b64decode(reply["stderr"])
        return reply

    def exec_as(self, argv: list[str], *, user: str, wait: float = 15.0) -> dict[str, Any]:
        """An exec as the image's `User` would run it (a name, uid, name:group or uid:gid)."""
        return self.wait_reply(self.send("exec", argv=argv, user=user, env={}), wait)

    def mark_prefix(self) -> bytes:
        """Every exec of this agent carries MARK=<agent pid>-<random token>."""
        return f"{MARK}={self.pid}-".encode()

    def close(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        # Execs run in their own sessions: kill whatever still carries this agent's mark.
        for _ in range(50):
            pids = pids_with_env_prefix(self.mark_prefix())
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


@pytest.fixture(params=["python", "native"])
def agent(request):
    if request.param == "native" and not os.access(NATIVE_AGENT_PATH, os.X_OK):
        pytest.skip("the native agent is not built (`make agent` needs Debian's cargo: scripts/setup-host.sh)")
    a = AgentProcess(request.param)
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def native(request):
    if not os.access(NATIVE_AGENT_PATH, os.X_OK):
        pytest.skip("the native agent is not built (`make agent` needs Debian's cargo: scripts/setup-host.sh)")
    a = AgentProcess("native")
    try:
        yield a
    finally:
        a.close()
