"""The SDK's HTTP client: httpx over the daemon's unix socket (or `ROLLBOX_URL`).

When no daemon answers on the local socket and `ROLLBOX_URL` is unset, the client starts one
(`python -m rollbox serve`, detached, logging to `ROLLBOX_HOME/daemon.log`) and waits for it:
the embedded default needs no service set up by hand. Sandboxes belong to the daemon, so they
outlive the client process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json as _json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

from .. import errors
from ..config import Paths
from .connections import ExclusiveConnections

DAEMON_START_TIMEOUT_S = 90.0


def daemon_running(paths: Paths) -> bool:
    """True while some daemon process holds this state directory's lock."""
    try:
        with open(paths.daemon_lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def stop_daemon(paths: Paths, timeout_s: float = 10.0) -> bool:
    """Stops the daemon serving `paths.home`: SIGTERM, wait until it has released its lock
    (reaping it if this process started it), SIGKILL after `timeout_s` seconds. Its sandboxes
    keep running. Returns False when no daemon was running."""
    try:
        pid = int(paths.daemon_lock.read_text().strip())
    except (OSError, ValueError):
        return False
    if not daemon_running(paths):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while daemon_running(paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    if daemon_running(paths):
        os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # the lock goes just before the process: reap our own child
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            break
        time.sleep(0.02)
    return True


def validation_message(body: Any) -> str:
    """A FastAPI/pydantic 422 body as one readable line: `field: what is wrong (got VALUE)`
    per problem, instead of the raw list of dicts."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if not isinstance(detail, list):
        return str(detail)
    parts = []
    for d in detail:
        if not isinstance(d, dict):
            parts.append(str(d))
            continue
        loc = ".".join(str(x) for x in d.get("loc", []) if x not in ("body", "query", "path"))
        got = f" (got {d['input']!r})" if "input" in d and not isinstance(d["input"], (dict, list)) else ""
        parts.append(f"{loc or 'request'}: {d.get('msg', 'invalid')}{got}")
    return "; ".join(parts)


class Client:
    """One connection pool to one daemon, shared by every thread: a call takes an idle
    connection (or opens one) for its one request and gives it back (`ExclusiveConnections`)."""

    def __init__(self, url: str | None = None, *, paths: Paths | None = None, autostart: bool = True,
                 token: str | None = None) -> None:
        """url: `http://HOST:PORT` of a daemon's TCP listener (token: its bearer token, default
        ROLLBOX_TOKEN), `unix:///path`, or None: ROLLBOX_URL, else the local daemon's socket."""
        self.paths = paths or Paths.from_env()
        url = url if url is not None else os.environ.get("ROLLBOX_URL")
        self.autostart = autostart and not url
        if url and url.startswith("http"):
            transport = ExclusiveConnections()
            base = url
        else:
            sock = url.removeprefix("unix://") if url else str(self.paths.socket)
            transport = ExclusiveConnections(uds=sock)
            base = "http://rollbox"
            self.socket_path = sock
        self.base_url = url or f"unix://{self.paths.socket}"
        headers = {"user-agent": "rollbox-sdk"}
        token = token if token is not None else os.environ.get("ROLLBOX_TOKEN")
        if token:
            headers["authorization"] = f"Bearer {token.strip()}"
        self._http = httpx.Client(transport=transport, base_url=base,
                                  timeout=httpx.Timeout(None, connect=10.0), headers=headers)
        # Streamed answers (process output) hold their connection while they last: httpx's own
        # pool, apart from the request pool (which reads every body whole).
        stream_transport = httpx.HTTPTransport(uds=self.socket_path) if base == "http://rollbox" else httpx.HTTPTransport()
        self._stream_http = httpx.Client(transport=stream_transport, base_url=base,
                                         timeout=httpx.Timeout(None, connect=10.0), headers=headers)
        self._checked = False

    def close(self) -> None:
        self._http.close()
        self._stream_http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- daemon start ------------------------------------------------------------------

    def _ping(self) -> bool:
        try:
            resp = self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        if resp.status_code == 401:
            try:
                raise errors.from_wire(resp.json(), 401)
            except ValueError:
                raise errors.Unauthorized(f"{self.base_url} refused the request (HTTP 401)") from None
        return resp.status_code == 200

    def ensure_daemon(self) -> None:
        """Connects, starting the local daemon if needed. Raises DaemonUnavailable."""
        if self._checked or self._ping():
            self._checked = True
            return
        if not self.autostart:
            raise errors.DaemonUnavailable(
                f"no rollbox daemon answers at {self.base_url}: start it with `rollbox serve` "
                "or unset ROLLBOX_URL to let the SDK start a local one")
        if os.geteuid() != 0:
            raise errors.DaemonUnavailable("no rollbox daemon is running and starting one needs root "
                                           "(gVisor, mounts, cgroups): run as root or start `sudo rollbox serve`")
        self.paths.home.mkdir(parents=True, exist_ok=True)
        with open(self.paths.home / "spawn.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._ping():
                self._spawn_daemon()
        self._checked = True

    def _lock_held(self) -> bool:
        return daemon_running(self.paths)

    def _spawn_daemon(self) -> None:
        env = dict(os.environ, ROLLBOX_HOME=str(self.paths.home))
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        proc: subprocess.Popen[bytes] | None = None
        while time.monotonic() < deadline:
            if self._ping():
                return
            if proc is None or (proc.poll() is not None and not self._lock_held()):
                if proc is not None and proc.returncode not in (0, None) and not self._lock_held() and \
                        "already serves" not in self.paths.daemon_log.read_text(errors="replace")[-300:]:
                    tail = self.paths.daemon_log.read_text(errors="replace")[-1500:]
                    raise errors.DaemonUnavailable(f"the rollbox daemon exited at start (code {proc.returncode}); "
                                                   f"{self.paths.daemon_log}:\n{tail}")
                # (Re)start unless a daemon (perhaps one shutting down) still holds the lock.
                if not self._lock_held():
                    with open(self.paths.daemon_log, "ab") as log:
                        proc = subprocess.Popen([sys.executable, "-m", "rollbox", "serve"], stdin=subprocess.DEVNULL,
                                                stdout=log, stderr=log, env=env, start_new_session=True,
                                                close_fds=True)
            time.sleep(0.05)
        raise errors.DaemonUnavailable(f"the rollbox daemon did not answer within {DAEMON_START_TIMEOUT_S:.0f} s; "
                                       f"see {self.paths.daemon_log}")

    # ---- requests ----------------------------------------------------------------------

    def get_text(self, path: str) -> str:
        """GET a plain-text resource (e.g. /metrics); raises the daemon's typed error."""
        self.ensure_daemon()
        try:
            resp = self._http.get(path)
        except httpx.TransportError as e:
            raise errors.DaemonUnavailable(f"lost the rollbox daemon at {self.base_url} during GET {path}: {e}; "
                                           f"see {self.paths.daemon_log}") from e
        if resp.status_code >= 400:
            raise self._error(resp.status_code, {"message": resp.text[:500]}, f"GET {path}")
        return resp.text

    def _raise_for(self, resp: httpx.Response, what: str) -> None:
        if resp.status_code < 400:
            return
        try:
            body = _json.loads(resp.read())
        except ValueError:
            body = {"message": resp.text[:500]}
        if resp.status_code == 422:
            raise errors.InvalidArgument(f"invalid request to {what}: {validation_message(body)}")
        raise self._error(resp.status_code, body, what)

    def send_raw(self, method: str, path: str, content: bytes | Iterator[bytes],
                 params: dict[str, Any] | None = None) -> Any:
        """Sends `content` (bytes, or an iterator of chunks, streamed) as the raw request body;
        returns the decoded JSON answer or raises the daemon's typed error. Not resent after a
        lost connection (a stream cannot be replayed): that is DaemonUnavailable."""
        self.ensure_daemon()
        started = False

        def body() -> Iterator[bytes]:
            nonlocal started
            started = True
            if isinstance(content, bytes):
                yield content
            else:
                yield from content
        try:
            try:
                resp = self._http.request(method, path, content=body(), params=params,
                                          headers={"content-type": "application/octet-stream"})
            except httpx.ConnectError:
                if started:
                    raise
                # No byte went out (the daemon crashed or restarted): find or start the next one.
                self._checked = False
                self.ensure_daemon()
                resp = self._http.request(method, path, content=body(), params=params,
                                          headers={"content-type": "application/octet-stream"})
        except httpx.TransportError as e:
            raise errors.DaemonUnavailable(f"lost the rollbox daemon at {self.base_url} during {method} {path}: {e}; "
                                           f"see {self.paths.daemon_log}") from e
        self._raise_for(resp, f"{method} {path}")
        return resp.json()

    @contextlib.contextmanager
    def stream_raw(self, path: str, params: dict[str, Any] | None = None) -> Iterator[tuple[httpx.Response,
                                                                                          Iterator[bytes]]]:
        """GET whose raw answer body is read in chunks: yields (response, chunks). Raises the
        daemon's typed error before any chunk, DaemonUnavailable if the answer is cut short."""
        self.ensure_daemon()
        try:
            self._http.head("/health")  # reachable? (a crashed daemon: find or start the next one)
        except httpx.ConnectError:
            self._checked = False
            self.ensure_daemon()
        except httpx.TransportError:
            pass
        try:
            with self._http.stream("GET", path, params=params) as resp:
                self._raise_for(resp, f"GET {path}")

                def chunks() -> Iterator[bytes]:
                    try:
                        yield from resp.iter_bytes()
                    except httpx.TransportError as e:
                        raise errors.DaemonUnavailable(f"the answer to GET {path} was cut short: {e}; the daemon or "
                                                       f"the sandbox stopped (see {self.paths.daemon_log})") from e
                yield resp, chunks()
        except httpx.TransportError as e:
            raise errors.DaemonUnavailable(f"lost the rollbox daemon at {self.base_url} during GET {path}: {e}; "
                                           f"see {self.paths.daemon_log}") from e

    def _error(self, status: int, body: Any, what: str) -> errors.RollboxError:
        """The typed error of a failed answer. A 5xx without rollbox's error form did not come
        from a route (those always carry a code): the server around them failed the request,
        as uvicorn does for what is still running when the daemon stops or crashes."""
        if status >= 500 and not (isinstance(body, dict) and body.get("code")):
            text = body.get("message") if isinstance(body, dict) else body
            return errors.DaemonUnavailable(f"the rollbox daemon at {self.base_url} failed {what} without an answer "
                                            f"(HTTP {status}: {str(text)[:200]}): it was stopping or crashing; "
                                            f"retry the call; see {self.paths.daemon_log}")
        return errors.from_wire(body if isinstance(body, dict) else {"message": str(body)}, status)

    def stream_lines(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """GETs a chunked NDJSON resource and yields each line's object as it arrives (the
        connection closes when the iterator is closed). Raises the daemon's typed error for
        a failed answer or an {"error": ...} line, DaemonUnavailable when the connection is lost."""
        self.ensure_daemon()
        try:
            with self._stream_http.stream("GET", path, params=params) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    try:
                        body = resp.json()
                    except ValueError:
                        body = {"message": resp.text[:500]}
                    if resp.status_code == 422:
                        raise errors.InvalidArgument(f"invalid request to {path}: {validation_message(body)}")
                    raise self._error(resp.status_code, body, f"GET {path}")
                for line in resp.iter_lines():
                    if line:
                        obj = _json.loads(line)
                        if "error" in obj and isinstance(obj["error"], dict):
                            raise errors.from_wire(obj["error"], 500)
                        yield obj
        except httpx.TransportError as e:
            # The next call looks for (or starts) a daemon again instead of trusting this one:
            # a follower asking again after a crash then reaches the restarted daemon.
            self._checked = False
            raise errors.DaemonUnavailable(f"lost the rollbox daemon at {self.base_url} while streaming {path}: {e}; "
                                           f"see {self.paths.daemon_log}") from e

    def request(self, method: str, path: str, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        """Sends one request; returns the decoded JSON body or raises the daemon's typed error."""
        self.ensure_daemon()
        content: bytes | None = None
        headers = {}
        if json is not None:
            try:
                # ensure_ascii: a surrogate-escaped (non-UTF-8) path travels as \udcXX and the
                # daemon answers with a typed error, instead of httpx failing to encode it.
                content = _json.dumps(json, allow_nan=False, ensure_ascii=True).encode()
            except (ValueError, TypeError) as e:
                raise errors.InvalidArgument(f"invalid argument for {path}: {e} (numbers must be finite; "
                                             "values must be JSON-serialisable)") from None
            headers["content-type"] = "application/json"
        try:
            try:
                resp = self._http.request(method, path, content=content, headers=headers, params=params)
            except httpx.ConnectError:
                # The request never reached a daemon (it crashed or restarted): start or find
                # the new one and send it again; nothing was done twice.
                self._checked = False
                self.ensure_daemon()
                resp = self._http.request(method, path, content=content, headers=headers, params=params)
        except UnicodeEncodeError:
            raise errors.InvalidArgument(f"{path!r} is not valid UTF-8: names and ids in a request path must be "
                                         "text (file paths go in the body)") from None
        except httpx.TransportError as e:
            raise errors.DaemonUnavailable(f"lost the rollbox daemon at {self.base_url} during {method} {path}: {e}; "
                                           f"see {self.paths.daemon_log}") from e
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"message": resp.text[:500]}
            if resp.status_code == 422:
                raise errors.InvalidArgument(f"invalid request to {path}: {validation_message(body)}")
            raise self._error(resp.status_code, body, f"{method} {path}")
        try:
            return resp.json()
        except ValueError:
            raise errors.ApiError(f"{method} {path}: the daemon answered HTTP {resp.status_code} with a body that "
                                  "is not JSON (a wrong path?)") from None
