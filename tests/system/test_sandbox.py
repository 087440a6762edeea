"""Create, exec, files, limits and bad input, against real runsc."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

import rollbox
from rollbox import Image, Sandbox
from rollbox.client.transport import Client
from rollbox.runtime import cgroups
from rollbox.runtime.runsc import Runsc
from rollbox.server.service import container_id

from .conftest import host_traces


def test_exec_basics(sandbox) -> None:
    r = sandbox.exec("python3", "-c", "print(6*7)", timeout=5)
    assert isinstance(r, rollbox.ExecResult)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.oom_killed) == (0, b"42\n", b"", False, False)
    assert r.text() == "42\n" and r.duration_s > 0
    r = sandbox.exec("sh", "-c", "echo err >&2; exit 3")
    assert (r.exit_code, r.stderr) == (3, b"err\n")
    assert sandbox.exec("no-such-command").exit_code == 127


def test_filesystem_roundtrip(sandbox) -> None:
    sandbox.fs.write_file("/work/a.py", b"print('hi')")
    assert sandbox.fs.read_file("/work/a.py") == b"print('hi')"
    names = [e.name for e in sandbox.fs.list_files("/work")]
    assert "a.py" in names
    assert sandbox.exec("python3", "/work/a.py").stdout == b"hi\n"
    with pytest.raises(rollbox.FileNotFoundInSandbox):
        sandbox.fs.read_file("/work/missing")


def test_stdin_closed_unless_given(sandbox) -> None:
    t = time.monotonic()
    r = sandbox.exec("cat", timeout=5)
    assert r.exit_code == 0 and not r.timed_out and time.monotonic() - t < 3
    assert sandbox.exec("cat", stdin=b"abc\x00\xff").stdout == b"abc\x00\xff"


def test_output_binary_safe(sandbox) -> None:
    r = sandbox.exec("sh", "-c", r"printf '\377\376ok\303\050'")
    assert r.stdout == b"\xff\xfeok\xc3\x28"
    assert "ok" in r.text()


def _daemon_rss_kib(client: Client) -> int:
    pid = client.request("GET", "/health")["pid"]
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_100mib_output_is_capped(sandbox) -> None:
    client = rollbox.sdk.sandbox.default_client()
    before = _daemon_rss_kib(client)
    r = sandbox.exec("sh", "-c", "head -c 104857600 /dev/zero; echo done >&2", timeout=60)
    assert r.exit_code == 0 and r.truncated
    assert r.stdout_bytes == 100 * 1024 * 1024
    assert len(r.stdout) == 8 * 1024 * 1024  # the documented default cap
    assert r.stderr == b"done\n"
    assert _daemon_rss_kib(client) - before < 200 * 1024
    small = sandbox.exec("sh", "-c", "head -c 5000 /dev/zero", max_output=1000)
    assert len(small.stdout) == 1000 and small.truncated


def test_timeout_kills_whole_tree(sandbox) -> None:
    t = time.monotonic()
    r = sandbox.exec("sh", "-c", "sleep 101 & (setsid sleep 102 &); sh -c 'sleep 103' & sleep 104", timeout=1)
    assert time.monotonic() - t < 1 + 1.0 + 0.5  # timeout + 1 s (+ HTTP slack)
    assert r.timed_out and r.exit_code is None
    left = sandbox.exec("sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").text()
    assert "sleep 10" not in left


def test_isolation_between_sandboxes_and_image(make_sandbox) -> None:
    a = make_sandbox(memory=512)
    b = make_sandbox(memory=512)
    # Each names itself (kernel and /etc/hostname), never the host that built the image.
    assert a.exec("sh", "-c", "hostname; cat /etc/hostname; stat -c %a /etc").text().split() == \
        [a.sandbox_id, a.sandbox_id, "755"]
    a.exec("sh", "-c", "echo secret > /etc/a-only && rm -f /etc/hostname")
    assert b.exec("test", "-e", "/etc/a-only").exit_code == 1
    assert b.exec("test", "-e", "/etc/hostname").exit_code == 0
    c = make_sandbox(memory=512)  # a new sandbox from the same image sees the pristine image
    assert c.exec("test", "-e", "/etc/a-only").exit_code == 1


# Memory no exec's cgroup is charged for: 1 MiB in each of 2,000 pipes is gVisor's kernel's
# (pipe buffers), which only the host's limit sees.
FILL_PIPE_BUFFERS = """
import fcntl, os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (65536, 65536))
keep = []
for _ in range(2000):
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass
    os.set_blocking(w, False)
    try:
        os.write(w, b"x" * (1 << 20))
    except BlockingIOError:
        pass
    keep.append((r, w))
print("survived")
"""


def test_memory_limit_kills_the_command_and_whole_sandbox_oom_is_the_last_line(make_sandbox, paths) -> None:
    """gh-19: over its memory limit a command is SIGKILLed (137, oom_killed) and the sandbox
    goes on; only memory no exec holds can still end the whole sandbox, reported as oom."""
    sb = make_sandbox(memory=256)
    r = sb.exec("python3", "-c", "x = bytearray(1024**3); print(len(x))", timeout=60)
    assert r.oom_killed and r.exit_code == 137 and not r.ok
    assert sb.exec("echo", "ok").stdout == b"ok\n"
    r = sb.exec("python3", "-c", FILL_PIPE_BUFFERS, timeout=60)
    assert r.oom_killed and not r.ok and b"whole sandbox ran out of memory" in r.stderr, r
    with pytest.raises(rollbox.SandboxTerminated, match="oom"):
        for _ in range(50):
            sb.exec("true")
            time.sleep(0.1)
    # Its cgroup goes too, even when the kernel still called it busy at teardown (the OOM-killed
    # sandbox exiting slowly): the watchdog retries it within a few seconds.
    cid = container_id(sb.sandbox_id)
    deadline = time.monotonic() + 15
    while cgroups.controller_dirs(cid, paths.cgroup_parent) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cgroups.controller_dirs(cid, paths.cgroup_parent) == []


def test_cpu_limit_applied(make_sandbox, paths) -> None:
    sb = make_sandbox(cpu=0.5, memory=256)
    cid = sb.sandbox_id.removeprefix("sb-")
    quota = (cgroups.CGROUP_ROOT / "cpu" / paths.cgroup_parent / cid / "cpu.cfs_quota_us").read_text().strip()
    assert quota == "50000"
    # A busy loop gets about half a core: 1 s of wall time gives ~0.5 s of CPU.
    r = sb.exec("python3", "-c", "import time,os\nt=time.time()\nwhile time.time()-t<2: pass\n"
                "print(os.times().user+os.times().system)", timeout=20)
    assert r.exit_code == 0
    assert float(r.text()) < 1.6


def test_bad_input_typed_errors(sandbox) -> None:
    with pytest.raises(rollbox.SandboxNotFound):
        Sandbox().connect("sb-" + "0" * 24)
    with pytest.raises(rollbox.SnapshotNotFound):
        Sandbox().create_from_memory_snapshot("sn-" + "0" * 24)
    with pytest.raises(rollbox.InvalidArgument):
        Sandbox().create_from_memory_snapshot("not-a-snapshot")
    with pytest.raises(rollbox.ImageNotFound):
        Sandbox(image=Image.from_id("im-doesnotexist")).create()
    with pytest.raises(rollbox.InvalidArgument):
        Sandbox(memory=16).create()
    sandbox.terminate()
    sandbox.terminate()  # idempotent
    with pytest.raises(rollbox.SandboxTerminated):
        sandbox.exec("true")


def test_failed_create_leaves_nothing(paths) -> None:
    before = set(os.listdir(paths.sandboxes))
    with pytest.raises(rollbox.ImageNotFound):
        Sandbox(image=Image.from_id("im-doesnotexist")).create()
    assert set(os.listdir(paths.sandboxes)) == before


def test_daemon_unreachable(tmp_path) -> None:
    c = Client(url=f"unix://{tmp_path}/nope.sock")
    with pytest.raises(rollbox.DaemonUnavailable, match="rollbox serve"):
        Sandbox(client=c).create()


def test_runsc_missing_has_install_hint() -> None:
    with pytest.raises(rollbox.RuntimeMissing, match="bookworm-backports"):
        Runsc(root=__import__("pathlib").Path("/tmp"), binary="/nonexistent/runsc").check()


def test_terminate_removes_everything(paths) -> None:
    with Sandbox(memory=256).create() as sb:
        sb.exec("sh", "-c", "sleep 1000 &")
        sid = sb.sandbox_id
        assert host_traces(paths, sid)
    assert host_traces(paths, sid) == []


def test_sandbox_outlives_client_process(paths) -> None:
    code = "from rollbox import Sandbox; print(Sandbox(memory=256).create().sandbox_id)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    sid = out.stdout.strip()
    sb = Sandbox().connect(sid)
    try:
        assert sb.exec("echo", "alive").stdout == b"alive\n"
    finally:
        sb.terminate()


def test_keep_warm_seconds_kills_idle(paths) -> None:
    sb = Sandbox(memory=256, keep_warm_seconds=1).create()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and sb.info().state != "terminated":
        time.sleep(0.5)
    info = sb.info()
    assert info.state == "terminated" and info.exit_reason == "keep_warm_expired"
    assert host_traces(paths, sb.sandbox_id) == []


def test_async_mirror() -> None:
    async def main() -> bytes:
        sb = await Sandbox(memory=256).create.aio()
        async with sb:
            r = await sb.exec.aio("echo", "async")
            return r.stdout

    assert asyncio.run(main()) == b"async\n"


def test_create_image_from_filesystem(make_sandbox) -> None:
    a = make_sandbox(memory=256)
    a.fs.write_file("/work/model.txt", b"v1")
    a.exec("rm", "-f", "/etc/debian_version")
    image_id = a.create_image_from_filesystem()
    b = make_sandbox(image=Image.from_id(image_id), memory=256)
    assert b.fs.read_file("/work/model.txt") == b"v1"
    assert b.exec("test", "-e", "/etc/debian_version").exit_code == 1
    client = rollbox.sdk.sandbox.default_client()
    with pytest.raises(rollbox.InvalidState):
        client.request("DELETE", f"/images/{image_id}")  # in use by b
    b.terminate()
    client.request("DELETE", f"/images/{image_id}")
    with pytest.raises(rollbox.ImageNotFound):
        client.request("GET", f"/images/{image_id}")


def test_busy_cgroup_is_retried_until_free() -> None:
    """A cgroup with a process still in it refuses rmdir (EBUSY); the watchdog's retry keeps it
    on its list and removes it once the process is gone."""
    from rollbox.server.teardown import retry_cgroup_leftovers

    parent, cid = f"rollbox-busytest-{os.getpid()}", "c0ffee"
    d = cgroups.CGROUP_ROOT / "pids" / parent / cid
    d.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "600"])
    try:
        (d / "cgroup.procs").write_text(str(proc.pid))
        leftovers = {cid}
        retry_cgroup_leftovers(leftovers, [], parent)
        assert d.is_dir() and leftovers == {cid}
        proc.kill()
        proc.wait()
        retry_cgroup_leftovers(leftovers, [], parent)
        assert not d.exists() and leftovers == set()
    finally:
        proc.kill()
        proc.wait()
        for p in (d, d.parent):
            if p.exists():
                p.rmdir()
