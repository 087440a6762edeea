from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rollbox.client.transport import stop_daemon
from rollbox.config import Paths
from tests.system.conftest import make_sandbox, paths, sandbox, side_home  # noqa: F401 - shared fixtures


@dataclass(frozen=True)
class TcpDaemon:
    url: str
    token: str
    paths: Paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tcp_daemon(paths) -> Iterator[TcpDaemon]:  # type: ignore[no-untyped-def]
    """A second daemon on its own state directory, listening on loopback TCP with a token."""
    p = side_home(paths, "tcp")
    home = p.home
    stop_daemon(p)
    (home / "token").unlink(missing_ok=True)
    port = _free_port()
    env = dict(os.environ, ROLLBOX_HOME=str(home))
    env.pop("ROLLBOX_TOKEN", None)
    with open(p.daemon_log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rollbox", "serve", "--listen", f"127.0.0.1:{port}"],
                                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 401:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError(f"the TCP daemon did not start: {p.daemon_log.read_text()[-2000:]}")
    daemon = TcpDaemon(url, (home / "token").read_text().strip(), p)
    yield daemon
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {daemon.token}"}, timeout=60) as c:
        for sb in c.get("/sandboxes").json():
            c.delete(f"/sandboxes/{sb['sandbox_id']}")
    stop_daemon(p)
    proc.wait(timeout=30)
