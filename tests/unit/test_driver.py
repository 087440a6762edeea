"""The runtime CLI runner (rollbox.runtime.driver) at its edges (gh-19, item 1): a timeout that
fires just as the process exits by itself, a host that cannot start a process, and the typed,
retryable error a failed sandbox start becomes."""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path

import pytest

from rollbox import errors
from rollbox.runtime import driver


def _run(kind: str, argv: list[str], tmp_path: Path, timeout: float) -> driver.RunResult:
    async def go() -> driver.RunResult:
        if kind == "run_command":
            return await driver.run_command(argv, what="test verb", timeout=timeout)
        with open("/dev/null", "rb") as i, open("/dev/null", "wb") as o:
            return await driver.spawn_detached(argv, stdin_fd=i.fileno(), stdout_fd=o.fileno(),
                                               log_path=tmp_path / "log", what="test verb", timeout=timeout)
    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["run_command", "spawn_detached"])
def test_a_timeout_as_the_process_exits_by_itself_is_not_an_error_gh19(kind: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The process finishes, asyncio closes its transport, and only then the timeout fires
    (a loaded host): the kill finds it gone. That was `ProcessLookupError`, an untyped 500."""
    real_wait_for = asyncio.wait_for

    async def late_timeout(aw, timeout):  # type: ignore[no-untyped-def]
        await real_wait_for(aw, 30)
        await asyncio.sleep(0.2)  # the transport's connection_lost runs meanwhile
        raise asyncio.TimeoutError

    monkeypatch.setattr(driver.asyncio, "wait_for", late_timeout)
    res = _run(kind, ["sh", "-c", "exit 3"], tmp_path, timeout=5)
    assert res.returncode == 3


@pytest.mark.parametrize("kind", ["run_command", "spawn_detached"])
def test_a_real_timeout_kills_and_is_sandbox_lost(kind: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(errors.SandboxLost, match=r"`test verb` did not finish in 0.3 s") as e:
        _run(kind, ["sleep", "30"], tmp_path, timeout=0.3)
    assert e.value.retryable and time.monotonic() - t0 < 10


def test_a_host_that_cannot_fork_is_resource_exhausted_and_retryable(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_fork(*_a: object, **_k: object) -> None:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(driver.asyncio, "create_subprocess_exec", no_fork)
    for kind in ("run_command", "spawn_detached"):
        with pytest.raises(errors.ResourceExhausted, match="could not start `test verb`.*out of processes") as e:
            _run(kind, ["true"], tmp_path, timeout=5)
        assert e.value.retryable


def test_a_binary_that_cannot_run_says_which(tmp_path: Path) -> None:
    with pytest.raises(errors.RuntimeMissing, match="could not run `test verb` .*/nonexistent/runsc"):
        _run("run_command", [str(tmp_path / "nonexistent" / "runsc")], tmp_path, timeout=5)


@pytest.mark.parametrize("exc, cls, words", [
    (ProcessLookupError(), errors.SandboxLost, "ProcessLookupError"),
    (OSError(errno.EBUSY, "Device or resource busy"), errors.SandboxLost, "Device or resource busy"),
    (OSError(errno.EMFILE, "Too many open files"), errors.ResourceExhausted, "Too many open files"),
    (asyncio.TimeoutError(), errors.SandboxLost, "did not answer within 60 s"),
])
def test_an_untyped_start_failure_becomes_typed_and_retryable(exc: Exception, cls: type, words: str) -> None:
    err = driver.start_failed("sb-" + "0" * 24, exc, 60.0)
    assert type(err) is cls and err.retryable and err.sandbox_id == "sb-" + "0" * 24
    assert words in err.message and "sb-" + "0" * 24 in err.message


def test_wait_exited_sees_an_exit_times_out_on_a_live_process_and_takes_a_gone_pid() -> None:
    """The teardowns' wait for a killed sandbox (runc.py, runsc.py): a pidfd per process."""
    import os
    import signal
    import subprocess

    async def go() -> tuple[bool, bool, bool]:
        p = subprocess.Popen(["sleep", "30"])
        try:
            live = await driver.wait_exited([p.pid], 0.2)  # still running: False at the timeout
            os.kill(p.pid, signal.SIGKILL)
            t0 = time.monotonic()
            gone = await driver.wait_exited([p.pid], 5.0)  # a zombie counts as exited
            assert time.monotonic() - t0 < 1.0
        finally:
            p.kill()
            p.wait()
        reaped = await driver.wait_exited([p.pid], 0.2)  # reaped: no such process
        return live, gone, reaped

    assert asyncio.run(go()) == (False, True, True)


def test_runc_never_kills_a_pid_that_now_names_another_process(tmp_path: Path) -> None:
    """runc's state file names the init by pid and start time; once the init is gone and the
    pid reused, the teardown must not SIGKILL the new process."""
    import json
    import os
    import subprocess

    from rollbox.runtime.runc import Runc

    p = subprocess.Popen(["sleep", "30"])
    try:
        with open(f"/proc/{p.pid}/stat", "rb") as f:
            start = int(f.read().rpartition(b")")[2].split()[19])
        r = Runc(tmp_path, binary="/bin/false")
        (tmp_path / "c1").mkdir()
        (tmp_path / "c1" / "state.json").write_text(json.dumps({"init_process_pid": p.pid,
                                                                "init_process_start": start + 1}))
        assert r._init_pid("c1") == 0
        asyncio.run(r.delete("c1"))  # runc (here /bin/false) is asked instead: nothing killed
        assert p.poll() is None
        (tmp_path / "c1" / "state.json").write_text(json.dumps({"init_process_pid": p.pid,
                                                                "init_process_start": start}))
        assert r._init_pid("c1") == p.pid
        assert asyncio.run(r.delete("c1")).returncode == 0  # the init itself: killed, state removed
        assert p.wait(5) == -9 and not (tmp_path / "c1").exists()
        assert os.path.exists(tmp_path)
    finally:
        p.kill()
        p.wait()


def test_runc_state_fields_are_read_by_pattern_and_by_a_full_parse_when_needed(tmp_path: Path) -> None:
    from rollbox.runtime.runc import read_state
    f = tmp_path / "state.json"
    assert read_state(f) is None  # no file
    # runc's compact JSON: the OCI config (with its own "pids" object) comes first.
    f.write_text('{"id":"c1","init_process_pid":4242,"init_process_start":777,"config":{"cgroups":'
                 '{"pids":{"limit":64}}},"cgroup_paths":{"memory":"/sys/fs/cgroup/memory/r/c1",'
                 '"pids":"/sys/fs/cgroup/pids/r/c1"}}')
    assert read_state(f) == (4242, 777, "/sys/fs/cgroup/pids/r/c1")
    f.write_text('{"id":"c1","init_process_pid":4242}')  # fields missing: the full parse's zeros
    assert read_state(f) == (4242, 0, "")
    f.write_text('{"init_process_pid":1,"init_process_start":2,"cgroup_paths":{"pids":"/a\\"b"}}')
    assert read_state(f) == (1, 2, '/a"b')  # an escaped path: decoded by the full parse
    f.write_text("{not json")
    assert read_state(f) is None
