"""SandboxService's lifecycle logic, driven through its public methods with the runtime
boundary stubbed: a fake runtime driver (run/restore/checkpoint/delete), a fake agent channel,
no mounts and a one-layer fake image. No root, no gVisor; the real-runsc tier
(tests/system) stays the judge of behaviour on the host."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollbox import errors
from rollbox.config import Paths
from rollbox.images.store import ImageConfig
from rollbox.runtime.driver import RunResult
from rollbox.server import boot, watchdog
from rollbox.server.lifecycle import IllegalTransition, SandboxState
from rollbox.server.service import SandboxService
from rollbox.server.store import Store

S = SandboxState
IMAGE = "im-fake"
# What the channels and the driver did, in order (cleared by the `host` fixture).
TRACE: list[str] = []


class FakeChannel:
    """Stands in for the agent channel: answers every request at once, in memory."""

    def __init__(self, sandbox_id: str, fifo_in: Path, fifo_out: Path, key: bytes = b"") -> None:
        self.sandbox_id = sandbox_id
        self.closed_reason: str | None = None
        self.corrupted = False
        self.on_lost: Any = None
        self.ops: list[str] = []

    def open(self) -> None:
        pass

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        return {"event": "ready"}

    async def request(self, op: str, wait_s: float | None = 30.0, **fields: Any) -> dict[str, Any]:
        if self.closed_reason is not None:
            raise errors.SandboxLost(f"channel closed: {self.closed_reason}", sandbox_id=self.sandbox_id)
        self.ops.append(op)
        if op == "exec":
            return {"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False, "truncated": False,
                    "duration_s": 0.0}
        return {}

    @contextlib.asynccontextmanager
    async def quiesced(self, hold_s: float) -> AsyncIterator[str]:
        TRACE.append("quiesce")
        yield "held"
        TRACE.append("resume")

    def resume_restored(self) -> None:
        TRACE.append("resume_restored")

    def fail(self, reason: str) -> None:
        self.closed_reason = self.closed_reason or reason

    def close(self, reason: str = "the sandbox was terminated") -> None:
        self.closed_reason = self.closed_reason or reason


class FakeDriver:
    """Both runtimes at once: containers are names in a set."""

    name = "fake"
    supports_snapshots = True
    platform = "systrap"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.containers: set[str] = set()
        self.verbs: list[str] = []

    @staticmethod
    def bundle_spec(spec: dict[str, Any]) -> dict[str, Any]:
        return spec

    def check(self) -> None:
        pass

    async def start_detached(self, verb: str, container_id: str, bundle: Path, **_kw: Any) -> RunResult:
        self.verbs.append(verb)
        self.containers.add(container_id)
        return RunResult(0, b"", b"")

    async def checkpoint(self, container_id: str, image_path: Path, *, leave_running: bool) -> RunResult:
        self.verbs.append("checkpoint")
        TRACE.append("checkpoint")
        (image_path / "checkpoint.img").write_bytes(b"state")
        if not leave_running:
            self.containers.discard(container_id)
        return RunResult(0, b"", b"")

    async def delete(self, container_id: str) -> RunResult:
        if container_id not in self.containers:
            return RunResult(1, b"", b"container does not exist")
        self.containers.discard(container_id)
        return RunResult(0, b"", b"")

    def forget(self, container_id: str) -> None:
        self.containers.discard(container_id)

    def known(self, container_id: str) -> bool:
        return container_id in self.containers

    async def list_ids(self) -> list[str]:
        return sorted(self.containers)

    def processes(self, container_id: str) -> list[tuple[int, str]]:
        return []


class FakeImages:
    def __init__(self, lower: Path) -> None:
        self.lower = lower

    def layers(self, image_id: str) -> list[Path]:
        if image_id != IMAGE:
            raise errors.ImageNotFound(f"image {image_id} not found")
        return [self.lower]

    def meta(self, image_id: str) -> SimpleNamespace:
        self.layers(image_id)
        return SimpleNamespace(image_id=image_id, image_config=ImageConfig())

    def remove_staging(self) -> None:
        pass


class Host(SimpleNamespace):
    paths: Paths
    store: Store
    driver: FakeDriver
    images: FakeImages


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    agent = tmp_path / "agent-src"
    agent.mkdir()
    (agent / "agent.py").write_text("# stands in for the agent\n")
    lower = tmp_path / "layer"
    (lower / "etc").mkdir(parents=True)
    monkeypatch.setenv("ROLLBOX_AGENT_DIR", str(agent))
    monkeypatch.setattr(boot, "AgentChannel", FakeChannel)
    monkeypatch.setattr(watchdog, "AgentChannel", FakeChannel)
    TRACE.clear()
    monkeypatch.setattr(boot, "mount_overlay", lambda lowers, upper, work, target: target.mkdir())
    paths = Paths(tmp_path / "home")
    paths.ensure()
    h = Host(paths=paths, store=Store(paths.db), driver=FakeDriver(paths.runc_root), images=FakeImages(lower))
    try:
        yield h
    finally:
        h.store.close()


def row(h: Host, sid: str) -> sqlite3.Row:
    r = h.store.get_row(sid)
    assert r is not None
    return r


def service(h: Host) -> SandboxService:
    svc = SandboxService(h.paths, h.driver, h.store, runc=h.driver)  # type: ignore[arg-type]
    svc.images = svc.ctx.images = h.images  # type: ignore[assignment]

    async def no_network(_keep: object) -> int:
        return 0
    svc.net.recover = no_network  # type: ignore[method-assign,assignment]
    return svc


def test_create_pause_resume_terminate(host: Host) -> None:
    async def main() -> None:
        svc = service(host)
        sid = (await svc.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        assert host.store.state(sid) is S.RUNNING and svc.is_live(sid)
        assert (await svc.exec(sid, ["true"]))["exit_code"] == 0

        snap = await svc.pause(sid)
        r = row(host, sid)
        assert (r["state"], r["paused_snapshot_id"]) == ("paused", snap)
        assert not svc.is_live(sid) and not host.driver.containers
        assert not svc.sandbox_dir(sid).exists()  # the host holds nothing of a paused sandbox
        assert svc.snapshot_in_use(snap) is not None
        with pytest.raises(errors.RollboxError):  # refused: it is not running
            await svc.pause(sid)
        assert host.store.state(sid) is S.PAUSED

        info = await svc.resume(sid)
        assert info.state == "running" and svc.is_live(sid) and host.store.state(sid) is S.RUNNING
        assert host.driver.verbs == ["run", "checkpoint", "restore"]
        # gh-19: checkpointed with the channel quiesced; the restored agent's output released.
        assert TRACE == ["quiesce", "checkpoint", "resume", "resume_restored"]
        assert row(host, sid)["paused_snapshot_id"] is None
        assert (await svc.resume(sid)).state == "running"  # resuming a running sandbox changes nothing
        assert host.driver.verbs == ["run", "checkpoint", "restore"]

        # A paused sandbox wakes on demand for the request at hand.
        await svc.pause(sid)
        assert (await svc.exec(sid, ["true"]))["exit_code"] == 0
        assert host.store.state(sid) is S.RUNNING

        info = await svc.terminate(sid)
        assert info.state == "terminated" and info.exit_reason == "terminated"
        assert not svc.is_live(sid) and not host.driver.containers and not svc.sandbox_dir(sid).exists()
        assert (await svc.terminate(sid)).state == "terminated"  # idempotent
        with pytest.raises(errors.InvalidState, match="not paused"):
            await svc.resume(sid)
        with pytest.raises(errors.SandboxTerminated):
            await svc.pause(sid)
        with pytest.raises(errors.SandboxTerminated):
            await svc.exec(sid, ["true"])
        with pytest.raises(IllegalTransition):  # nothing brings an ended sandbox back
            host.store.update_sandbox(sid, state=S.RUNNING)
        assert host.store.state(sid) is S.TERMINATED

    asyncio.run(main())


def test_terminate_paused_ends_at_once_and_frees_its_snapshot(host: Host) -> None:
    async def main() -> None:
        svc = service(host)
        sid = (await svc.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        snap = await svc.pause(sid)
        assert (await svc.terminate(sid)).state == "terminated"
        assert snap not in {s["snapshot_id"] for s in svc.list_snapshots()}
        assert host.driver.verbs == ["run", "checkpoint"]  # no restore to tear it down

    asyncio.run(main())


def test_failed_start_leaves_no_row(host: Host) -> None:
    async def main() -> None:
        svc = service(host)

        async def refuse(*_a: Any, **_kw: Any) -> RunResult:
            return RunResult(1, b"", b"boom")
        host.driver.start_detached = refuse  # type: ignore[method-assign]
        with pytest.raises(errors.SandboxLost, match="boom"):
            await svc.create(image_id=IMAGE, cpu=1.0, memory_mib=256)
        assert host.store.list_rows() == [] and list(host.paths.sandboxes.iterdir()) == []

    asyncio.run(main())


def test_recovery_moves_rows_by_the_table(host: Host) -> None:
    """A restarted daemon re-adopts what still runs and ends the rest, by the same table."""
    async def main() -> None:
        first = service(host)
        alive = (await first.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        lost = (await first.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        kept = (await first.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        await first.pause(kept)
        gone = (await first.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        snap = await first.pause(gone)
        await first.delete_snapshot_files(snap)  # its paused state is lost with the crash
        cut = (await first.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        host.store.update_sandbox(cut, state=S.TERMINATING)  # the daemon died mid-teardown
        host.driver.containers.discard(lost.removeprefix("sb-"))  # died with the daemon

        second = service(host)  # the restarted daemon: same store and host, nothing in memory
        summary = await watchdog.recover(second)
        assert summary["reattached"] == 1
        states = {sid: host.store.state(sid) for sid in (alive, lost, kept, gone, cut)}
        assert states == {alive: S.RUNNING, lost: S.TERMINATED, kept: S.PAUSED, gone: S.TERMINATED,
                          cut: S.TERMINATED}
        assert row(host, lost)["exit_reason"] == "lost"
        assert second.is_live(alive) and (await second.exec(alive, ["true"]))["exit_code"] == 0
        assert (await second.resume(kept)).state == "running"
        for sid in (alive, kept):
            await second.terminate(sid)
        assert not host.driver.containers and list(host.paths.sandboxes.iterdir()) == []

    asyncio.run(main())


def test_terminate_finishes_a_teardown_cut_short(host: Host) -> None:
    """A row left terminating (its teardown failed part-way) ends terminated on the next
    terminate, keeping its first end time and reason (terminating -> terminating is no edge)."""
    async def main() -> None:
        svc = service(host)
        sid = (await svc.create(image_id=IMAGE, cpu=1.0, memory_mib=256)).sandbox_id
        host.store.update_sandbox(sid, state=S.TERMINATING, ended_at=123.0, exit_reason="first")
        info = await svc.terminate(sid, reason="second")
        assert (info.state, info.ended_at, info.exit_reason) == ("terminated", 123.0, "first")
        assert not host.driver.containers and not svc.sandbox_dir(sid).exists()

    asyncio.run(main())
