"""The SDK's one async implementation (gh-18): blocking calls and `.aio` calls run the same
coroutine on the SDK's event loop over httpx's async client; cancellation reaches the request;
a cancelled call that owns something releases it; a forked child gets a loop of its own.
Against a stub daemon (httpx.MockTransport), no root."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox.client.portal import PORTAL
from rollbox.client.transport import Client
from rollbox.config import Paths
from rollbox.sdk._aio import cleaning, synchronized
from rollbox.sdk.sandbox import SandboxInstance

SB = "sb-" + "0" * 24


def _client(tmp_path: Path, handler: Any) -> Client:
    c = Client(paths=Paths(tmp_path), autostart=False, transport=httpx.MockTransport(handler))
    c.aio._checked = True  # the stub is "up"
    return c


def _exec_answer(stdout: str) -> dict[str, Any]:
    return {"exit_code": 0, "stdout": stdout, "stderr": "", "timed_out": False, "truncated": False,
            "duration_s": 0.0, "oom_killed": False}


def test_blocking_and_awaitable_calls_run_one_coroutine_on_the_sdk_loop(tmp_path: Path) -> None:
    threads: list[str] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        threads.append(threading.current_thread().name)
        return httpx.Response(200, json=_exec_answer("aGk="))  # "hi"

    sb = SandboxInstance(SB, _client(tmp_path, handler))
    assert sb.exec("echo", "hi").stdout == b"hi"

    async def main() -> list[bytes]:
        results = await asyncio.gather(*(sb.exec.aio("echo", "hi") for _ in range(32)))
        return [r.stdout for r in results]

    before = {t.name for t in threading.enumerate()}
    assert asyncio.run(main()) == [b"hi"] * 32
    # Every request ran on the SDK's loop thread; 32 concurrent awaits took no worker threads.
    assert set(threads) == {"rollbox-sdk-loop"}
    assert not [t.name for t in threading.enumerate() if t.name not in before and t.name.startswith("rollbox-aio")]


def test_cancelling_an_awaited_call_cancels_its_request(tmp_path: Path) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return httpx.Response(200, json=_exec_answer(""))

    sb = SandboxInstance(SB, _client(tmp_path, handler))

    async def main() -> None:
        task = asyncio.ensure_future(sb.exec.aio("sleep", "30"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cancelled.wait(5), "the request on the SDK's loop was not cancelled"


class _Owner:
    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.released: list[str] = []
        self.gate = gate

    async def _release(self, thing: str) -> None:
        self.released.append(thing)

    @cleaning(lambda thing: _OWNER._release(thing))
    async def make(self, started: threading.Event) -> str:
        started.set()
        await asyncio.sleep(0.3)  # the daemon is making it
        return "made-1"

    @synchronized
    async def blocking_inside(self) -> None:
        self.make(threading.Event())  # a blocking call on the SDK's own loop: refused


_OWNER = _Owner()


def test_a_cancelled_call_that_owns_its_result_finishes_and_releases_it() -> None:
    started = threading.Event()

    async def main() -> None:
        task = asyncio.ensure_future(_OWNER.make.aio(started))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    PORTAL.drain(10)  # what the process does at exit
    assert _OWNER.released == ["made-1"]


def test_a_blocking_call_on_the_sdk_loop_is_refused_not_a_deadlock() -> None:
    with pytest.raises(RuntimeError, match="await the `.aio` form"):
        _OWNER.blocking_inside()


def test_streams_close_on_the_loop_when_left_early(tmp_path: Path) -> None:
    lines = b"".join(b'{"n": %d}\n' % i for i in range(100))

    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=lines)

    c = _client(tmp_path, handler)
    got = []
    for obj in c.stream_lines("/x"):
        got.append(obj["n"])
        if len(got) == 3:
            break
    assert got == [0, 1, 2]

    async def main() -> list[int]:
        return [o["n"] async for o in PORTAL.aiterate(c.aio.stream_lines("/x"))]

    assert asyncio.run(main()) == list(range(100))


def test_a_forked_child_runs_the_sdk_on_a_loop_of_its_own(tmp_path: Path) -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=_exec_answer("b2s="))  # "ok"

    sb = SandboxInstance(SB, _client(tmp_path, handler))
    assert sb.exec("true").stdout == b"ok"  # the parent's loop is running
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            sb._client.aio._checked = True
            os._exit(0 if sb.exec("true").stdout == b"ok" else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_cancelled_background_start_kills_the_process_it_started_gh18(tmp_path: Path) -> None:
    seen: list[str] = []
    started = threading.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        seen.append(f"{req.method} {req.url.path}")
        if req.url.path.endswith("/processes"):
            started.set()
            await asyncio.sleep(0.3)  # the agent is starting it
            return httpx.Response(200, json={"pid": 42})
        return httpx.Response(200, json={"killed": 1})

    sb = SandboxInstance(SB, _client(tmp_path, handler))

    async def main() -> None:
        task = asyncio.ensure_future(sb.process.exec.aio("sleep", "300"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    PORTAL.drain(10)
    assert seen == [f"POST /sandboxes/{SB}/processes", f"POST /sandboxes/{SB}/processes/42/kill"]


def test_a_connect_timeout_is_retried_like_a_refused_connection(tmp_path: Path) -> None:
    calls: list[str] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        if len(calls) == 1:
            raise httpx.ConnectTimeout("the host did not accept the connection in time", request=req)
        return httpx.Response(200, json=_exec_answer("b2s="))

    sb = SandboxInstance(SB, _client(tmp_path, handler))
    assert sb.exec("true").stdout == b"ok"
    assert calls == [f"/sandboxes/{SB}/exec", "/health", f"/sandboxes/{SB}/exec"]  # refused, probe, sent
