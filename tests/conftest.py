"""Test-session set-up shared by every tier.

Tiers are the directories under tests/, and each test is marked with its tier here
(`pytest_collection_modifyitems`): `unit`, `system`, `security`, `load`, `distributed`. Every
tier but `unit` needs root and runsc and is also marked `system`, so `pytest -m "not system"`
(or `-m unit`) runs the fast tier alone, without root.

The suite never touches the user's state: it runs its own daemon on its own state directory
(`ROLLBOX_TEST_HOME`, default /var/lib/rollbox-test), whose base image is hard-linked from the
user's (`ROLLBOX_HOME`, built by `make setup`) or built once. At the end of a session that ran
real sandboxes, `check_no_leftovers` looks on the host for anything a test sandbox made and
fails the run when it finds some; then the test daemon is stopped. Sandboxes and snapshots the
user made are never seen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.config import DEFAULT_HOME

from tests.system.leaks import check_no_leftovers

TESTS = Path(__file__).parent
TIERS = ("unit", "system", "security", "load", "distributed")

USER_HOME = Path(os.environ.get("ROLLBOX_HOME", DEFAULT_HOME))
TEST_HOME = Path(os.environ.get("ROLLBOX_TEST_HOME", "/var/lib/rollbox-test"))
os.environ["ROLLBOX_HOME"] = str(TEST_HOME)
os.environ.pop("ROLLBOX_URL", None)
os.environ.pop("ROLLBOX_TOKEN", None)
# A canary in the environment the test daemon inherits: no sandbox may ever see it.
os.environ.setdefault("ROLLBOX_TEST_CANARY", "daemon-env-canary-" + os.urandom(6).hex())
# The test daemon logs at debug: tests/security/test_policies.py checks what that never prints.
os.environ.setdefault("ROLLBOX_LOG_LEVEL", "debug")


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


def tier_of(item: pytest.Item) -> str | None:
    """The tier (the directory under tests/) a collected test belongs to, or None."""
    try:
        top = item.path.relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if tier is None:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if tier != "unit":
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session", autouse=True)
def _test_home(request: pytest.FixtureRequest) -> Iterator[Path]:
    needs_system = any(item.get_closest_marker("system") is not None for item in request.session.items)
    if needs_system and os.geteuid() == 0:
        _provision_base_image()
    yield TEST_HOME
    if needs_system:
        from rollbox.client.transport import stop_daemon
        from rollbox.config import Paths

        try:
            # Last of the session's fixtures to end (the first set up), so every other
            # fixture's sandboxes are gone by now: what is left leaked.
            if os.geteuid() == 0 and shutil.which("runsc") is not None:
                check_no_leftovers(Paths(TEST_HOME))
        finally:
            stop_daemon(Paths(TEST_HOME))
