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
from tests.system.conftest import runsc_pids, side_home


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
            for pid in runsc_pids(p, roles=(b"runsc-sandbox",)):
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
        assert runsc_pids(p) == []
        assert os.listdir(p.sandboxes) == []
        assert not cgroups.leftover_ids(p.cgroup_parent)
    finally:
        for pid in runsc_pids(p):
            os.kill(pid, signal.SIGKILL)
        stop_daemon(p)
