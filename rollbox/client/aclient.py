"""`AsyncClient`: the SDK's one implementation of talking to the daemon (httpx's async client).

Every request of the SDK goes through here, on the SDK's event loop (`portal.py`); the blocking
`Client` in transport.py is a façade that runs these coroutines there. Errors are converted
once, here: transport failures become `DaemonUnavailable`, answers with rollbox's error form
become their typed class (`errors.from_wire`), a 422 becomes `InvalidArgument`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json as _json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpcore
import httpx

from .. import errors
from ..config import Paths, platform_from_env
from .netbackend import AsyncioBackend
from .unixpool import UnixPool

DAEMON_START_TIMEOUT_S = 90.0
MAX_CONNECTIONS = 1024  # concurrent requests beyond this wait for a connection
MAX_IDLE = 256
# Seconds an idle connection is reused; the daemon closes idle ones after 300 s (uvicorn's
# timeout_keep_alive), so the client never sends on a connection the daemon is dropping.
KEEPALIVE_EXPIRY_S = 60.0
# httpx's Timeout(None, connect=10.0), as httpcore's request extension.
_EXTENSIONS = {"timeout": {"connect": 10.0, "read": None, "write": None, "pool": None}}
_PING_EXTENSIONS = {"timeout": {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}}
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"  # what a URL path keeps unescaped (RFC 3986 pchar), as httpx


def _param(value: Any) -> str:
    """A query value as httpx writes it (httpx._utils.primitive_value_to_str)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


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


class AsyncClient:
    """Requests to one daemon over one httpx.AsyncClient (unix socket, or TCP for `http://`).

    Args:
        url: `http://HOST:PORT` of a daemon's TCP listener, `unix:///path`, or None: the
            ROLLBOX_URL variable, else the local daemon's socket (started on first use when
            `autostart` and no daemon answers).
        paths: the state directory (default from ROLLBOX_HOME).
        token: bearer token for a TCP daemon (default ROLLBOX_TOKEN).
        transport: an httpx transport to use instead (tests: `httpx.MockTransport`).

    Bound to the event loop that first uses it (the SDK's, see portal.py).
    """

    def __init__(self, url: str | None = None, *, paths: Paths | None = None, autostart: bool = True,
                 token: str | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.paths = paths or Paths.from_env()
        url = url if url is not None else os.environ.get("ROLLBOX_URL")
        self.autostart = autostart and not url
        self.socket_path: str | None = None
        custom = transport  # tests pass httpx.MockTransport
        limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_IDLE,
                              keepalive_expiry=KEEPALIVE_EXPIRY_S)
        if url and url.startswith("http"):
            base = url
        else:
            self.socket_path = url.removeprefix("unix://") if url else str(self.paths.socket)
            base = "http://rollbox"
        default = httpx.AsyncHTTPTransport(uds=self.socket_path, limits=limits)
        # The same pool httpx makes, on plain asyncio sockets instead of anyio's (netbackend.py).
        default._pool = httpcore.AsyncConnectionPool(
            max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_IDLE,
            keepalive_expiry=KEEPALIVE_EXPIRY_S, uds=self.socket_path, network_backend=AsyncioBackend())
        # JSON requests to the local socket skip httpx (`_send_json`): its request and response
        # models cost about as much client CPU as the request itself. They go through a pool of
        # their own, O(1) per request where httpcore's is O(connections^2) (unixpool.py).
        self._pool: UnixPool | None = UnixPool(
            self.socket_path, max_connections=MAX_CONNECTIONS, max_idle=MAX_IDLE, keepalive_expiry=KEEPALIVE_EXPIRY_S,
            network_backend=AsyncioBackend()) if custom is None and self.socket_path else None
        self.base_url = url or f"unix://{self.paths.socket}"
        headers = {"user-agent": "rollbox-sdk"}
        token = token if token is not None else os.environ.get("ROLLBOX_TOKEN")
        if token:
            headers["authorization"] = f"Bearer {token.strip()}"
        self._headers = headers
        self._raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        self._http = httpx.AsyncClient(transport=default if custom is None else custom, base_url=base,
                                       timeout=httpx.Timeout(None, connect=10.0), headers=headers)
        self._checked = False

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- daemon start ------------------------------------------------------------------

    async def _ping(self) -> bool:
        if self._pool is not None:
            # On the connections the requests use (a daemon that answers one connection at a
            # time, like a stuck one, is then still reached).
            url = httpcore.URL(scheme=b"http", host=b"rollbox", port=None, target=b"/health")
            try:
                r = await self._pool.request(b"GET", url, headers=list(self._raw_headers), content=None,
                                             extensions=_PING_EXTENSIONS)
            except (httpcore.NetworkError, httpcore.TimeoutException, httpcore.ProtocolError):
                return False
            return r.status == 200
        try:
            resp = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        if resp.status_code == 401:
            try:
                raise errors.from_wire(resp.json(), 401)
            except ValueError:
                raise errors.Unauthorized(f"{self.base_url} refused the request (HTTP 401)") from None
        return resp.status_code == 200

    async def ensure_daemon(self) -> None:
        """Connects, starting the local daemon if needed. Raises DaemonUnavailable."""
        if self._checked or await self._ping():
            self._checked = True
            return
        if not self.autostart:
            raise errors.DaemonUnavailable(
                f"no rollbox daemon answers at {self.base_url}: start it with `rollbox serve` "
                "or unset ROLLBOX_URL to let the SDK start a local one")
        if os.geteuid() != 0:
            raise errors.DaemonUnavailable("no rollbox daemon is running and starting one needs root "
                                           "(gVisor, mounts, cgroups): run as root or start `sudo rollbox serve`")
        # Starting it blocks (a file lock shared with other processes, a child process): in a
        # worker thread, so the loop goes on serving other calls meanwhile.
        await asyncio.to_thread(self._start_daemon)
        self._checked = True

    def _sync_ping(self) -> bool:
        transport = httpx.HTTPTransport(uds=self.socket_path) if self.socket_path else httpx.HTTPTransport()
        base = "http://rollbox" if self.socket_path else self.base_url
        try:
            with httpx.Client(transport=transport, base_url=base, headers=self._headers) as c:
                return c.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _start_daemon(self) -> None:
        self.paths.home.mkdir(parents=True, exist_ok=True)
        with open(self.paths.home / "spawn.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._sync_ping():
                self._spawn_daemon()

    def _spawn_daemon(self) -> None:
        # A bad ROLLBOX_PLATFORM is the caller's configuration, not a daemon that may come back:
        # InvalidArgument naming the choices, before a daemon is started only to exit.
        platform_from_env()
        env = dict(os.environ, ROLLBOX_HOME=str(self.paths.home))
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        proc: subprocess.Popen[bytes] | None = None
        while time.monotonic() < deadline:
            if self._sync_ping():
                return
            held = daemon_running(self.paths)
            if proc is None or (proc.poll() is not None and not held):
                if proc is not None and proc.returncode not in (0, None) and not held and \
                        "already serves" not in self.paths.daemon_log.read_text(errors="replace")[-300:]:
                    tail = self.paths.daemon_log.read_text(errors="replace")[-1500:]
                    raise errors.DaemonUnavailable(f"the rollbox daemon exited at start (code {proc.returncode}); "
                                                   f"{self.paths.daemon_log}:\n{tail}")
                # (Re)start unless a daemon (perhaps one shutting down) still holds the lock.
                if not held:
                    with open(self.paths.daemon_log, "ab") as log:
                        proc = subprocess.Popen([sys.executable, "-m", "rollbox", "serve"], stdin=subprocess.DEVNULL,
                                                stdout=log, stderr=log, env=env, start_new_session=True,
                                                close_fds=True)
            time.sleep(0.05)
        raise errors.DaemonUnavailable(f"the rollbox daemon did not answer within {DAEMON_START_TIMEOUT_S:.0f} s; "
                                       f"see {self.paths.daemon_log}")

    # ---- errors ------------------------------------------------------------------------

    def _lost(self, what: str, e: Exception) -> errors.DaemonUnavailable:
        return errors.DaemonUnavailable(f"lost the rollbox daemon at {self.base_url} during {what}: {e}; "
                                        f"see {self.paths.daemon_log}")

    def _error(self, status: int, body: Any, what: str) -> errors.RollboxError:
        """The typed error of a failed answer. A 5xx without rollbox's error form did not come
        from a route (those always carry a code): the server around them failed the request,
        as uvicorn does for what is still running when the daemon stops or crashes."""
        if status == 422:
            path = what.split(" ", 1)[-1]  # "POST /sandboxes" -> "/sandboxes"
            return errors.InvalidArgument(f"invalid request to {path}: {validation_message(body)}")
        if status >= 500 and not (isinstance(body, dict) and body.get("code")):
            text = body.get("message") if isinstance(body, dict) else body
            return errors.DaemonUnavailable(f"the rollbox daemon at {self.base_url} failed {what} without an answer "
                                            f"(HTTP {status}: {str(text)[:200]}): it was stopping or crashing; "
                                            f"retry the call; see {self.paths.daemon_log}")
        return errors.from_wire(body if isinstance(body, dict) else {"message": str(body)}, status)

    async def _raise_for(self, resp: httpx.Response, what: str) -> None:
        if resp.status_code < 400:
            return
        try:
            body = _json.loads(await resp.aread())
        except ValueError:
            body = {"message": resp.text[:500]}
        raise self._error(resp.status_code, body, what)

    # ---- requests ----------------------------------------------------------------------

    async def request(self, method: str, path: str, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        """Sends one request; returns the decoded JSON body or raises the daemon's typed error."""
        await self.ensure_daemon()
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
        if self._pool is not None:
            return await self._send_json(method, path, content, params)
        try:
            try:
                resp = await self._http.request(method, path, content=content, headers=headers, params=params)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                # The request never reached a daemon (it crashed or restarted, or a saturated
                # host did not accept the connection in time): start or find the daemon and
                # send it again; nothing was done twice.
                self._checked = False
                await self.ensure_daemon()
                resp = await self._http.request(method, path, content=content, headers=headers, params=params)
        except UnicodeEncodeError:
            raise self._not_text(path) from None
        except httpx.TransportError as e:
            raise self._lost(f"{method} {path}", e) from e
        await self._raise_for(resp, f"{method} {path}")
        return self._decode(method, path, resp.status_code, resp.content)

    @staticmethod
    def _not_text(path: str) -> errors.InvalidArgument:
        return errors.InvalidArgument(f"{path!r} is not valid UTF-8: names and ids in a request path must be "
                                      "text (file paths go in the body)")

    @staticmethod
    def _decode(method: str, path: str, status: int, body: bytes) -> Any:
        try:
            return _json.loads(body)
        except ValueError:
            raise errors.ApiError(f"{method} {path}: the daemon answered HTTP {status} with a body that "
                                  "is not JSON (a wrong path?)") from None

    async def _send_json(self, method: str, path: str, content: bytes | None, params: dict[str, Any] | None) -> Any:
        """`request` on the unix socket's httpcore pool, without httpx's models. The same
        retry and error rules as the httpx path (a connect failure is resent once the daemon
        answers again; any other transport failure is DaemonUnavailable)."""
        assert self._pool is not None
        try:
            target = urllib.parse.quote(path, safe=_PATH_SAFE).encode("ascii")
        except UnicodeEncodeError:
            raise self._not_text(path) from None
        if params:
            pairs = [(k, _param(x)) for k, v in params.items() for x in (v if isinstance(v, (list, tuple)) else [v])]
            try:
                target += b"?" + urllib.parse.urlencode(pairs).encode("ascii")
            except UnicodeEncodeError:
                raise errors.InvalidArgument(f"a query parameter of {path!r} is not valid UTF-8") from None
        url = httpcore.URL(scheme=b"http", host=b"rollbox", port=None, target=target)
        headers = list(self._raw_headers)
        if content is not None:
            headers.append((b"content-type", b"application/json"))
        try:
            try:
                resp = await self._pool.request(method.encode(), url, headers=headers, content=content,
                                                extensions=_EXTENSIONS)
            except (httpcore.ConnectError, httpcore.ConnectTimeout):
                self._checked = False  # as in `request`: nothing reached a daemon
                await self.ensure_daemon()
                resp = await self._pool.request(method.encode(), url, headers=headers, content=content,
                                                extensions=_EXTENSIONS)
        except (httpcore.NetworkError, httpcore.TimeoutException, httpcore.ProtocolError) as e:
            raise self._lost(f"{method} {path}", e) from e
        if resp.status >= 400:
            try:
                body = _json.loads(resp.content)
            except ValueError:
                body = {"message": resp.content[:500].decode(errors="replace")}
            raise self._error(resp.status, body, f"{method} {path}")
        return self._decode(method, path, resp.status, resp.content)

    async def get_text(self, path: str) -> str:
        """GET a plain-text resource (e.g. /metrics); raises the daemon's typed error."""
        await self.ensure_daemon()
        try:
            resp = await self._http.get(path)
        except httpx.TransportError as e:
            raise self._lost(f"GET {path}", e) from e
        if resp.status_code >= 400:
            raise self._error(resp.status_code, {"message": resp.text[:500]}, f"GET {path}")
        return resp.text

    async def send_raw(self, method: str, path: str, content: bytes | Iterator[bytes] | AsyncIterator[bytes],
                       params: dict[str, Any] | None = None) -> Any:
        """Sends `content` (bytes, or an iterator of chunks, streamed; a blocking iterator is
        read in a worker thread) as the raw request body; returns the decoded JSON answer or
        raises the daemon's typed error. Not resent after a lost connection (a stream cannot be
        replayed): that is DaemonUnavailable."""
        await self.ensure_daemon()
        started = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal started
            started = True
            if isinstance(content, bytes):
                yield content
            elif isinstance(content, Iterator):
                end = b""
                while chunk := await asyncio.to_thread(next, content, end):
                    yield chunk
            else:
                async for chunk in content:
                    yield chunk
        headers = {"content-type": "application/octet-stream"}
        try:
            try:
                resp = await self._http.request(method, path, content=body(), params=params, headers=headers)
            except httpx.ConnectError:
                if started:
                    raise
                # No byte went out (the daemon crashed or restarted): find or start the next one.
                self._checked = False
                await self.ensure_daemon()
                resp = await self._http.request(method, path, content=body(), params=params, headers=headers)
        except httpx.TransportError as e:
            raise self._lost(f"{method} {path}", e) from e
        await self._raise_for(resp, f"{method} {path}")
        return resp.json()

    @contextlib.asynccontextmanager
    async def stream_raw(self, path: str, params: dict[str, Any] | None = None
                         ) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[bytes]]]:
        """GET whose raw answer body is read in chunks: yields (response, chunks). Raises the
        daemon's typed error before any chunk, DaemonUnavailable if the answer is cut short."""
        await self.ensure_daemon()
        try:
            await self._http.head("/health")  # reachable? (a crashed daemon: find or start the next one)
        except httpx.ConnectError:
            self._checked = False
            await self.ensure_daemon()
        except httpx.TransportError:
            pass
        try:
            async with self._http.stream("GET", path, params=params) as resp:
                await self._raise_for(resp, f"GET {path}")

                async def chunks() -> AsyncIterator[bytes]:
                    try:
                        async for chunk in resp.aiter_bytes():
                            yield chunk
                    except httpx.TransportError as e:
                        raise errors.DaemonUnavailable(f"the answer to GET {path} was cut short: {e}; the daemon or "
                                                       f"the sandbox stopped (see {self.paths.daemon_log})") from e
                yield resp, chunks()
        except httpx.TransportError as e:
            raise self._lost(f"GET {path}", e) from e

    async def stream_lines(self, path: str, params: dict[str, Any] | None = None) -> AsyncIterator[dict[str, Any]]:
        """GETs a chunked NDJSON resource and yields each line's object as it arrives (the
        connection closes when the iterator is closed). Raises the daemon's typed error for
        a failed answer or an {"error": ...} line, DaemonUnavailable when the connection is lost."""
        await self.ensure_daemon()
        try:
            async with self._http.stream("GET", path, params=params) as resp:
                await self._raise_for(resp, f"GET {path}")
                async for line in resp.aiter_lines():
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


__all__ = ["AsyncClient", "daemon_running", "validation_message"]
