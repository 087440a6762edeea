"""Pure logic of episode containers: which commands the warm interpreter takes, and how an
episode pool hands out and recycles its pooled sandboxes (the runtime boundary stubbed)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from rollbox import errors
from rollbox.sdk.pool import SandboxPool
from rollbox.server.episodes import EpisodePools

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "rollbox" / "runtime" / "agent"))
import warm_python  # noqa: E402

ENV = {"PATH": os.path.dirname(os.path.realpath(sys.executable)) + ":/usr/bin:/bin"}
PY = os.path.basename(sys.executable)


@pytest.mark.parametrize("argv, expected", [
    ([PY, "/w/p.py", "a"], ("f", "/w/p.py", ["a"], set())),
    ([PY, "-u", "-c", "print(1)", "x"], ("c", "print(1)", ["x"], {"u"})),
    ([PY, "-B", "-m", "json.tool"], ("m", "json.tool", [], {"B"})),
    ([sys.executable, "-uB", "p.py"], ("f", "p.py", [], {"u", "B"})),
])
def test_python_commands_the_warm_interpreter_takes(argv: list[str], expected: tuple[Any, ...]) -> None:
    assert warm_python.python_command(argv, ENV) == expected


@pytest.mark.parametrize("argv", [
    [PY],                        # interactive: reads stdin
    [PY, "-"],                   # script from stdin
    [PY, "-W", "error", "p.py"],  # options the real interpreter parses
    [PY, "-X", "dev", "p.py"],
    [PY, "-c"],                  # missing code
    ["sh", "-c", "python3 p.py"],
    ["/definitely/not/python3", "p.py"],
])
def test_other_commands_are_execed(argv: list[str]) -> None:
    assert warm_python.python_command(argv, ENV) is None


class FakeMeta:
    memory_mib = 512


class FakeService:
    """The façade methods EpisodePools uses; containers always made and destroyed cleanly
    unless `fail_create` is set."""

    def __init__(self) -> None:
        self.live: dict[str, Any] = {}
        self.restored = 0
        self.terminated: list[str] = []
        self.fail_create = False
        self.snapshots = self
        self.execfiles = self

    def meta(self, snapshot_id: str) -> FakeMeta:
        if snapshot_id != "sn-ok":
            raise errors.SnapshotNotFound(f"snapshot {snapshot_id} not found")
        return FakeMeta()

    async def acquire(self, snapshot_id: str, **_kw: Any) -> Any:
        self.restored += 1
        self.live[f"sb-{self.restored}"] = None
        return type("Info", (), {"sandbox_id": f"sb-{self.restored}"})()

    async def terminate(self, sandbox_id: str, reason: str = "") -> None:
        self.terminated.append(sandbox_id)
        self.live.pop(sandbox_id, None)

    def spawn(self, coro: Any) -> None:
        asyncio.ensure_future(coro)

    async def agent_request(self, sandbox_id: str, op: str, wait_s: float | None, **fields: Any) -> dict[str, Any]:
        if op == "container_create" and self.fail_create:
            raise errors.SandboxLost("agent gone", sandbox_id=sandbox_id)
        return {"ok": True}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_pool_spreads_recycles_and_closes_gh15() -> None:
    async def go() -> None:
        svc = FakeService()
        pools = EpisodePools(svc)  # type: ignore[arg-type]
        pid = pools.open("sn-ok", max_concurrency=4, episodes_per_sandbox=3)["pool_id"]
        a = await pools.begin(pid)
        b = await pools.begin(pid)
        c = await pools.begin(pid)
        # Two containers per pooled sandbox: the third episode gets a second sandbox.
        assert a["sandbox_id"] == b["sandbox_id"] != c["sandbox_id"] and svc.restored == 2
        await pools.end(pid, a["container_id"])
        await pools.end(pid, b["container_id"])
        d = await pools.begin(pid)
        await pools.end(pid, d["container_id"])  # its third episode: retired and terminated
        await asyncio.sleep(0)
        assert a["sandbox_id"] in svc.terminated
        # A timeout retires the pooled sandbox at once.
        await pools.end(pid, c["container_id"], status="timeout")
        await asyncio.sleep(0)
        assert c["sandbox_id"] in svc.terminated
        with pytest.raises(errors.ContainerNotFound):
            await pools.end(pid, c["container_id"])
        e = await pools.begin(pid)
        assert e["sandbox_id"] not in (a["sandbox_id"], c["sandbox_id"])
        await pools.close(pid)
        assert e["sandbox_id"] in svc.terminated
        with pytest.raises(errors.EpisodePoolNotFound):
            await pools.begin(pid)
    run(go())


def test_pooled_sandboxes_that_ended_are_not_handed_out() -> None:
    """A pool left idle past keep_warm_seconds finds its pooled sandboxes gone: the next
    episodes get fresh restores, not containers in sandboxes that no longer exist."""
    async def go() -> None:
        svc = FakeService()
        pools = EpisodePools(svc)  # type: ignore[arg-type]
        pid = pools.open("sn-ok", max_concurrency=4)["pool_id"]
        eps = [await pools.begin(pid) for _ in range(4)]
        for e in eps:
            await pools.end(pid, e["container_id"])
        assert svc.restored == 2
        svc.live.clear()  # both expired (or ran out of memory) while the pool sat idle
        again = [await pools.begin(pid) for _ in range(4)]
        assert {e["sandbox_id"] for e in again} == {"sb-3", "sb-4"} and svc.restored == 4
        assert {p["sandbox_id"] for p in pools.describe(pid)["sandboxes"]} == {"sb-3", "sb-4"}
    run(go())


def test_failed_container_is_retryable_and_retires_the_sandbox_gh15() -> None:
    async def go() -> None:
        svc = FakeService()
        pools = EpisodePools(svc)  # type: ignore[arg-type]
        pid = pools.open("sn-ok", max_concurrency=2)["pool_id"]
        svc.fail_create = True
        with pytest.raises(errors.SandboxLost) as ei:
            await pools.begin(pid)
        assert ei.value.retryable
        await asyncio.sleep(0)
        assert svc.terminated == ["sb-1"]
        svc.fail_create = False
        assert (await pools.begin(pid))["sandbox_id"] == "sb-2"
    run(go())


def test_bad_arguments_are_typed_gh15() -> None:
    pools = EpisodePools(FakeService())  # type: ignore[arg-type]
    with pytest.raises(errors.SnapshotNotFound):
        pools.open("sn-missing", max_concurrency=2)
    with pytest.raises(errors.InvalidArgument):
        pools.open("sn-ok", max_concurrency=2, root_mib=4096)
    with pytest.raises(errors.InvalidArgument):
        SandboxPool("sn-ok", isolation="vm")


def test_ends_carried_by_a_begin_free_their_slots_first() -> None:
    """A begin may carry earlier episodes' ends (one request fewer per episode): they are
    ended before the new container is placed, unknown ones skipped, retiring statuses kept."""
    async def go() -> None:
        svc = FakeService()
        pools = EpisodePools(svc)  # type: ignore[arg-type]
        pid = pools.open("sn-ok", max_concurrency=2, sandboxes=1, episodes_per_sandbox=100)["pool_id"]
        a = await pools.begin(pid)
        b = await pools.begin(pid)
        # Both slots of the one sandbox are taken: only ending `a` first lets `c` in at once.
        await pools.end_many(pid, [(a["container_id"], "ok"), ("ct-unknown", "ok")])
        c = await asyncio.wait_for(pools.begin(pid), 5)
        assert c["sandbox_id"] == a["sandbox_id"] and svc.restored == 1
        await pools.end_many(pid, [(b["container_id"], "timeout"), (c["container_id"], "ok")])
        await asyncio.sleep(0)
        assert a["sandbox_id"] in svc.terminated  # the timeout retired it
        await pools.close(pid)
    run(go())


def test_the_sdk_sends_an_episode_end_with_the_next_begin_or_on_its_own() -> None:
    """EpisodePoolClient: an `aend` rides on the next `abegin`'s request; with no begin coming
    it goes as its own DELETE after END_FLUSH_S; a begin that fails puts its ends back."""
    import httpx

    from rollbox.client.portal import PORTAL
    from rollbox.client.transport import Client
    from rollbox.sdk import containers

    sent: list[tuple[str, str, Any]] = []
    fail_next_begin = [False]
    old_daemon = [False]  # one that ignores `end` (and so answers no "ended")

    def handler(request: httpx.Request) -> httpx.Response:
        body = request.content and __import__("json").loads(request.content)
        sent.append((request.method, request.url.path, body or dict(request.url.params)))
        if request.url.path == "/health":
            return httpx.Response(200, json={"ok": True})
        if request.url.path == "/episode-pools":
            return httpx.Response(200, json={"pool_id": "ep-1"})
        if request.method == "POST" and request.url.path.endswith("/containers"):
            if fail_next_begin[0]:
                fail_next_begin[0] = False
                return httpx.Response(503, json={"code": "sandbox_lost", "message": "restore failed"})
            ended = {} if old_daemon[0] else {"ended": len((body or {}).get("end", []))}
            return httpx.Response(200, json={"sandbox_id": "sb-1", "container_id": f"ct-{len(sent)}", **ended})
        return httpx.Response(200, json={})

    client = Client("http://rollbox.test", transport=httpx.MockTransport(handler), autostart=False)
    pool = containers.EpisodePoolClient(client, "sn-x", max_concurrency=2)

    async def go() -> None:
        a = await pool.abegin()
        ending = asyncio.ensure_future(pool.aend(a.container_id, "ok"))
        await asyncio.sleep(0)
        b = await pool.abegin()  # carries a's end
        await asyncio.wait_for(ending, 1)
        assert sent[-1][2] == {"end": [{"container_id": a.container_id, "status": "ok"}]}
        n = len(sent)
        await asyncio.wait_for(pool.aend(b.container_id, "timeout"), 2)  # no begin: its own DELETE
        assert [(m, p) for m, p, _ in sent[n:]] == [("DELETE", f"/episode-pools/ep-1/containers/{b.container_id}")]
        assert sent[-1][2] == {"status": "timeout"}
        c = await pool.abegin()
        ending = asyncio.ensure_future(pool.aend(c.container_id, "ok"))
        await asyncio.sleep(0)
        fail_next_begin[0] = True
        with pytest.raises(errors.SandboxLost):
            await pool.abegin()
        await asyncio.wait_for(ending, 2)  # put back, then flushed on its own
        assert sent[-1][:2] == ("DELETE", f"/episode-pools/ep-1/containers/{c.container_id}")
        old_daemon[0] = True
        d = await pool.abegin()
        ending = asyncio.ensure_future(pool.aend(d.container_id, "ok"))
        await asyncio.sleep(0)
        await pool.abegin()  # carries d's end, which an older daemon drops
        await asyncio.wait_for(ending, 2)
        assert sent[-1][:2] == ("DELETE", f"/episode-pools/ep-1/containers/{d.container_id}")
    try:
        PORTAL.run(go())
    finally:
        pool.close()
        client.close()


def test_an_end_queued_while_a_flush_is_sending_is_sent_too() -> None:
    """An end queued while an earlier flush's DELETEs are still out is not left behind (it
    hung until some later begin: a pool's last episodes never ended)."""
    import httpx

    from rollbox.client.portal import PORTAL
    from rollbox.client.transport import Client
    from rollbox.sdk import containers

    deleted: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/episode-pools":
            return httpx.Response(200, json={"pool_id": "ep-1"})
        if request.method == "DELETE":
            await asyncio.sleep(0.3)  # the first flush is still out when the second end comes
            deleted.append(request.url.path.rsplit("/", 1)[-1])
        return httpx.Response(200, json={"ok": True})

    client = Client("http://rollbox.test", transport=httpx.MockTransport(handler), autostart=False)
    pool = containers.EpisodePoolClient(client, "sn-x", max_concurrency=2)

    async def go() -> None:
        first = asyncio.ensure_future(pool.aend("ct-a", "ok"))
        await asyncio.sleep(containers.END_FLUSH_S + 0.1)
        await asyncio.wait_for(asyncio.gather(first, pool.aend("ct-b", "ok")), 3)
    try:
        PORTAL.run(go())
        assert sorted(deleted) == ["ct-a", "ct-b"]
    finally:
        pool.close()
        client.close()


def test_a_begin_cancelled_in_flight_ends_the_container_the_daemon_still_makes() -> None:
    """Leaving `map` early cancels starting episodes: the daemon still makes their containers,
    and each must be ended, or its slot stays taken for the life of the pool (a later begin
    then waited 120 s for ResourceExhausted)."""
    import httpx

    from rollbox.client.portal import PORTAL
    from rollbox.client.transport import Client
    from rollbox.sdk import containers

    deleted: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/episode-pools":
            return httpx.Response(200, json={"pool_id": "ep-1"})
        if request.method == "POST" and request.url.path.endswith("/containers"):
            await asyncio.sleep(0.3)
            return httpx.Response(200, json={"sandbox_id": "sb-1", "container_id": "ct-late", "ended": 0})
        if request.method == "DELETE":
            deleted.append(request.url.path.rsplit("/", 1)[-1])
        return httpx.Response(200, json={"ok": True})

    client = Client("http://rollbox.test", transport=httpx.MockTransport(handler), autostart=False)
    pool = containers.EpisodePoolClient(client, "sn-x", max_concurrency=1)

    async def go() -> None:
        begin = asyncio.ensure_future(pool.abegin())
        await asyncio.sleep(0.05)
        begin.cancel()
        with pytest.raises(asyncio.CancelledError):
            await begin
        await asyncio.sleep(0.6)
    try:
        PORTAL.run(go())
        assert deleted == ["ct-late"]
    finally:
        pool.close()
        client.close()
