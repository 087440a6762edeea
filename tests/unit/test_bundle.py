from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbox.runtime.bundle import (AGENT_DIR, AGENT_MOUNT, CPU_PERIOD_US, BundleSpec, host_memory_limit_mib, host_pids_max, oci_spec, tmpfs_mounts,
                                    write_bundle)
from rollbox.runtime.runc import runc_spec


def spec(**kw):
    base = dict(rootfs=Path("/tmp/rootfs"), cgroup_path="/rollbox/sb-1", cpu=1.5, memory_mib=512)
    base.update(kw)
    return BundleSpec(**base)


@pytest.mark.parametrize("mib", [64, 512, 1024, 3000])
def test_memory_limit_bytes(mib):
    """gh-19: the agent's OOM watcher kills the biggest exec at the user's limit (passed to it
    as ROLLBOX_MEMORY_MIB); the host cgroup gets headroom above it for gVisor's own kernel.
    runc's host kernel OOM-kills a process itself: its limit is the user's."""
    s = oci_spec(spec(memory_mib=mib))
    assert s["linux"]["resources"]["memory"]["limit"] == host_memory_limit_mib(mib) * 2**20
    assert host_memory_limit_mib(mib) >= mib + 256
    assert f"ROLLBOX_MEMORY_MIB={mib}" in s["process"]["env"]
    r = runc_spec(s)
    assert r["linux"]["resources"]["memory"]["limit"] == mib * 2**20
    assert not any(e.startswith("ROLLBOX_MEMORY_MIB=") for e in r["process"]["env"])


@pytest.mark.parametrize("cpu,quota", [(1.0, 100_000), (1.5, 150_000), (0.25, 25_000), (4, 400_000)])
def test_cpu_quota(cpu, quota):
    s = oci_spec(spec(cpu=cpu))
    assert s["linux"]["resources"]["cpu"] == {"quota": quota, "period": CPU_PERIOD_US}


def test_cgroups_path_pids_rootfs_hostname():
    s = oci_spec(spec(hostname="box", pids=99))
    assert s["linux"]["cgroupsPath"] == "/rollbox/sb-1"
    # pids bounds the tasks inside (RLIMIT_NPROC) and, with systrap's stubs, the host cgroup.
    assert s["linux"]["resources"]["pids"] == {"limit": host_pids_max(99)}
    assert {"type": "RLIMIT_NPROC", "hard": 99, "soft": 99} in s["process"]["rlimits"]
    assert s["root"] == {"path": "/tmp/rootfs", "readonly": False}
    assert s["hostname"] == "box"
    assert s["ociVersion"] == "1.0.0"
    ns = {n["type"] for n in s["linux"]["namespaces"]}
    assert {"pid", "network", "mount"} <= ns


def test_agent_mount_and_args():
    s = oci_spec(spec())
    mounts = [m for m in s["mounts"] if m["destination"] == AGENT_MOUNT]
    assert len(mounts) == 1
    m = mounts[0]
    assert m["type"] == "bind"
    assert m["source"] == str(AGENT_DIR)
    assert "ro" in m["options"]
    assert (AGENT_DIR / "agent.py").is_file()
    assert s["process"]["args"] == ["/usr/bin/python3", "-u", "-S", f"{AGENT_MOUNT}/agent.py"] \
        or s["process"]["args"] == [f"{AGENT_MOUNT}/rollbox-agent"]
    assert s["process"]["terminal"] is False


def test_agent_choice():
    from rollbox.runtime.bundle import agent_argv
    assert oci_spec(spec(agent="python"))["process"]["args"][0] == "/usr/bin/python3"
    assert oci_spec(spec(agent="native"))["process"]["args"] == [f"{AGENT_MOUNT}/rollbox-agent"]
    with pytest.raises(ValueError, match="must be one of"):
        agent_argv("perl")


def test_custom_agent_dir():
    s = oci_spec(spec(agent_dir=Path("/opt/agent")))
    (m,) = [m for m in s["mounts"] if m["destination"] == AGENT_MOUNT]
    assert m["source"] == "/opt/agent"


def test_env_merges_over_defaults():
    s = oci_spec(spec(env={"HOME": "/home/x", "FOO": "bar"}))
    env = dict(e.split("=", 1) for e in s["process"]["env"])
    assert env["HOME"] == "/home/x"
    assert env["FOO"] == "bar"
    assert "PATH" in env


def test_write_bundle(tmp_path):
    p = write_bundle(tmp_path, spec())
    assert p == tmp_path / "config.json"
    assert json.loads(p.read_text()) == oci_spec(spec())


def test_host_pids_bound_gh19():
    """The host limit sits above what `pids` tasks inside need on each platform (systrap peaked
    at ~2.25 host tasks per task plus ~22), and grows with pids, not a fixed 4096."""
    for pids in (16, 64, 512, 4096):
        assert 2.25 * pids + 22 < host_pids_max(pids) <= 3 * pids + 64
        assert host_pids_max(pids, "ptrace") > host_pids_max(pids)
    assert host_pids_max(64) < 4096 // 10
    s = oci_spec(spec(pids=64, platform="ptrace"))
    assert s["linux"]["resources"]["pids"] == {"limit": host_pids_max(64, "ptrace")}


def test_runc_pids_limit_is_the_sandbox_task_limit_gh19():
    """runc: one host task per task, no RLIMIT_NPROC (it counts the host's whole uid)."""
    s = runc_spec(oci_spec(spec(pids=64, tmpfs=tmpfs_mounts(512, tmp_in_memory=False))))
    assert s["linux"]["resources"]["pids"] == {"limit": 64}
    assert all(r["type"] != "RLIMIT_NPROC" for r in s["process"]["rlimits"])
    assert [m["destination"] for m in s["mounts"]].count("/dev/shm") == 1


@pytest.mark.parametrize("mib", [128, 1024, 4000])
def test_memory_backed_mounts_are_bounded_gh19(mib):
    """/dev/shm always, /tmp only where it is memory-backed: each a quarter of `memory`, so
    filling both leaves half the sandbox's memory."""
    assert tmpfs_mounts(mib, tmp_in_memory=False) == (("/dev/shm", mib // 4),)
    both = tmpfs_mounts(mib, tmp_in_memory=True)
    assert dict(both) == {"/dev/shm": mib // 4, "/tmp": mib // 4}
    s = oci_spec(spec(memory_mib=mib, tmpfs=both))
    mounts = {m["destination"]: m for m in s["mounts"]}
    for dest, size in both:
        assert mounts[dest]["type"] == "tmpfs" and f"size={size}m" in mounts[dest]["options"]


def test_volume_binds_read_only_or_not():
    s = oci_spec(spec(binds=(("/v/a", "/a", False), ("/v/b", "/b", True))))
    mounts = {m["destination"]: m for m in s["mounts"]}
    assert "rw" in mounts["/a"]["options"] and "ro" not in mounts["/a"]["options"]
    assert "ro" in mounts["/b"]["options"] and "rw" not in mounts["/b"]["options"]


def test_runc_sandbox_hosting_containers_lets_only_its_zygote_mount_gh15():
    """A runc sandbox of an episode pool keeps CAP_SYS_ADMIN (its agent drops it from the
    bounding set) and may mount and unshare, in a cgroup namespace of its own; any other runc
    sandbox keeps the full denylist. Both tell the agent they run on the host kernel."""
    plain = runc_spec(oci_spec(spec()))
    pooled = runc_spec(oci_spec(spec(containers=True)))
    denied = lambda s: set(s["linux"]["seccomp"]["syscalls"][0]["names"])  # noqa: E731
    assert {"mount", "umount2", "pivot_root", "unshare", "setns", "ptrace", "bpf"} <= denied(plain)
    assert not {"mount", "umount2", "pivot_root", "unshare", "setns"} & denied(pooled)
    assert {"ptrace", "bpf", "keyctl", "open_by_handle_at", "io_uring_setup"} <= denied(pooled)
    assert "CAP_SYS_ADMIN" not in plain["process"]["capabilities"]["bounding"]
    assert "CAP_SYS_ADMIN" in pooled["process"]["capabilities"]["bounding"]
    assert {"type": "cgroup"} in pooled["linux"]["namespaces"]
    assert {"type": "cgroup"} not in plain["linux"]["namespaces"]
    for s in (plain, pooled):
        env = s["process"]["env"]
        assert "ROLLBOX_RUNTIME=runc" in env and not any(e.startswith("ROLLBOX_CONTAINERS=") for e in env)


def _run_bpf(code: bytes, nr: int, arch: int = 0xC000003E, arg0: int = 0) -> int:
    """Classic BPF, as much of it as agent/seccomp.py uses, over struct seccomp_data."""
    import struct
    data = struct.pack("<iI Q 6Q", nr, arch, 0, arg0 & 0xFFFFFFFFFFFFFFFF, 0, 0, 0, 0, 0)
    insns = [struct.unpack("HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = insns[pc]
        pc += 1
        if op == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x06:
            return k
        else:
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if hit else jf


def test_container_seccomp_filter_denies_the_runc_denylist_gh15():
    from rollbox.runtime.agent import seccomp
    from rollbox.runtime.runc import DENIED_SYSCALLS
    code = seccomp.program()
    allow, eperm, enosys = 0x7FFF0000, 0x00050001, 0x00050026
    assert set(seccomp.DENIED) == set(DENIED_SYSCALLS) - {"stime", "umount", "vm86", "vm86old"}
    for nr in seccomp.DENIED.values():
        assert _run_bpf(code, nr) == eperm, nr
    for nr in (0, 1, 2, 57, 59, 60, 231):  # read, write, open, fork, execve, exit, exit_group
        assert _run_bpf(code, nr) == allow, nr
    assert _run_bpf(code, 435) == enosys  # clone3: libc falls back to clone
    assert _run_bpf(code, 56, arg0=0x01200011) == allow  # clone as fork() makes it (SIGCHLD|...)
    assert _run_bpf(code, 56, arg0=0x10000000) == eperm  # CLONE_NEWUSER
    assert _run_bpf(code, 56, arg0=0x20000000 | 17) == eperm  # CLONE_NEWPID
    assert _run_bpf(code, 0, arch=0x40000003) == eperm  # i386: every call refused
    assert _run_bpf(code, 0x40000000 | 1) == eperm  # x32
