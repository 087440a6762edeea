"""Test-session set-up shared by every tier.

The suite never touches the user's state: it runs its own daemon on its own state directory
(`ROLLBOX_TEST_HOME`, default /var/lib/rollbox-test), whose base image is hard-linked from the
user's (`ROLLBOX_HOME`, built by `make setup`) or built once. The test daemon is stopped at
the end of the session; sandboxes and snapshots the user made are never seen.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.config import DEFAULT_HOME

USER_HOME = Path(os.environ.get("ROLLBOX_HOME", DEFAULT_HOME))
TEST_HOME = Path(os.environ.get("ROLLBOX_TEST_HOME", "/var/lib/rollbox-test"))
os.environ["ROLLBOX_HOME"] = str(TEST_HOME)
os.environ.pop("ROLLBOX_URL", None)
os.environ.pop("ROLLBOX_TOKEN", None)
# A canary in the environment the test daemon inherits: no sandbox may ever see it.
os.environ.setdefault("ROLLBOX_TEST_CANARY", "daemon-env-canary-" + os.urandom(6).hex())


def _provision_base_image() -> None:
    from rollbox.config import Paths
    from rollbox.images.debian import DEBIAN_IMAGE_ID
    from rollbox.images.store import ImageStore

    paths = Paths(TEST_HOME)
    paths.ensure()
    store = ImageStore(paths.images)
    if store.exists(DEBIAN_IMAGE_ID):
        return
    src = USER_HOME / "images" / DEBIAN_IMAGE_ID
    if (src / "meta.json").is_file() and USER_HOME != TEST_HOME:
        tmp = paths.images / (DEBIAN_IMAGE_ID + ".linking")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        # Hard links: the layer is read-only, so sharing inodes with the user's copy is safe.
        res = subprocess.run(["cp", "-al", str(src), str(tmp)], capture_output=True)
        if res.returncode == 0:
            tmp.rename(paths.images / DEBIAN_IMAGE_ID)
            return
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    store.ensure_debian()


@pytest.fixture(scope="session", autouse=True)
def _test_home(request: pytest.FixtureRequest) -> Iterator[Path]:
    needs_system = any(any(f"tests/{tier}" in str(item.fspath) for tier in ("system", "security", "distributed"))
                       for item in request.session.items)
    if needs_system and os.geteuid() == 0:
        _provision_base_image()
    yield TEST_HOME
    if needs_system:
        from rollbox.client.transport import stop_daemon
        from rollbox.config import Paths

        stop_daemon(Paths(TEST_HOME))
