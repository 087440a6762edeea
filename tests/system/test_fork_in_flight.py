"""gh-19: a fork (any `runsc checkpoint` of a live sandbox) while a large streamed transfer is in
flight. A frame cut in two by the checkpoint used to garble the agent channel (the sandbox was
ended as `channel_corrupted`, the source included); the daemon now quiesces the channel first
(runtime/channel.py `quiesced`). The copies and the source must all answer afterwards."""

from __future__ import annotations

import asyncio
import hashlib
import os

from rollbox import SandboxInstance

SIZE = 16 << 20  # four 4 MiB parts (file_routes.CHUNK): frames of ~5.6 MB each way
STREAMS = 3  # transfers at once: the channel is mid-frame nearly all the time
ROUNDS = 2


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _fork_during(sb: SandboxInstance, transfer, rounds: int = ROUNDS) -> list[SandboxInstance]:  # type: ignore[no-untyped-def]
    """Forks `sb` (one copy) `rounds` times, each while STREAMS loops of `transfer(i)` run."""
    kids: list[SandboxInstance] = []
    for _ in range(rounds):
        stop = asyncio.Event()

        async def loop(i: int, stop: asyncio.Event = stop) -> int:
            n = 0
            while not stop.is_set():
                await transfer(i)
                n += 1
            return n

        loops = [asyncio.ensure_future(loop(i)) for i in range(STREAMS)]
        await asyncio.sleep(0.5)  # under way
        try:
            kids += await sb.fork.aio(1)
        finally:
            stop.set()
            done = await asyncio.gather(*loops)  # every transfer of the source came back whole
        assert all(done), done
    return kids


def _check(sb: SandboxInstance, path: str, digest: str) -> None:
    """`sb` answers exec and file requests, and `path` holds the expected bytes."""
    r = sb.exec("sh", "-c", f"sha256sum {path} | cut -c1-64")
    assert (r.exit_code, r.stdout.decode().strip()) == (0, digest), (sb.sandbox_id, r)
    data = os.urandom(3 << 20)
    sb.fs.write_file("/work/after", data)
    assert _sha(sb.fs.read_file("/work/after")) == _sha(data)


def test_fork_during_streamed_read_gh19(make_sandbox) -> None:
    sb = make_sandbox(memory=512, disk=512)
    data = os.urandom(SIZE)
    digest = _sha(data)
    sb.fs.write_file("/work/big", data)

    async def read(_i: int) -> None:
        assert _sha(await sb.fs.read_file.aio("/work/big")) == digest

    kids = asyncio.run(_fork_during(sb, read))
    try:
        for s in [sb, *kids]:
            _check(s, "/work/big", digest)
    finally:
        for k in kids:
            k.terminate()


def test_fork_during_streamed_write_gh19(make_sandbox) -> None:
    sb = make_sandbox(memory=512, disk=512)
    data = os.urandom(SIZE)
    digest = _sha(data)

    async def write(i: int) -> None:
        await sb.fs.write_file.aio(f"/work/up{i}", data)

    kids = asyncio.run(_fork_during(sb, write))
    try:
        for s in [sb, *kids]:
            # An upload cut by the fork is absent from the copy, or whole (the last part
            # renames it into place): never partial. (The copy keeps the hidden part file.)
            names = " ".join(f"/work/up{i}" for i in range(STREAMS))
            r = s.exec("sh", "-c", f"for f in {names}; do [ -f $f ] && sha256sum $f | cut -c1-64; done; true")
            assert set(r.stdout.decode().split()) <= {digest}, (s.sandbox_id, r)
            s.fs.write_file("/work/big", data)
            _check(s, "/work/big", digest)
    finally:
        for k in kids:
            k.terminate()
