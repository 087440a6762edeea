"""Where rollbox keeps its state, resolved once from the environment and passed explicitly."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgument

DEFAULT_HOME = "/var/lib/rollbox"
# gVisor platforms that work on this machine kind (PLATFORM.md: kvm hangs on its kvm_pvm).
# Measured here with runsc 20240729 (bench/bench.py, README "Platforms"): systrap costs an idle
# sandbox ~5% of a core (upstream google/gvisor#10793, #13361) but runs syscalls ~10x faster;
# ptrace idles at ~0% and spawns processes slightly faster. Both checkpoint and restore.
PLATFORMS = ("systrap", "ptrace")
DEFAULT_PLATFORM = "systrap"
RUNSC_INSTALL_HINT = (
    "install gVisor from bookworm-backports: add the 'bookworm-backports' suite to apt's "
    "sources, then `apt-get install -t bookworm-backports runsc` (or run `make setup`)"
)


def platform_from_env(value: str | None = None) -> str:
    """The gVisor platform named by `value` or ROLLBOX_PLATFORM (default systrap).

    Raises:
        InvalidArgument: a platform not in PLATFORMS.
    """
    name = (value if value is not None else os.environ.get("ROLLBOX_PLATFORM", "")).strip() or DEFAULT_PLATFORM
    if name not in PLATFORMS:
        raise InvalidArgument(f"unknown gVisor platform {name!r} (ROLLBOX_PLATFORM / --platform): "
                              f"use one of {', '.join(PLATFORMS)}")
    return name


def check_platform(value: object) -> str | None:
    """A sandbox's own gVisor platform (`Sandbox(platform=...)`): None (the daemon's) or one
    of PLATFORMS.

    Raises:
        InvalidArgument: anything else.
    """
    if value is None or (isinstance(value, str) and value in PLATFORMS):
        return value
    raise InvalidArgument(f"platform={value!r}: use one of {', '.join(PLATFORMS)}, or None for the daemon's "
                          f"(ROLLBOX_PLATFORM)")


@dataclass(frozen=True)
class Paths:
    """The on-disk layout of one daemon's state directory (`ROLLBOX_HOME`)."""

    home: Path

    @classmethod
    def from_env(cls) -> "Paths":
        return cls(Path(os.environ.get("ROLLBOX_HOME", DEFAULT_HOME)))

    @property
    def cgroup_parent(self) -> str:
        """This daemon's cgroup parent: one per state directory, so daemons never touch
        each other's sandboxes' cgroups."""
        if str(self.home) == DEFAULT_HOME:
            return "rollbox"
        return "rollbox-" + hashlib.sha256(str(self.home).encode()).hexdigest()[:10]

    @property
    def socket(self) -> Path:
        return self.home / "rollbox.sock"

    @property
    def db(self) -> Path:
        return self.home / "rollbox.db"

    @property
    def daemon_log(self) -> Path:
        return self.home / "daemon.log"

    @property
    def daemon_lock(self) -> Path:
        return self.home / "daemon.lock"

    @property
    def runsc_root(self) -> Path:
        return self.home / "runsc"

    @property
    def runc_root(self) -> Path:
        return self.home / "runc"

    @property
    def sandboxes(self) -> Path:
        return self.home / "sandboxes"

    @property
    def images(self) -> Path:
        return self.home / "images"

    @property
    def snapshots(self) -> Path:
        return self.home / "snapshots"

    @property
    def volumes(self) -> Path:
        return self.home / "volumes"

    @property
    def agents(self) -> Path:
        """Installed agent builds, one directory per content digest (runtime/agentdir.py)."""
        return self.home / "agents"

    def ensure(self) -> None:
        for p in (self.home, self.runsc_root, self.sandboxes, self.images, self.snapshots, self.volumes):
            p.mkdir(parents=True, exist_ok=True)
        # The API socket lives here and the daemon runs as root: only root may reach it
        # (uvicorn makes the socket itself world-writable).
        os.chmod(self.home, 0o700)
