"""The default base image: Debian 12 (bookworm) minbase with python3, built by debootstrap.

There is no public container registry on the project's machines, so the base image is
built from Debian's own packages (~35-45 s once; PLATFORM.md) and cached in the image store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import RollboxError, RuntimeMissing

DEBIAN_IMAGE_ID = "im-debian-bookworm"
SUITE = "bookworm"
MIRROR = os.environ.get("ROLLBOX_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ["python3", "procps"]


def build_debian_rootfs(target: Path, log_path: Path) -> None:
    """Builds the rootfs into `target` (which must not exist) atomically via a temp dir.

    Raises:
        RuntimeMissing: debootstrap is not installed (fix: `apt-get install debootstrap`).
        RollboxError: debootstrap failed; the message carries its log tail.
    """
    if shutil.which("debootstrap") is None:
        raise RuntimeMissing("debootstrap is not installed: `apt-get install debootstrap` (or `make setup`)")
    tmp = target.with_name(target.name + ".building")
    if tmp.exists():
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    with open(log_path, "wb") as log:
        res = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR],
            stdout=log, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        tail = log_path.read_text(errors="replace")[-1500:]
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
        raise RollboxError(f"building the Debian base image failed (debootstrap exit {res.returncode}); "
                           f"log {log_path}:\n{tail}")
    # Mount points the OCI spec uses, and the agent's mount point.
    for d in ("proc", "sys", "dev", "tmp", ".rollbox", "work"):
        (tmp / d).mkdir(exist_ok=True)
    os.chmod(tmp / "tmp", 0o1777)
    # debootstrap copies the build host's name in; each sandbox gets its own at boot instead.
    (tmp / "etc/hostname").write_text("rollbox\n")
    subprocess.run(["rm", "-rf", str(tmp / "var/cache/apt/archives"), str(tmp / "var/lib/apt/lists")], check=False)
    tmp.rename(target)
