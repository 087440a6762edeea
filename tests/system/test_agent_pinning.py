"""A snapshot keeps the agent build it captured: restores boot from the snapshot's own copy,
so rebuilding or upgrading the agent (here: a daemon restarted on another build) breaks no
stored snapshot, while new sandboxes get the new build (rollbox/runtime/agentdir.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rollbox import Image, Sandbox
from rollbox.client.transport import Client, stop_daemon
from rollbox.config import Paths
from rollbox.runtime.agentdir import AGENT_FILES
from rollbox.runtime.bundle import AGENT_DIR
from tests.system.conftest import side_home

NATIVE_SRC = AGENT_DIR / "native"
# What `make agent` builds with (Debian 12's own toolchain, not a rustup one on PATH).
DEBIAN_CARGO = "/usr/bin/cargo"
DEBIAN_RUSTC = "/usr/bin/rustc"


def _variant_build(work: Path) -> Path:
    """The native agent built from a copy of its source with one message changed: same
    size class, different code bytes (what a rebuild after an upgrade gives)."""
    src = work / "src"
    shutil.copytree(NATIVE_SRC, src, ignore=shutil.ignore_patterns("target"))
    main = src / "src" / "main.rs"
    main.write_text(main.read_text().replace("it takes no arguments", "it takes no arguments (variant)"))
    # Unoptimised, without the release profile's LTO (40 s -> 12 s here; what differs is
    # the code, which is all this test needs).
    env = dict(os.environ, RUSTFLAGS="-C target-feature=+crt-static", CARGO_TARGET_DIR=str(work / "target"),
               RUSTC=DEBIAN_RUSTC, CARGO_PROFILE_RELEASE_LTO="false", CARGO_PROFILE_RELEASE_CODEGEN_UNITS="16",
               CARGO_PROFILE_RELEASE_OPT_LEVEL="0")
    # Run in the copy: cargo reads .cargo/config.toml (Debian's crates as a directory source)
    # from the directory it runs in, not from the manifest's.
    res = subprocess.run([DEBIAN_CARGO, "build", "--quiet", "--release", "--offline", "--locked", "--target",
                          "x86_64-unknown-linux-gnu"], cwd=src, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    out = work / "agent"
    out.mkdir()
    shutil.copy2(work / "target" / "x86_64-unknown-linux-gnu" / "release" / "rollbox-agent", out / "rollbox-agent")
    for name in AGENT_FILES:  # the Python agent whole (ROLLBOX_AGENT=python boots agent.py and its modules)
        if name.endswith(".py"):
            shutil.copy2(AGENT_DIR / name, out / name)
    return out


@pytest.mark.skipif(not os.access(DEBIAN_CARGO, os.X_OK) or not (AGENT_DIR / "rollbox-agent").exists(),
                    reason="needs Debian's cargo (scripts/setup-host.sh) and the built native agent")
def test_snapshots_survive_an_agent_rebuild(paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    variant = _variant_build(tmp_path)
    p = side_home(paths, "agentpin")
    stop_daemon(p)
    old = Client(paths=p)
    sb = Sandbox(image=Image.debian(), client=old).create()
    try:
        sb.exec("sh", "-c", "echo kept > /tmp/state")
        snap = sb.snapshot_memory()
        # The snapshot's agent is the very file the captured process runs (a hard link).
        pinned = p.snapshots / snap / "agent" / "rollbox-agent"
        assert pinned.stat().st_ino == (p.sandboxes / sb.sandbox_id / "agent" / "rollbox-agent").stat().st_ino
    finally:
        sb.terminate()
    stop_daemon(p)
    monkeypatch.setenv("ROLLBOX_AGENT_DIR", str(variant))  # the next daemon boots new sandboxes on it
    new = Client(paths=p)
    new.request("GET", "/health")
    monkeypatch.delenv("ROLLBOX_AGENT_DIR")
    try:
        copy = Sandbox(client=new).create_from_memory_snapshot(snap)
        try:
            assert copy.exec("cat", "/tmp/state").stdout == b"kept\n"  # the old build, restored
            again = Sandbox(client=new).create_from_memory_snapshot(copy.snapshot_memory())
            assert again.exec("cat", "/tmp/state").stdout == b"kept\n"
            again.terminate()
        finally:
            copy.terminate()
        fresh = Sandbox(image=Image.debian(), client=new).create()
        try:
            assert b"(variant)" in fresh.exec("/.rollbox/rollbox-agent", "--version").stdout
        finally:
            fresh.terminate()
    finally:
        for row in new.request("GET", "/sandboxes"):
            new.request("DELETE", f"/sandboxes/{row['sandbox_id']}")
        stop_daemon(p)
