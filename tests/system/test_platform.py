"""The gVisor platform is a daemon setting (ROLLBOX_PLATFORM / `rollbox serve --platform`):
systrap by default, ptrace for fleets that mostly idle; a sandbox may name its own
(`Sandbox(platform=...)`). A checkpoint restores on the platform it was taken on, whatever the
restoring daemon's default."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from rollbox import Image, Sandbox, SandboxPool
from rollbox.client.aclient import daemon_running
from rollbox.client.transport import Client, stop_daemon
from rollbox.config import Paths
from rollbox.errors import InvalidArgument
from tests.system.conftest import side_home


def _sandbox_cpu_ticks(cid: str) -> int:
    """utime + stime (clock ticks) of the runsc processes serving one container."""
    from rollbox.runtime.runsc import runsc_processes
    total = 0
    for pid, _ in runsc_processes(cid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


@pytest.fixture
def ptrace_daemon(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    p = side_home(paths, "ptrace")
    stop_daemon(p)
    monkeypatch.setenv("ROLLBOX_PLATFORM", "ptrace")  # the SDK starts the daemon with its env
    client = Client(paths=p)
    client.request("GET", "/health")  # starts it now, while the variable is set
    monkeypatch.delenv("ROLLBOX_PLATFORM")
    try:
        yield client
    finally:
        for row in client.request("GET", "/sandboxes"):
            client.request("DELETE", f"/sandboxes/{row['sandbox_id']}")
        stop_daemon(p)


def test_ptrace_daemon_runs_snapshots_and_idles(ptrace_daemon: Client) -> None:
    assert ptrace_daemon.request("GET", "/health")["platform"] == "ptrace"
    sb = Sandbox(image=Image.debian(), client=ptrace_daemon).create()
    try:
        assert sb.exec("sh", "-c", "echo 7 > /tmp/n && cat /tmp/n").stdout == b"7\n"
        cid = sb.sandbox_id.removeprefix("sb-")
        time.sleep(1)
        t0 = _sandbox_cpu_ticks(cid)
        time.sleep(5)
        used = (_sandbox_cpu_ticks(cid) - t0) / os.sysconf("SC_CLK_TCK")
        # systrap spends ~0.25 s of CPU here (5% of a core); ptrace's idle sandbox sleeps.
        assert used < 0.1, f"an idle ptrace sandbox used {used:.2f} CPU s in 5 s"
        snap = sb.snapshot_memory()
    finally:
        sb.terminate()
    copy = Sandbox(client=ptrace_daemon).create_from_memory_snapshot(snap)
    try:
        assert copy.exec("cat", "/tmp/n").stdout == b"7\n"
    finally:
        copy.terminate()


def test_a_checkpoint_restores_on_its_own_platform(ptrace_daemon: Client) -> None:
    """A snapshot taken by the default (systrap) daemon restores on a ptrace daemon sharing
    its state directory: the restore runs on systrap, as the checkpoint was taken."""
    src = Sandbox(image=Image.debian()).create()  # the suite's daemon: systrap
    try:
        src.exec("sh", "-c", "echo from-systrap > /tmp/origin")
        snap = src.snapshot_memory()
    finally:
        src.terminate()
    default = Client()
    default_home = default.paths
    stop_daemon(default_home)
    os.environ["ROLLBOX_PLATFORM"] = "ptrace"
    try:
        other = Client(paths=default_home)  # the same state directory, now on ptrace
        assert other.request("GET", "/health")["platform"] == "ptrace"
    finally:
        del os.environ["ROLLBOX_PLATFORM"]
    try:
        copy = Sandbox(client=other).create_from_memory_snapshot(snap)
        try:
            assert copy.exec("cat", "/tmp/origin").stdout == b"from-systrap\n"
        finally:
            copy.terminate()
    finally:
        stop_daemon(default_home)  # the next test's SDK call restarts it on systrap
        other.request("DELETE", f"/snapshots/{snap}")


def test_an_unknown_platform_is_refused_with_the_choices(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    p = side_home(paths, "badplatform")
    stop_daemon(p)
    monkeypatch.setenv("ROLLBOX_PLATFORM", "kvm-please")
    # The caller's configuration, not a daemon that may come back: not retryable (new-user trial).
    with pytest.raises(InvalidArgument, match="systrap, ptrace"):
        Client(paths=p).request("GET", "/health")
    assert not daemon_running(p)  # none was started only to exit


def test_daemon_restart_keeps_the_platform(ptrace_daemon: Client) -> None:
    """`rollbox daemon restart` brings the daemon back on the platform it ran on (the restart
    is an SDK autostart, which would otherwise take the default)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ROLLBOX_PLATFORM"}
    env["ROLLBOX_HOME"] = str(ptrace_daemon.paths.home)
    before = ptrace_daemon.request("GET", "/health")["pid"]
    out = subprocess.run([sys.executable, "-m", "rollbox", "daemon", "restart"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "gVisor platform ptrace" in out.stdout, out.stdout + out.stderr
    h = Client(paths=ptrace_daemon.paths).request("GET", "/health")
    assert h["platform"] == "ptrace" and h["pid"] != before


def _platform_flags(sandbox_id: str) -> set[str]:
    """The --platform flags on the command lines of the runsc sandbox process serving it."""
    import psutil
    cid = sandbox_id.removeprefix("sb-")
    flags: set[str] = set()
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and cmd[0] == "runsc-sandbox" and cmd[-1] == cid:
            flags |= {a for a in cmd if a.startswith("--platform=")}
    return flags


def test_a_sandbox_names_its_own_platform_and_its_snapshot_restores_there() -> None:
    """On the suite's (systrap) daemon: Sandbox(platform="ptrace") boots on ptrace, says so,
    and its memory snapshot's restores and episode-pool sandboxes run on ptrace too (a
    systrap restore of a ptrace image would die at once); the default stays systrap."""
    plain = Sandbox(image=Image.debian(), memory=256).create()
    try:
        assert plain.info().platform == "systrap" and _platform_flags(plain.sandbox_id) == {"--platform=systrap"}
    finally:
        plain.terminate()
    sb = Sandbox(image=Image.debian(), memory=256, platform="ptrace").create()
    try:
        assert sb.info().platform == "ptrace"
        assert _platform_flags(sb.sandbox_id) == {"--platform=ptrace"}
        sb.exec("sh", "-c", "echo on-ptrace > /tmp/origin")
        snap = sb.snapshot_memory()
    finally:
        sb.terminate()
    try:
        # Naming another platform for the restore is refused (break-it trial: it was ignored),
        # before anything starts; naming its own is fine.
        before = {r["sandbox_id"] for r in Client().request("GET", "/sandboxes")}
        for bad in ("systrap", "kvm"):
            with pytest.raises(InvalidArgument, match="restores only there" if bad == "systrap" else "systrap, ptrace"):
                Sandbox(platform=bad).create_from_memory_snapshot(snap)
        assert {r["sandbox_id"] for r in Client().request("GET", "/sandboxes")} == before
        # The listing names its platform and never the channel key (new-user trial).
        listed = {s["snapshot_id"]: s for s in Client().request("GET", "/snapshots")}
        assert listed[snap]["platform"] == "ptrace" and all("agent_key" not in s for s in listed.values())
        copy = Sandbox(platform="ptrace").create_from_memory_snapshot(snap)
        try:
            assert copy.info().platform == "ptrace" and _platform_flags(copy.sandbox_id) == {"--platform=ptrace"}
            assert copy.exec("cat", "/tmp/origin").stdout == b"on-ptrace\n"
        finally:
            copy.terminate()
        seen: list[set[str]] = []

        def episode(box: object, i: int) -> float:
            seen.append(_platform_flags(box.sandbox_id))  # type: ignore[attr-defined]
            r = box.exec("python3", "-c", f"print({i} * 2)")  # type: ignore[attr-defined]
            return 1.0 if r.stdout == f"{i * 2}\n".encode() else 0.0

        with SandboxPool(snap, max_concurrency=2, isolation="container") as pool:
            res = list(pool.map(episode, range(4)))
        assert [r.status for r in res] == ["ok"] * 4 and [r.reward for r in res] == [1.0] * 4, res
        assert seen and all(f == {"--platform=ptrace"} for f in seen), seen
    finally:
        Client().request("DELETE", f"/snapshots/{snap}")


@pytest.mark.parametrize("bad", ["kvm", "PTRACE", "", 3])
def test_a_platform_that_cannot_run_is_refused_before_anything_starts(bad: object) -> None:
    before = {r["sandbox_id"] for r in Client().request("GET", "/sandboxes")}
    # A string names the choices; a non-string is the request model's own 422 on the field.
    with pytest.raises(InvalidArgument, match="systrap, ptrace" if isinstance(bad, str) else "platform"):
        Sandbox(image=Image.debian(), platform=bad).create()  # type: ignore[arg-type]
    assert {r["sandbox_id"] for r in Client().request("GET", "/sandboxes")} == before


def test_runc_takes_no_gvisor_platform() -> None:
    with pytest.raises(InvalidArgument, match="runtime='runc' has none"):
        Sandbox(image=Image.debian(), runtime="runc", platform="ptrace").create()
