"""The awaitable SDK (gh-18): one async implementation on the SDK's event loop, cancellation
that cleans up, async streams of pool episodes and coroutine episodes awaited on the caller's
loop. Real gVisor sandboxes."""

from __future__ import annotations

import asyncio
import time

import rollbox
from rollbox.sdk.sandbox import default_client


def _live_tagged(tag: str) -> list[str]:
    rows = default_client().request("GET", "/sandboxes")
    return [r["sandbox_id"] for r in rows if r.get("tags", {}).get("aio-test") == tag]


def test_cancelled_create_leaves_no_sandbox() -> None:
    tag = f"cancel-{time.monotonic_ns()}"

    async def main() -> None:
        task = asyncio.ensure_future(rollbox.Sandbox(memory=256, tags={"aio-test": tag}).create.aio())
        await asyncio.sleep(0.05)  # the create is under way on the SDK's loop
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    deadline = time.monotonic() + 60
    while _live_tagged(tag):  # the boot finishes in its thread, then the cleanup ends it
        assert time.monotonic() < deadline, f"a cancelled create left {_live_tagged(tag)}"
        time.sleep(0.3)


def episode(sb: rollbox.SandboxInstance, n: int) -> float:
    return float(sb.exec("sh", "-c", f"echo $(({n}*2))").stdout.strip())


def test_pool_map_aio_streams_and_breaking_out_ends_the_episodes() -> None:
    src = rollbox.Sandbox(memory=256).create()
    snap = src.snapshot_memory()
    src.terminate()

    async def broken() -> None:
        with rollbox.SandboxPool(snap, max_concurrency=3) as pool:
            async for _res in pool.map.aio(episode, range(3)):
                break  # leaving early closes the blocking map, which ends what it started

    try:
        async def first() -> list[float]:
            with rollbox.SandboxPool(snap, max_concurrency=3) as pool:
                return sorted([r.reward async for r in pool.map.aio(episode, range(6))])  # type: ignore[misc]

        rewards = asyncio.run(first())
        assert rewards == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        asyncio.run(broken())
        deadline = time.monotonic() + 30
        while [r for r in default_client().request("GET", "/sandboxes") if r.get("snapshot_id") == snap]:
            assert time.monotonic() < deadline, "a pool map left early kept its sandboxes"
            time.sleep(0.3)
    finally:
        default_client().request("DELETE", f"/snapshots/{snap}")


def test_coroutine_episodes_run_concurrently_on_the_callers_loop() -> None:
    src = rollbox.Sandbox(memory=256).create()
    snap = src.snapshot_memory()
    src.terminate()
    loops: set[int] = set()

    async def episode(sb: rollbox.SandboxInstance, n: int) -> float:
        loops.add(id(asyncio.get_running_loop()))
        r = await sb.exec.aio("sh", "-c", f"echo $(({n}*3))")
        await sb.fs.write_file.aio("/tmp/n", str(n))
        return float(r.stdout.strip()) + float(await sb.fs.read_file.aio("/tmp/n")) / 100

    async def main() -> tuple[list[float | None], int]:
        async with rollbox.SandboxPool(snap, max_concurrency=4, isolation="container") as pool:
            rewards = sorted([r.reward async for r in pool.map.aio(episode, range(8), progress=False)],
                             key=lambda x: -1 if x is None else x)
            return rewards, id(asyncio.get_running_loop())

    try:
        rewards, caller = asyncio.run(main())
        assert rewards == [n * 3 + n / 100 for n in range(8)]
        assert loops == {caller}
    finally:
        default_client().request("DELETE", f"/snapshots/{snap}")
