"""SandboxPool over real sandboxes: fresh sandbox per episode, statuses, retries."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

import rollbox
from rollbox import Sandbox, SandboxPool


@pytest.fixture(scope="module")
def snapshot_id():  # type: ignore[no-untyped-def]
    sb = Sandbox(memory=384).create()
    try:
        sb.exec("mkdir", "-p", "/work")
        snap = sb.snapshot_memory()
    finally:
        sb.terminate()
    yield snap
    rollbox.sdk.sandbox.default_client().request("DELETE", f"/snapshots/{snap}")


def episode(sb, task):  # type: ignore[no-untyped-def]
    leak = sb.exec("test", "-e", "/work/leak").exit_code == 0
    if task == "leak":
        sb.exec("touch", "/work/leak")
    if task == "loop":
        sb.exec("python3", "-c", "while True: pass", timeout=1)
    if task == "raise":
        raise ValueError("episode code failed")
    if task == "oom":
        sb.exec("python3", "-c", "x = bytearray(2 * 1024**3)", timeout=30)
    return 0.0 if leak else 1.0


def test_map_statuses_and_fresh_sandboxes(snapshot_id) -> None:
    tasks = ["ok", "leak", "ok", "loop", "raise", "oom", "ok", "ok"]
    with SandboxPool(snapshot_id, max_concurrency=4) as pool:
        results = list(pool.map(episode, tasks, timeout=60, retries=1, ordered=True, progress=False))
    assert [r.index for r in results] == list(range(len(tasks)))
    status = [r.status for r in results]
    assert status == ["ok", "ok", "ok", "timeout", "error", "oom", "ok", "ok"]
    assert [r.reward for r in results] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # no leak seen
    assert len({r.sandbox_id for r in results}) == len(tasks)


def test_episode_timeout_is_zero_reward(snapshot_id) -> None:
    def slow(sb, task):  # type: ignore[no-untyped-def]
        sb.exec("sleep", "30")
        return 1.0

    with SandboxPool(snapshot_id, max_concurrency=2) as pool:
        (res,) = list(pool.map(slow, [0], timeout=1, progress=False))
    assert res.status == "timeout" and res.reward == 0.0 and res.wall_s < 10


def test_infra_error_is_retried_then_reported(snapshot_id) -> None:
    calls = []

    def flaky(sb, task):  # type: ignore[no-untyped-def]
        calls.append(sb.sandbox_id)
        if len(calls) == 1:
            # The platform loses the sandbox under the episode: its gVisor kernel is killed.
            cid = sb.sandbox_id.removeprefix("sb-")
            out = subprocess.run(["pgrep", "-f", f"runsc-sandbox .*{cid}"], capture_output=True, text=True)
            for pid in out.stdout.split():
                os.kill(int(pid), signal.SIGKILL)
            sb.exec("true")
        return 1.0

    with SandboxPool(snapshot_id, max_concurrency=1) as pool:
        (res,) = list(pool.map(flaky, [0], timeout=30, retries=1, progress=False))
    assert res.status == "ok" and res.attempts == 2 and res.reward == 1.0


def test_bad_snapshot_id_raises() -> None:
    with SandboxPool("sn-" + "f" * 24, max_concurrency=1) as pool:
        with pytest.raises(rollbox.SnapshotNotFound):
            list(pool.map(lambda sb, t: 1, [0], progress=False))
