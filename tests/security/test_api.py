"""API security: who can reach the daemon, and what a fuzzer finds in its API."""

from __future__ import annotations

import os
import stat

import httpx
import pytest

import rollbox
from rollbox.client.transport import Client


def test_unix_socket_is_root_only(paths) -> None:  # type: ignore[no-untyped-def]
    Client().request("GET", "/health")  # make sure the daemon is up
    assert stat.S_IMODE(os.stat(paths.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(paths.home).st_mode) == 0o700


def test_tcp_listener_refuses_without_the_token(tcp_daemon) -> None:  # type: ignore[no-untyped-def]
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": tcp_daemon.token},
                    {"authorization": f"Basic {tcp_daemon.token}"}):
        for method, path in (("GET", "/health"), ("GET", "/sandboxes"), ("POST", "/sandboxes"),
                             ("GET", "/openapi.json"), ("DELETE", "/snapshots/sn-x")):
            r = httpx.request(method, tcp_daemon.url + path, headers=headers, timeout=10)
            assert r.status_code == 401, (headers, method, path, r.text)
            assert r.json()["code"] == "unauthorized"
    with pytest.raises(rollbox.Unauthorized):
        Client(tcp_daemon.url, token="wrong").request("GET", "/sandboxes")
    with pytest.raises(rollbox.Unauthorized):
        Client(tcp_daemon.url, token="").request("GET", "/sandboxes")


def test_tcp_listener_serves_with_the_token(tcp_daemon) -> None:  # type: ignore[no-untyped-def]
    c = Client(tcp_daemon.url, token=tcp_daemon.token)
    assert c.request("GET", "/health")["ok"]
    sb = rollbox.Sandbox(memory=256, client=c).create()
    try:
        assert sb.exec("echo", "remote").stdout == b"remote\n"
    finally:
        sb.terminate()
    # The local door of the same daemon needs no token: the socket's mode is the check.
    assert Client(paths=tcp_daemon.paths, autostart=False).request("GET", "/health")["ok"]
    assert stat.S_IMODE(os.stat(tcp_daemon.paths.home / "token").st_mode) == 0o600


# Generated examples per operation. Small: a valid POST /sandboxes boots a real sandbox, and
# idle gVisor sandboxes still cost CPU on a 2-core machine.
SCHEMATHESIS_EXAMPLES = int(os.environ.get("ROLLBOX_FUZZ_EXAMPLES", "3"))


def test_schemathesis_finds_no_server_error_or_hang(tcp_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Fuzzes every operation of the daemon's own OpenAPI spec (bounded examples per operation,
    each request bounded in time): no 5xx, no timeout. The daemon must still answer after."""
    import shutil
    import subprocess
    import sys

    st = shutil.which("schemathesis") or str(os.path.join(os.path.dirname(sys.executable), "schemathesis"))
    res = subprocess.run(
        [st, "run", f"{tcp_daemon.url}/openapi.json", "-H", f"Authorization: Bearer {tcp_daemon.token}",
         "--checks", "not_a_server_error", "--max-examples", str(SCHEMATHESIS_EXAMPLES), "--workers", "1",
         "--request-timeout", "90", "--seed", "1", "--phases", "fuzzing", "--max-failures", "10",
         "--report", "junit", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)  # its cache stays out of the tree
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert Client(tcp_daemon.url, token=tcp_daemon.token).request("GET", "/health")["ok"]
