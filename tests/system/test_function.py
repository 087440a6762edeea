"""@function: remote calls, map over inputs, volumes shared with sandboxes, errors."""

from __future__ import annotations

import os
import time

import pytest

import rollbox
from rollbox import Sandbox, Volume, function

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


def test_function_writes_a_volume_a_sandbox_reads() -> None:
    try:
        assert save_checkpoint.remote(5).endswith(":5")
        assert VOL.read_file("/step-5.txt") == b"weights 5"
        with Sandbox(memory=256, volumes=[VOL]).create() as sb:
            assert sb.exec("cat", "/ckpt/step-5.txt").stdout == b"weights 5"
    finally:
        VOL.delete()


def test_errors_and_timeouts() -> None:
    with pytest.raises(rollbox.FunctionError, match="bad input 4") as ei:
        boom.remote(4)
    assert isinstance(ei.value.__cause__, ValueError) and "Traceback" in ei.value.remote_traceback
    out = list(boom.map([1, 2], return_exceptions=True))
    assert all(isinstance(e, rollbox.FunctionError) for e in out)
    t = time.monotonic()
    with pytest.raises(rollbox.SandboxTerminated, match="timeout"):
        forever.remote(1)
    assert time.monotonic() - t < 30
    with pytest.raises(rollbox.InvalidArgument):
        function(gpu="H100")
