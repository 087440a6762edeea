"""@function: remote calls, map over inputs, volumes shared with sandboxes, errors."""

from __future__ import annotations

import os
import sys
import time

import pytest

import rollbox
from rollbox import Sandbox, Volume, function
from rollbox.sdk.sandbox import default_client

VOL = Volume(name=f"fn-{os.getpid()}", mount_path="/ckpt")


@function(memory=256, volumes=[VOL], timeout=60)
def save_checkpoint(step: int) -> str:
    import os
    with open(f"/ckpt/step-{step}.txt", "w") as f:
        f.write(f"weights {step}")
    return f"{os.uname().nodename}:{step}"


@function(memory=256, timeout=60)
def square(x: int) -> int:
    return x * x


@function(memory=256, timeout=60)
def boom(x: int) -> int:
    raise ValueError(f"bad input {x}")


@function(memory=256, timeout=2)
def forever(x: int) -> int:
    while True:
        pass


def test_remote_and_map() -> None:
    assert square(3) == 9  # a plain call stays local
    assert square.remote(7) == 49
    assert list(square.map(range(6), max_concurrency=3)) == [0, 1, 4, 9, 16, 25]


@pytest.mark.parametrize("runtime", ["gvisor", "runc"])
def test_map_in_episode_containers_gh15(runtime: str) -> None:
    """isolation="container" (and runtime=, as SandboxPool's) on @function.map: each call in a
    fresh container of a pooled sandbox; a call's exception keeps its type there too."""
    assert list(square.map(range(6), max_concurrency=3, isolation="container", runtime=runtime)) == [0, 1, 4, 9, 16, 25]
    out = list(boom.map([1, 2], isolation="container", runtime=runtime, return_exceptions=True))
    assert [type(e) for e in out] == [ValueError, ValueError] and "bad input 2" in str(out[1])


def test_map_refuses_runc_without_containers_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sandbox() -> None:
        raise AssertionError("a sandbox was started for a map that must be refused")
    monkeypatch.setattr(square, "_sandbox", no_sandbox)
    with pytest.raises(rollbox.errors.InvalidArgument, match="isolation='container'"):
        list(square.map(range(2), runtime="runc"))
    with pytest.raises(rollbox.errors.InvalidArgument, match="runtime"):
        list(square.map(range(2), isolation="container", runtime="kata"))


def test_function_writes_a_volume_a_sandbox_reads() -> None:
    try:
        assert save_checkpoint.remote(5).endswith(":5")
        assert VOL.read_file("/step-5.txt") == b"weights 5"
        with Sandbox(memory=256, volumes=[VOL]).create() as sb:
            assert sb.exec("cat", "/ckpt/step-5.txt").stdout == b"weights 5"
    finally:
        VOL.delete()


class Unpicklable(Exception):
    def __reduce__(self):  # type: ignore[no-untyped-def]
        raise TypeError("not picklable")


@function(memory=256, timeout=60)
def boom_unpicklable(x: int) -> int:
    raise Unpicklable(f"odd {x}")


@function(memory=256, timeout=60)
def fails_on_multiples_of_7(x: int) -> int:
    if x % 7 == 0:
        raise KeyError(f"multiple of 7: {x}")
    return x + 1


def test_remote_exception_keeps_its_type_and_traceback() -> None:
    with pytest.raises(ValueError, match="bad input 4") as ei:
        boom.remote(4)
    assert "Traceback" in ei.value.remote_traceback and "bad input 4" in ei.value.remote_traceback
    assert any("remote traceback" in n for n in ei.value.__notes__)
    with pytest.raises(rollbox.FunctionError, match="odd 3") as fe:
        boom_unpicklable.remote(3)
    assert "Traceback" in fe.value.remote_traceback
    out = list(boom.map([1, 2], return_exceptions=True))
    assert [type(e) for e in out] == [ValueError, ValueError]


def test_timeout_kills_the_sandbox_with_a_typed_error() -> None:
    before = {s["sandbox_id"] for s in default_client().request("GET", "/sandboxes")}
    t = time.monotonic()
    with pytest.raises(rollbox.FunctionTimeout, match="timeout"):
        forever.remote(1)
    assert time.monotonic() - t < 30
    assert {s["sandbox_id"] for s in default_client().request("GET", "/sandboxes")} <= before


MAP_INPUTS = int(os.environ.get("ROLLBOX_MAP_INPUTS", "64"))


def test_map_inputs_in_order_and_first_failure_cancels() -> None:
    # MAP_INPUTS (default 64) keeps the suite short; ROLLBOX_MAP_INPUTS=200 is the size.
    out = list(fails_on_multiples_of_7.map(range(MAP_INPUTS), max_concurrency=4, return_exceptions=True))
    assert len(out) == MAP_INPUTS
    for x, r in enumerate(out):
        if x % 7 == 0:
            assert isinstance(r, KeyError) and str(x) in str(r)
        else:
            assert r == x + 1
    with pytest.raises(KeyError):
        list(fails_on_multiples_of_7.map(range(1, 60), max_concurrency=2))  # 7 fails early
    live = [s for s in default_client().request("GET", "/sandboxes")
            if s.get("tags", {}).get("rollbox.function") == "fails_on_multiples_of_7"]
    assert live == []  # the rest were cancelled and nothing was left running


def test_spawn_local_and_bad_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    call = square.spawn(9)
    assert square.local(5) == 25
    assert call.get(timeout=120) == 81 and call.done()
    with pytest.raises(rollbox.ResourceUnavailable, match="no NVIDIA GPU"):
        function(gpu="H100", memory=256)(lambda: 1).remote()
    with pytest.raises(rollbox.ResourceUnavailable):
        Sandbox(gpu="any", memory=256).create()
    with pytest.raises(rollbox.InvalidArgument):
        function(timeout=-1)
    monkeypatch.setattr(sys, "version_info", (3, 99, 0, "final", 0))
    with pytest.raises(rollbox.InvalidArgument, match="same minor version"):
        square.remote(2)
