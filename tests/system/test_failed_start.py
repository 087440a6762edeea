"""A start that hangs past the boot timeout fails with SandboxLost and leaves nothing behind:
no runsc sandbox or gofer process (runsc may never have registered the container), no
cgroup, no sandbox directory. The hang is made by stopping the new sandbox process."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rollbox import Image, Sandbox, SandboxLost
from rollbox.client.transport import Client, stop_daemon
from rollbox.config import Paths
from rollbox.runtime import cgroups
from tests.system.conftest import side_home


def _runsc_pids(home: Paths) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv[0] in (b"runsc-sandbox", b"runsc-gofer") and any(str(home.runsc_root).encode() in a for a in argv):
                out.append(int(name))
    return out


def test_a_start_past_its_timeout_leaves_no_processes(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    p = side_home(paths, "bootfail")
    stop_daemon(p)
    monkeypatch.setenv("ROLLBOX_BOOT_TIMEOUT_S", "5")
    client = Client(paths=p)
    client.request("GET", "/health")
    monkeypatch.delenv("ROLLBOX_BOOT_TIMEOUT_S")
    stopped: list[int] = []

    def stop_the_sandbox() -> None:
        deadline = time.monotonic() + 20
        while not stopped and time.monotonic() < deadline:
            for pid in _runsc_pids(p):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"runsc-sandbox"):
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(pid)
                        return
            time.sleep(0.002)

    th = threading.Thread(target=stop_the_sandbox)
    th.start()
    try:
        with pytest.raises(SandboxLost):
            Sandbox(image=Image.debian(), memory=256, client=client).create()
        th.join()
        assert stopped, "the sandbox process never appeared"
        time.sleep(0.5)
        assert _runsc_pids(p) == []
        assert os.listdir(p.sandboxes) == []
        assert not cgroups.leftover_ids(p.cgroup_parent)
    finally:
        for pid in _runsc_pids(p):
            os.kill(pid, signal.SIGKILL)
        stop_daemon(p)
