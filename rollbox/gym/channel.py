"""The connection to an env server, and the env's errors on this side.

One authenticated TCP connection per env; frames as in `wire`. An error the server sends
becomes gymnasium's or Python's own class where there is one, else `RemoteEnvError`.
"""

from __future__ import annotations

import builtins
import socket
import time
import warnings
from typing import Any

import gymnasium

from .. import errors
from . import wire

# Builtin exceptions an env may raise that come back as themselves (AssertionError for an
# action outside the space, as gymnasium's own envs do).
_BUILTIN_ERRORS = frozenset({
    "AssertionError", "ValueError", "TypeError", "KeyError", "IndexError", "RuntimeError", "NotImplementedError",
    "AttributeError", "ImportError", "ModuleNotFoundError", "ZeroDivisionError", "OverflowError",
    "FloatingPointError", "ArithmeticError", "LookupError", "MemoryError", "RecursionError"})


class RemoteEnvError(errors.RollboxError):
    """The env in the sandbox raised an exception that has no class on this side.

    Attributes: remote_type ("module.Class"), remote_traceback (text).
    """

    code = "remote_env_error"

    def __init__(self, message: str, *, sandbox_id: str | None = None, remote_type: str = "",
                 remote_traceback: str = "") -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


class EnvTimeout(errors.SandboxTerminated):
    """A call to the env got no answer within its timeout; the env's sandbox was terminated."""

    code = "env_timeout"


def remote_error(err: Any, sandbox_id: str | None) -> Exception:
    """The local exception for an error the env server sent: gymnasium's own error classes
    (`gymnasium.error.NameNotFound`, ...) and common builtins as themselves, with the remote
    traceback as a note; anything else as RemoteEnvError."""
    if not isinstance(err, dict):
        return errors.SandboxLost(f"the env server sent a malformed error {str(err)[:200]!r}", sandbox_id=sandbox_id)
    module, name = str(err.get("module", "")), str(err.get("type", ""))
    message, tb = str(err.get("message", "")), str(err.get("traceback", ""))
    cls: Any = None
    if module == "gymnasium.error":
        cls = getattr(gymnasium.error, name, None)
    elif module == "builtins" and name in _BUILTIN_ERRORS:
        cls = getattr(builtins, name, None)
    exc: Exception
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except Exception:  # a class whose constructor wants more than a message
            exc = RemoteEnvError(f"{module}.{name}: {message}", sandbox_id=sandbox_id,
                                 remote_type=f"{module}.{name}", remote_traceback=tb)
    else:
        exc = RemoteEnvError(f"the env raised {module}.{name}: {message}", sandbox_id=sandbox_id,
                             remote_type=f"{module}.{name}", remote_traceback=tb)
    if tb:
        exc.add_note(f"remote traceback (sandbox {sandbox_id}):\n{tb}")
    return exc


class _Broken(Exception):
    """The connection ended or broke (the sandbox or its server is gone)."""


class _TimedOut(Exception):
    pass


def _emit(ws: Any) -> None:
    for cat, msg in ws if isinstance(ws, list) else []:
        c = getattr(builtins, str(cat), None)
        category = c if isinstance(c, type) and issubclass(c, Warning) else UserWarning
        warnings.warn(f"[in the sandbox] {msg}", category, stacklevel=4)


class Channel:
    """One authenticated connection to an env server. Not thread-safe (one env, one caller)."""

    def __init__(self, url: str, token: str, sandbox_id: str, *, timeout: float | None,
                 connect_timeout: float) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.addr = (host, int(port))
        self.sandbox_id = sandbox_id
        self.timeout = timeout
        deadline = time.monotonic() + connect_timeout
        last: Exception | None = None
        while True:
            try:
                self._open(token)
                return
            except (OSError, _Broken, wire.WireError) as e:  # not listening yet
                last = e
                self._drop()
            if time.monotonic() > deadline:
                raise _Broken(f"no env server answered on {url} within {connect_timeout:g} s: {last}")
            time.sleep(0.02)

    def _open(self, token: str) -> None:
        self.sock = socket.create_connection(self.addr, timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")
        wire.send(self.sock, {"op": "hello", "token": token})
        hello = wire.recv(self.reader)
        if not isinstance(hello, dict) or "ok" not in hello:
            raise _Broken(f"bad hello {str(hello)[:200]!r}")
        self.sock.settimeout(self.timeout)

    def _drop(self) -> None:
        for x in ("reader", "sock"):
            obj = self.__dict__.pop(x, None)
            if obj is not None:
                try:
                    obj.close()
                except OSError:
                    pass

    def send(self, op: str, **args: Any) -> None:
        try:
            self.sock.sendall(wire.dumps({"op": op, **args}))
        except socket.timeout as e:
            raise _TimedOut(str(e)) from e
        except (OSError, AttributeError) as e:
            raise _Broken(f"sending {op}: {e}") from e

    def recv(self) -> Any:
        """The answer's value; raises the env's error, _Broken or _TimedOut."""
        try:
            msg = wire.recv(self.reader)
        except socket.timeout as e:
            raise _TimedOut(str(e)) from e
        except (OSError, AttributeError, wire.WireError) as e:
            raise _Broken(str(e)) from e
        if msg is None:
            raise _Broken("the env server closed the connection")
        if not isinstance(msg, dict):
            raise _Broken(f"a malformed answer {str(msg)[:200]!r}")
        if "w" in msg:
            _emit(msg["w"])
        if "err" in msg:
            raise remote_error(msg["err"], self.sandbox_id)
        return msg.get("ok")

    def close(self) -> None:
        self._drop()
