from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import rollbox.sdk.pool as pool_mod
from rollbox import errors
from rollbox.sdk.pool import SandboxPool, reward_of


# ---- reward_of -------------------------------------------------------------------------

@pytest.mark.parametrize("value,reward", [
    (True, 1.0), (False, 0.0), (1, 1.0), (0, 0.0), (0.25, 0.25), (-3, -3.0),
    ({"reward": 0.5, "extra": 1}, 0.5), ({"reward": True}, 1.0), ({"reward": {"reward": 2}}, 2.0),
    (None, None), ("1.0", None), ({"score": 1}, None), ([1], None), ({"reward": None}, None),
])
def test_reward_of(value, reward):
    got = reward_of(value)
    assert got == reward
    if reward is not None:
        assert isinstance(got, float)


# ---- SandboxPool with a stub Sandbox ---------------------------------------------------

class Twin:
    """A blocking fake with the SDK's awaitable `.aio` form (run in a thread: fakes block)."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __call__(self, *a: Any, **k: Any) -> Any:
        return self._fn(*a, **k)

    async def aio(self, *a: Any, **k: Any) -> Any:
        return await asyncio.to_thread(self._fn, *a, **k)


class FakeInstance:
    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.saw_timeout = False
        self.saw_oom = False
        self.terminated = threading.Event()
        self.terminate = Twin(self.terminated.set)


class FakeBackend:
    """What the fake Sandbox class does on create_from_memory_snapshot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: list[FakeInstance] = []
        self.calls = 0
        self.fail_first = 0          # raise SandboxLost for the first N creates
        self.fail_always = False
        self.raise_exc: BaseException | None = None
        self.kwargs: list[dict[str, Any]] = []
        self.snapshot_ids: list[str] = []

    def create(self, snapshot_id: str, kwargs: dict[str, Any]) -> FakeInstance:
        with self.lock:
            self.calls += 1
            n = self.calls
            self.kwargs.append(kwargs)
            self.snapshot_ids.append(snapshot_id)
            if self.raise_exc is not None:
                raise self.raise_exc
            if self.fail_always or n <= self.fail_first:
                raise errors.SandboxLost(f"restore {n} failed")
            inst = FakeInstance(f"sb-{n}")
            self.created.append(inst)
            return inst


class _AsyncSide:
    def __init__(self, client: "DummyClient") -> None:
        self._client = client

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        return self._client.request(method, path, **kw)


class DummyClient:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.aio = _AsyncSide(self)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        self.requests.append((method, path))
        return []


@pytest.fixture
def backend(monkeypatch):
    be = FakeBackend()

    class FakeSandbox:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.create_from_memory_snapshot = Twin(lambda snapshot_id: be.create(snapshot_id, self.kwargs))

    monkeypatch.setattr(pool_mod, "Sandbox", FakeSandbox)
    return be


@pytest.fixture
def client():
    return DummyClient()


def run(client, fn, tasks, **kw):
    with SandboxPool("sn-test", max_concurrency=kw.pop("max_concurrency", 4), client=client,
                     keep_warm_seconds=kw.pop("keep_warm_seconds", 600)) as pool:
        return list(pool.map(fn, tasks, progress=False, **kw))


def test_ok_with_reward(backend, client):
    res = run(client, lambda sb, t: {"reward": t, "sid": sb.sandbox_id}, [0.5])
    (r,) = res
    assert r.status == "ok"
    assert r.reward == 0.5
    assert r.value["reward"] == 0.5
    assert r.attempts == 1
    assert r.sandbox_id == r.value["sid"]
    assert r.error is None
    assert r.ttfc_ms is not None and r.ttfc_ms >= 0
    assert backend.snapshot_ids == ["sn-test"]
    assert backend.kwargs[0]["keep_warm_seconds"] == 600
    assert backend.kwargs[0]["client"] is client
    assert ("GET", "/snapshots") in client.requests
    # Every sandbox is terminated after its episode (the pool's close waits for teardown).
    assert all(i.terminated.is_set() for i in backend.created)


def test_ok_with_non_numeric_value_has_reward_none(backend, client):
    (r,) = run(client, lambda sb, t: "text", [1])
    assert r.status == "ok"
    assert r.value == "text"
    assert r.reward is None


def test_function_raising_is_error(backend, client):
    def fn(sb, t):
        raise ValueError("bad episode")

    (r,) = run(client, fn, [1])
    assert r.status == "error"
    assert r.reward == 0.0
    assert r.value is None
    assert r.attempts == 1
    assert "ValueError" in r.error and "bad episode" in r.error
    assert backend.created[0].terminated.is_set()


def test_episode_timeout(backend, client):
    def fn(sb, t):
        # Runs until the pool terminates the sandbox (as a real pending call would fail).
        sb.terminated.wait(30)
        return 1.0

    t0 = time.monotonic()
    (r,) = run(client, fn, [1], timeout=0.3)
    elapsed = time.monotonic() - t0
    assert r.status == "timeout"
    assert r.reward == 0.0
    assert r.value is None
    assert r.attempts == 1
    assert elapsed < 3.0, elapsed
    assert backend.created[0].terminated.is_set()


def test_saw_timeout_is_timeout(backend, client):
    def fn(sb, t):
        sb.saw_timeout = True
        return 1.0

    (r,) = run(client, fn, [1])
    assert r.status == "timeout"
    assert r.reward == 0.0


def test_saw_timeout_then_raise_is_timeout(backend, client):
    def fn(sb, t):
        sb.saw_timeout = True
        raise RuntimeError("after a timed-out exec")

    (r,) = run(client, fn, [1])
    assert r.status == "timeout"
    assert r.reward == 0.0


def test_saw_oom(backend, client):
    def fn(sb, t):
        sb.saw_oom = True
        raise errors.SandboxLost("died")  # the oom wins over the lost sandbox

    (r,) = run(client, fn, [1], retries=3)
    assert r.status == "oom"
    assert r.reward == 0.0
    assert r.attempts == 1


def test_saw_oom_with_value(backend, client):
    def fn(sb, t):
        sb.saw_oom = True
        return 1.0

    (r,) = run(client, fn, [1])
    assert r.status == "oom"
    assert r.reward == 0.0
    assert r.value is None


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_create_always_lost_is_infra_error(backend, client, retries):
    backend.fail_always = True
    called = []
    (r,) = run(client, lambda sb, t: called.append(t), [1], retries=retries)
    assert r.status == "infra_error"
    assert r.reward is None
    assert r.value is None
    assert r.attempts == retries + 1
    assert backend.calls == retries + 1
    assert r.sandbox_id is None
    assert "SandboxLost" in r.error
    assert called == []


def test_create_lost_once_then_ok(backend, client):
    backend.fail_first = 1
    (r,) = run(client, lambda sb, t: True, [1], retries=1)
    assert r.status == "ok"
    assert r.reward == 1.0
    assert r.attempts == 2
    assert r.sandbox_id == "sb-2"


def test_retryable_error_inside_episode_retries_on_fresh_sandbox(backend, client):
    seen = []

    def fn(sb, t):
        seen.append(sb.sandbox_id)
        if len(seen) == 1:
            raise errors.SandboxLost("lost mid-episode")
        return 0.75

    (r,) = run(client, fn, [1], retries=2)
    assert r.status == "ok"
    assert r.reward == 0.75
    assert r.attempts == 2
    assert seen == ["sb-1", "sb-2"]
    assert all(i.terminated.is_set() for i in backend.created)


def test_non_retryable_rollbox_error_is_error(backend, client):
    def fn(sb, t):
        raise errors.InvalidState("nope")

    (r,) = run(client, fn, [1], retries=2)
    assert r.status == "error"
    assert r.attempts == 1


def test_snapshot_not_found_propagates(backend, client):
    backend.raise_exc = errors.SnapshotNotFound("no such snapshot")
    with pytest.raises(errors.SnapshotNotFound):
        run(client, lambda sb, t: 1, [1, 2])


def test_negative_retries_rejected(backend, client):
    with pytest.raises(errors.InvalidArgument):
        run(client, lambda sb, t: 1, [1], retries=-1)


def test_bad_concurrency_rejected(client):
    with pytest.raises(errors.InvalidArgument):
        SandboxPool("sn", max_concurrency=0, client=client)


def test_ordered_yields_input_order(backend, client):
    # The episodes finish in this order (each waits for the one before it to have returned),
    # and the results still come out in input order.
    finish = [1, 5, 3, 4, 2, 0]
    go = {t: threading.Event() for t in finish}
    returned = {t: threading.Event() for t in finish}

    def fn(sb, t):
        assert go[t].wait(10)
        returned[t].set()
        return t

    def conduct():
        for t in finish:
            go[t].set()
            assert returned[t].wait(10)

    conductor = threading.Thread(target=conduct, daemon=True)
    conductor.start()
    res = run(client, fn, range(len(finish)), ordered=True, max_concurrency=len(finish))
    conductor.join(10)
    assert [r.index for r in res] == list(range(len(finish)))
    assert [r.value for r in res] == list(range(len(finish)))
    assert [r.reward for r in res] == [float(i) for i in range(len(finish))]


def test_unordered_yields_completion_order(backend, client):
    # One episode at a time is let finish, and the next only after its result was yielded.
    go = {t: threading.Event() for t in range(3)}

    def fn(sb, t):
        assert go[t].wait(10)
        return t

    with SandboxPool("sn-test", max_concurrency=3, client=client) as pool:
        it = pool.map(fn, range(3), ordered=False, progress=False)
        got = []
        for t in (1, 2, 0):
            go[t].set()
            got.append(next(it).index)
        assert list(it) == []
    assert got == [1, 2, 0]


def test_concurrency_bound(backend, client):
    live = [0]
    peak = [0]
    lock = threading.Lock()

    together = threading.Barrier(3)  # every episode waits for two others: 3 must run at once

    def fn(sb, t):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        together.wait(10)
        with lock:
            live[0] -= 1
        return 1

    res = run(client, fn, range(12), max_concurrency=3)
    assert len(res) == 12
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    assert peak[0] == 3
    assert len({r.sandbox_id for r in res}) == 12  # a sandbox is never reused


def test_empty_tasks(backend, client):
    assert run(client, lambda sb, t: 1, []) == []


# ---- streaming: submit / as_completed / elastic warm pool ---------------------------------

class RecordingClient(DummyClient):
    def __init__(self) -> None:
        super().__init__()
        self.warm_counts: list[int] = []

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if path.endswith("/warm") and method == "PUT":
            self.warm_counts.append(kw["json"]["count"])
        return super().request(method, path, **kw)


def test_submit_returns_at_once_and_streams(backend):
    client = RecordingClient()
    gate = threading.Event()

    def episode(sb, t):
        gate.wait(10)
        return t

    with SandboxPool("sn-test", max_concurrency=4, client=client, fn=episode, warm=3,
                     scale_down_after_s=0.1) as pool:
        t0 = time.monotonic()
        futs = [pool.submit(i) for i in range(10)]
        assert time.monotonic() - t0 < 1.0 and not any(f.done() for f in futs)
        assert pool.queue_depth() == 10
        deadline = time.monotonic() + 5
        while 3 not in client.warm_counts and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.warm_counts[0] >= 1 and max(client.warm_counts) == 3  # capped by warm=3
        gate.set()
        got = sorted(r.value for r in pool.as_completed(timeout=10))
        assert got == list(range(10))
        assert all(f.result().status == "ok" for f in futs)
        # A late submit is streamed by the next as_completed.
        late = pool.submit(99, fn=lambda sb, t: t + 1)
        assert [r.value for r in pool.as_completed(timeout=10)] == [100]
        assert late.result().value == 100
        deadline = time.monotonic() + 5
        while client.warm_counts[-1] != 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.warm_counts[-1] == 0  # scaled to zero once the queue drained
        assert pool.queue_depth() == 0
    assert len({i.sandbox_id for i in backend.created}) == 11  # a fresh sandbox per episode


def test_container_streaming_keeps_no_warm_spares(monkeypatch):
    """Container mode restores its pooled sandboxes on demand: streaming must not also ask
    the daemon for warm spares of the snapshot, which nothing would ever use."""
    made: list[FakeInstance] = []

    class FakeEpisodePool:
        def __init__(self, client: Any, snapshot_id: str, **kw: Any) -> None:
            pass

        def begin(self) -> FakeInstance:
            made.append(FakeInstance(f"sb-{len(made)}"))
            return made[-1]

        async def abegin(self) -> FakeInstance:
            return self.begin()

        def close(self) -> None:
            pass

    monkeypatch.setattr(pool_mod, "EpisodePoolClient", FakeEpisodePool)
    client = RecordingClient()
    with SandboxPool("sn-test", max_concurrency=4, client=client, fn=lambda sb, t: t * 2, isolation="container",
                     scale_down_after_s=0.05) as pool:
        futs = [pool.submit(i) for i in range(8)]
        assert sorted(f.result(timeout=10).value for f in futs) == [0, 2, 4, 6, 8, 10, 12, 14]
        time.sleep(0.5)  # the sizer's period is 0.2 s
    assert client.warm_counts == [] and len(made) == 8


def test_submit_errors(backend, client):
    pool = SandboxPool("sn-test", max_concurrency=2, client=client)
    with pytest.raises(errors.InvalidArgument, match="episode function"):
        pool.submit(1)
    with pytest.raises(errors.InvalidArgument, match="retries"):
        pool.submit(1, fn=lambda sb, t: t, retries=-1)
    assert list(pool.as_completed()) == []
    pool.close()
    with pytest.raises(errors.InvalidState, match="closed"):
        pool.submit(1, fn=lambda sb, t: t)


def test_submitted_infra_errors_are_results(backend, client):
    backend.fail_always = True
    with SandboxPool("sn-test", max_concurrency=2, client=client, fn=lambda sb, t: t) as pool:
        fut = pool.submit(1, retries=1)
        (res,) = list(pool.as_completed(timeout=10))
        assert res.status == "infra_error" and res.reward is None and res.attempts == 2
        assert fut.result() is res


def test_as_completed_timeout(backend, client):
    gate = threading.Event()
    with SandboxPool("sn-test", max_concurrency=1, client=client, fn=lambda sb, t: gate.wait(10)) as pool:
        pool.submit(1)
        with pytest.raises(TimeoutError, match="1 outstanding"):
            next(pool.as_completed(timeout=0.2))
        gate.set()


def test_an_attempt_that_ends_after_its_pool_closed_still_ends_its_sandbox(backend, client):
    """A Ray node's pool can be closed by the driver while one of its attempts still runs (on a
    restarted daemon, say): that attempt's sandbox was left alive ("cannot schedule new
    futures after shutdown"), to be found by the next batch."""
    pool = SandboxPool("sn-test", max_concurrency=2, client=client)
    release = threading.Event()
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(pool.attempt(lambda sb, task: release.wait(10), 1, 30)))
    t.start()
    while not backend.created:
        time.sleep(0.01)
    pool.close()
    release.set()
    t.join(10)
    assert out and out[0][0] == "ok"
    assert backend.created[0].terminated.wait(5)


def test_map_aio_awaits_a_coroutine_episode_on_the_calling_loop_gh18(backend, client):
    """An asyncio trainer's episode coroutine runs on its own loop (where its LLM client and
    queues live), concurrently, without a thread per episode; one past `timeout` is cancelled."""
    cancelled: list[int] = []

    async def main() -> list[Any]:
        caller = asyncio.get_running_loop()

        async def episode(sb: Any, t: int) -> int:
            assert asyncio.get_running_loop() is caller
            assert threading.current_thread() is threading.main_thread()
            try:
                await asyncio.sleep(30 if t == 3 else 0.05)
            except asyncio.CancelledError:
                cancelled.append(t)
                raise
            return t * 10

        with SandboxPool("sn-test", max_concurrency=8, client=client) as pool:
            return [r async for r in pool.map.aio(episode, range(6), timeout=1.0, ordered=True, progress=False)]

    results = asyncio.run(main())
    assert [r.status for r in results] == ["ok", "ok", "ok", "timeout", "ok", "ok"]
    assert [r.value for r in results] == [0, 10, 20, None, 40, 50]
    assert cancelled == [3]
    assert all(sb.terminated.wait(5) for sb in backend.created)


def test_blocking_map_runs_a_coroutine_episode_too(backend, client):
    async def episode(sb: Any, t: int) -> bool:
        await asyncio.sleep(0)
        return t % 2 == 0

    assert [r.reward for r in run(client, episode, range(4), ordered=True)] == [1.0, 0.0, 1.0, 0.0]


def test_leaving_map_aio_early_cancels_its_coroutine_episodes_only_gh18(backend, client):
    """Breaking out of one map cancels that map's coroutine episodes (their sandboxes end);
    another map on the same pool runs on untouched."""
    finished: list[str] = []

    async def slow(sb: Any, t: str) -> str:
        await asyncio.sleep(0.05 if t == "b0" else 1.0)
        finished.append(t)
        return t

    async def main() -> list[Any]:
        with SandboxPool("sn-test", max_concurrency=8, client=client) as pool:
            async def map_a() -> list[Any]:
                return [r async for r in pool.map.aio(slow, ["a1", "a2"], progress=False, ordered=True)]

            a = asyncio.ensure_future(map_a())
            await asyncio.sleep(0.2)
            async for _r in pool.map.aio(slow, ["b0", "b1", "b2"], progress=False):
                break
            return await a

    results = asyncio.run(main())
    assert [(r.status, r.value) for r in results] == [("ok", "a1"), ("ok", "a2")]
    assert sorted(finished) == ["a1", "a2", "b0"]  # b1 and b2 were cancelled, never finished


def test_warm_with_container_isolation_warns_that_it_has_no_effect() -> None:
    """New-user trial: `warm` was silently ignored in container mode."""
    import warnings as w

    from rollbox import SandboxPool

    with w.catch_warnings(record=True) as seen:
        w.simplefilter("always")
        SandboxPool("sn-" + "0" * 24, isolation="container", warm=4, client=object())  # type: ignore[arg-type]
    assert any("no effect with isolation='container'" in str(x.message) for x in seen)


def test_a_whole_pooled_sandbox_oom_is_retried_not_scored_against_the_episode() -> None:
    """Break-it trial: a neighbour filled gVisor's kernel memory and the pooled sandbox died;
    the innocent episode's exec came back exit 137 `oom_killed` and was scored `oom`, 0. In a
    shared (container-mode) sandbox that is an infra_error, retried; a sandbox of its own
    (isolation="sandbox") still scores `oom`."""
    from types import SimpleNamespace

    from rollbox.sdk.pool import SandboxPool

    shared = SimpleNamespace(saw_sandbox_oom=True, saw_oom=True, saw_timeout=False, shares_sandbox=True)
    own = SimpleNamespace(saw_sandbox_oom=True, saw_oom=True, saw_timeout=False)
    status, _v, why, _sb, _t, retry = SandboxPool._classify(shared, {"value": 0.0}, True, 10.0, 1.0)  # type: ignore[arg-type]
    assert (status, retry) == ("infra_error", True) and "as a whole" in (why or "")
    status, _v, _why, _sb, _t, retry = SandboxPool._classify(own, {"value": 0.0}, True, 10.0, 1.0)  # type: ignore[arg-type]
    assert (status, retry) == ("oom", False)
