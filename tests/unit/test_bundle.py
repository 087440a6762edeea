from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbox.runtime.bundle import AGENT_DIR, AGENT_MOUNT, CPU_PERIOD_US, BundleSpec, oci_spec, write_bundle


def spec(**kw):
    base = dict(rootfs=Path("/tmp/rootfs"), cgroup_path="/rollbox/sb-1", cpu=1.5, memory_mib=512)
    base.update(kw)
    return BundleSpec(**base)


@pytest.mark.parametrize("mib", [64, 512, 1024, 3000])
def test_memory_limit_bytes(mib):
    s = oci_spec(spec(memory_mib=mib))
    assert s["linux"]["resources"]["memory"]["limit"] == mib * 2**20


@pytest.mark.parametrize("cpu,quota", [(1.0, 100_000), (1.5, 150_000), (0.25, 25_000), (4, 400_000)])
def test_cpu_quota(cpu, quota):
    s = oci_spec(spec(cpu=cpu))
    assert s["linux"]["resources"]["cpu"] == {"quota": quota, "period": CPU_PERIOD_US}


def test_cgroups_path_pids_rootfs_hostname():
    s = oci_spec(spec(hostname="box", pids=99))
    assert s["linux"]["cgroupsPath"] == "/rollbox/sb-1"
    assert s["linux"]["resources"]["pids"] == {"limit": 99}
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
