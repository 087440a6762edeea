"""The runc tier: the same API on namespaces + seccomp + cgroups, without gVisor.

Weaker isolation by design (the host kernel), so these tests also pin down the hardening it
does have: no CAP_SYS_ADMIN, no new privileges, the seccomp denylist, the pids cgroup.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import rollbox
from rollbox.runtime import cgroups
from rollbox.runtime.bundle import DEFAULT_PIDS

from .conftest import host_traces


@pytest.fixture
def runc_sb(make_sandbox) -> rollbox.SandboxInstance:  # type: ignore[no-untyped-def]
    return make_sandbox(runtime="runc", cpu=1.0, memory=256)


def test_exec_and_runtime_recorded(runc_sb) -> None:
    r = runc_sb.exec("python3", "-c", "print(6*7)", timeout=5)
    assert (r.exit_code, r.stdout, r.timed_out, r.oom_killed) == (0, b"42\n", False, False)
    assert runc_sb.exec("sh", "-c", "exit 3").exit_code == 3
    assert runc_sb.exec("no-such-command").exit_code == 127
    assert runc_sb.info().runtime == "runc"
    # The same image and identity as a gVisor sandbox.
    assert runc_sb.exec("hostname").text().strip() == runc_sb.sandbox_id
    assert runc_sb.exec("sh", "-c", "echo $ROLLBOX_SANDBOX_ID").text().strip() == runc_sb.sandbox_id


def test_files_roundtrip(runc_sb) -> None:
    runc_sb.fs.write_file("/work/a.py", b"print('hi')")
    assert runc_sb.fs.read_file("/work/a.py") == b"print('hi')"
    assert runc_sb.exec("python3", "/work/a.py").text() == "hi\n"
    with pytest.raises(rollbox.FileNotFoundInSandbox):
        runc_sb.fs.read_file("/nope")


def test_timeout_kills_tree(runc_sb) -> None:
    r = runc_sb.exec("sh", "-c", "sleep 100 & sleep 200", timeout=1)
    assert r.timed_out and r.exit_code is None
    assert runc_sb.exec("sh", "-c", "pgrep sleep || true").text().strip() == ""


def test_hardening(runc_sb) -> None:
    status = runc_sb.exec("cat", "/proc/self/status").text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    cap_sys_admin = 1 << 21
    assert int(fields["CapBnd"], 16) & cap_sys_admin == 0
    # Namespaces, mounts and ptrace are refused by seccomp or the missing capability.
    assert runc_sb.exec("unshare", "-U", "true").exit_code != 0
    assert runc_sb.exec("mount", "-t", "tmpfs", "x", "/mnt").exit_code != 0
    assert runc_sb.exec("python3", "-c", "import ctypes; l=ctypes.CDLL(None); "
                        "import sys; sys.exit(0 if l.ptrace(16, 1, 0, 0) == -1 else 1)").exit_code == 0
    # Only the sandbox's own processes are visible.
    pids = [p for p in runc_sb.exec("ls", "/proc").text().split() if p.isdigit()]
    assert len(pids) < 10


def test_limits(make_sandbox, paths) -> None:
    sb = make_sandbox(runtime="runc", cpu=0.5, memory=256)
    cid = sb.sandbox_id.removeprefix("sb-")
    quota = (cgroups.CGROUP_ROOT / "cpu" / paths.cgroup_parent / cid / "cpu.cfs_quota_us").read_text().strip()
    assert quota == "50000"
    limit = int((cgroups.CGROUP_ROOT / "memory" / paths.cgroup_parent / cid / "memory.limit_in_bytes").read_text())
    assert limit == 256 * 1024 * 1024
    r = sb.exec("python3", "-c", "x = bytearray(1024**3); print(len(x))", timeout=60)
    assert r.oom_killed and not r.ok
    # On the host kernel only the process dies: the sandbox lives on.
    assert sb.exec("true").ok
    # The cgroup's OOM counter is cumulative: a later SIGKILL is not an OOM.
    killed = sb.exec("sh", "-c", "kill -9 $$")
    assert killed.exit_code == 137 and not killed.oom_killed
    # The pids cgroup bounds a fork bomb, the exec says so; the agent still answers afterwards.
    r = sb.exec("sh", "-c", "for i in $(seq 2000); do sleep 30 & done 2>/dev/null; echo done", timeout=60)
    assert r.pids_limited, r
    assert not sb.exec("true").pids_limited
    pids_max = (cgroups.CGROUP_ROOT / "pids" / paths.cgroup_parent / cid / "pids.max").read_text().strip()
    assert pids_max == str(DEFAULT_PIDS)  # the sandbox's `pids`: one host task per task on runc
    assert sb.exec("true", timeout=30).ok


def test_memory_snapshots_are_gvisor_only(runc_sb) -> None:
    for call in (runc_sb.snapshot_memory, lambda: runc_sb.fork(2), runc_sb.pause):
        with pytest.raises(rollbox.UnsupportedOperation, match="need the gVisor runtime"):
            call()
    assert runc_sb.exec("true").ok  # refused, not broken


def test_bad_runtime_arguments() -> None:
    with pytest.raises(rollbox.InvalidArgument, match="runtime='firecracker'"):
        rollbox.Sandbox(runtime="firecracker").create()
    with pytest.raises(rollbox.InvalidArgument, match="gpu"):
        rollbox.Sandbox(runtime="runc", gpu="any").create()
    with pytest.raises(rollbox.InvalidArgument, match="docker_enabled"):
        rollbox.Sandbox(runtime="runc", docker_enabled=True).create()


def test_image_from_filesystem_works_on_runc(make_sandbox) -> None:
    sb = make_sandbox(runtime="runc", memory=256)
    sb.exec("sh", "-c", "echo kept > /etc/marker")
    image_id = sb.create_image_from_filesystem()
    child = make_sandbox(image=rollbox.Image.from_id(image_id), runtime="runc", memory=256)
    assert child.exec("cat", "/etc/marker").text() == "kept\n"


def test_killed_from_outside_is_lost_and_cleaned(paths) -> None:
    sb = rollbox.Sandbox(runtime="runc", memory=256).create()
    from rollbox.runtime.runc import Runc

    procs = Runc(paths.runc_root).processes(sb.sandbox_id.removeprefix("sb-"))
    init = next(pid for pid, role in procs if role == "sandbox")
    os.kill(init, signal.SIGKILL)
    with pytest.raises(rollbox.SandboxLost):
        for _ in range(50):
            sb.exec("true")
            time.sleep(0.1)
    deadline = time.monotonic() + 20
    while host_traces(paths, sb.sandbox_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert host_traces(paths, sb.sandbox_id) == []


def test_networked_runc_port(make_sandbox) -> None:
    import urllib.request

    sb = make_sandbox(runtime="runc", memory=256, ports=[8000])
    sb.exec("sh", "-c", "cd /tmp && echo runc-ok > index.html && python3 -m http.server 8000 >/dev/null 2>&1 &")
    url = sb.list_urls()[8000]
    body = b""
    for _ in range(100):
        try:
            body = urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            time.sleep(0.1)
    assert body == b"runc-ok\n"


def test_terminate_leaves_nothing(paths) -> None:
    sb = rollbox.Sandbox(runtime="runc", memory=256).create()
    sb.exec("sh", "-c", "sleep 1000 &")
    sb.terminate()
    assert host_traces(paths, sb.sandbox_id) == []
    with pytest.raises(rollbox.SandboxTerminated):
        sb.exec("true")
