"""System tests: real gVisor sandboxes through the SDK and the local daemon.

They need root and runsc (`make setup`); without them they are skipped with the reason.
tests/conftest.py marks them `system`. Every sandbox a test makes is terminated at teardown,
and at the end of the session tests/conftest.py checks (leaks.py) that nothing a sandbox made
is left on the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rollbox import Image, Sandbox, SandboxInstance
from rollbox.config import Paths
from rollbox.runtime import cgroups

if os.geteuid() != 0 or shutil.which("runsc") is None:
    pytest.skip("system tests need root and gVisor runsc (run `make setup`)", allow_module_level=True)


@pytest.fixture(scope="session")
def paths() -> Paths:
    return Paths.from_env()


def side_home(paths: Paths, suffix: str) -> Paths:
    """A second daemon's state directory next to the test home, with the test home's images
    hard-linked in (image layers are read-only), so that it boots without building any."""
    p = Paths(Path(f"{paths.home}-{suffix}"))
    p.ensure()
    # Entry by entry, shared layers included: images built since an earlier run need theirs.
    for src in [*paths.images.iterdir(), *paths.images.glob("_layers/*")]:
        dst = p.images / src.relative_to(paths.images)
        if src.name != "_layers" and not src.name.startswith(".") and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-al", str(src), str(dst)], check=True)
    return p


@pytest.fixture
def make_sandbox() -> Iterator:
    made: list[SandboxInstance] = []

    def make(**kw: object) -> SandboxInstance:
        sb = Sandbox(**kw).create()  # type: ignore[arg-type]
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.terminate()


@pytest.fixture
def sandbox(make_sandbox) -> SandboxInstance:  # type: ignore[no-untyped-def]
    return make_sandbox(image=Image.debian(), cpu=1.0, memory=512)


SERVER = r"""
import socket, os
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000)); s.listen()
n = 0
while True:
    c, _ = s.accept(); n += 1; c.send(str(n).encode()); c.close()
"""
CLIENT = "import socket; s = socket.create_connection(('127.0.0.1', 8000)); print(s.recv(16).decode())"


def start_counter_server(sb: SandboxInstance) -> None:
    """A Python process holding state (a counter) and a listening socket on loopback."""
    sb.fs.write_file("/work/server.py", SERVER)
    r = sb.exec("sh", "-c", "python3 /work/server.py >/dev/null 2>&1 &")
    assert r.exit_code == 0
    for _ in range(100):
        if sb.exec("python3", "-c", CLIENT).exit_code == 0:
            return
    raise AssertionError("counter server did not come up")


def counter(sb: SandboxInstance) -> int:
    r = sb.exec("python3", "-c", CLIENT, timeout=10)
    assert r.exit_code == 0, r.stderr
    return int(r.text())


def proc_cmdlines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv as bytes) of every process whose command line is readable now (psutil)."""
    for p in psutil.process_iter(["cmdline"]):
        argv = p.info["cmdline"]
        if argv:
            yield p.pid, [os.fsencode(a) for a in argv]


def runsc_pids(home: Paths, roles: tuple[bytes, ...] = (b"runsc-sandbox", b"runsc-gofer")) -> list[int]:
    """The runsc sandbox and gofer processes of one state directory's containers."""
    root = str(home.runsc_root).encode()
    return [pid for pid, argv in proc_cmdlines() if argv[0] in roles and any(root in a for a in argv)]


def host_traces(paths: Paths, sandbox_id: str) -> list[str]:
    """Everything on the host that still belongs to one sandbox."""
    cid = sandbox_id.removeprefix("sb-")
    out = []
    if (paths.sandboxes / sandbox_id).exists():
        out.append(f"dir {paths.sandboxes / sandbox_id}")
    with open("/proc/self/mounts") as f:
        out += [f"mount {line.split()[1]}" for line in f if sandbox_id in line.split()[1]]
    out += [f"cgroup {d}" for d in cgroups.controller_dirs(cid, paths.cgroup_parent)]
    if (paths.runsc_root / f"runsc-{cid}.sock").exists() or any(
            p.name.startswith(cid) for p in paths.runsc_root.glob("*")):
        out.append("runsc state")
    if (paths.runc_root / cid).exists():
        out.append("runc state")
    out += [f"process {pid}" for pid, argv in proc_cmdlines() if any(cid.encode() in a for a in argv)]
    return out
