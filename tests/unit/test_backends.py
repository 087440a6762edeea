"""The SDK's backend plug-in point (rollbox.sdk.backends): a backend registered by name gets
the pool's spec and runs its episodes; the SDK never imports the backend's package."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

import rollbox
from rollbox.client.transport import Client
from rollbox.sdk import backends
from rollbox.sdk.backends import LOCAL, PoolSpec, register_backend, resolve_backend, set_default_backend
from rollbox.types import EpisodeResult

SNAP = "sn-" + "0" * 24


class InlineRemote:
    """A PoolBackend that runs each episode here, with `None` as its sandbox."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.closed = False
        self.deleted: list[str] = []

    def map(self, fn: Any, tasks: Iterable[Any], *, timeout: float | None, retries: int, ordered: bool,
            progress: bool | None) -> Iterator[EpisodeResult]:
        for i, t in enumerate(tasks):
            v = fn(None, t)
            yield EpisodeResult(index=i, status="ok", value=v, reward=float(v), attempts=1, sandbox_id=None,
                                wall_s=0.0, error=None, ttfc_ms=None)

    def close(self) -> None:
        self.closed = True

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.deleted.append(snapshot_id)


class Inline:
    def __init__(self) -> None:
        self.pools: list[InlineRemote] = []

    def open_pool(self, spec: PoolSpec) -> InlineRemote:
        self.pools.append(InlineRemote(spec))
        return self.pools[-1]

    def call_function(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return ("inline", fn.fn(*args, **kwargs))


@pytest.fixture
def inline() -> Iterator[Inline]:
    b = Inline()
    register_backend("inline-test", b)
    yield b
    set_default_backend(None)
    backends._registry.pop("inline-test", None)


def test_a_registered_backend_runs_the_pool_with_its_spec(inline: Inline) -> None:
    client = Client(autostart=False)
    with rollbox.SandboxPool(SNAP, max_concurrency=3, warm=2, client=client, backend="inline-test") as pool:
        out = list(pool.map(lambda sb, t: t * 2, [1, 2, 3], ordered=True, progress=False))
    assert [r.value for r in out] == [2, 4, 6]
    (remote,) = inline.pools
    assert remote.closed
    assert remote.spec == PoolSpec(pool.pool_id, SNAP, 3, 600, 2, 300.0, client)


def test_the_default_backend_is_local_until_set(inline: Inline) -> None:
    assert resolve_backend(None) == LOCAL
    set_default_backend("inline-test")
    assert resolve_backend(None) == "inline-test"
    fn = rollbox.function(lambda x: x + 1)
    assert fn.remote(41) == ("inline", 42)
    set_default_backend(None)
    assert resolve_backend(None) == LOCAL


def test_bad_backend_names_are_refused() -> None:
    with pytest.raises(rollbox.InvalidArgument, match="backend='nowhere' must be one of 'local'"):
        resolve_backend("nowhere")
    with pytest.raises(rollbox.InvalidArgument, match="reserved"):
        register_backend(LOCAL, Inline())
    with pytest.raises(rollbox.InvalidArgument):
        set_default_backend("nowhere")


def test_ray_registers_itself_without_importing_ray_or_the_sdk_importing_it() -> None:
    code = ("import sys, rollbox.sdk.backends as b; assert 'ray' in b._registry; "
            "assert 'ray' not in sys.modules, 'importing rollbox imported ray'; "
            "import rollbox.sdk.pool, rollbox.sdk.function; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
