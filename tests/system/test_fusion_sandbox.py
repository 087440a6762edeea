"""`rollbox serve-fusion --isolation sandbox` end to end: every request in a fresh gVisor
sandbox restored from the warm snapshot (not a container in a pooled one), through raw HTTP
and the PyPI `sandbox-fusion` client: success, a timeout, a real out-of-memory kill, and no
state carried from one request to the next."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sandbox_fusion import CommandRunStatus, RunStatus, run_code

from .test_fusion import Server, code, serve_fusion

# Ten 100 MiB chunks, each written when made: 1000 MiB of pages in a sandbox of 512 MiB. Small
# chunks, so that no single allocation is refused up front (MemoryError): the pages are really
# used and the sandbox's memory fills.
HOG = "chunks = []\nfor i in range(10):\n    chunks.append(bytearray(100 << 20))\n    print(i, flush=True)\nprint('survived')\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("fusion-sandbox") / "serve-fusion.log"
    with serve_fusion(log, "--isolation", "sandbox", "--concurrency", "2", "--memory", "512") as srv:
        yield srv


def test_success_through_the_client(server: Server) -> None:
    r = run_code(code("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="2 40"))
    assert r.status == RunStatus.Success and r.message == ""
    assert (r.run_result.status, r.run_result.return_code, r.run_result.stdout) == (CommandRunStatus.Finished, 0, "42\n")
    r = run_code(code("echo from bash; exit 3", "bash"))
    assert r.status == RunStatus.Failed
    assert (r.run_result.status, r.run_result.return_code, r.run_result.stdout) == (CommandRunStatus.Finished, 3,
                                                                                    "from bash\n")


def test_time_limit_exceeded_then_the_next_request_runs(server: Server) -> None:
    t = time.monotonic()
    r = run_code(code("import time\nprint('started', flush=True)\ntime.sleep(60)", run_timeout=1))
    assert time.monotonic() - t < 30  # killed at its timeout, not at the sleep's end
    assert r.status == RunStatus.Failed
    assert (r.run_result.status, r.run_result.return_code) == (CommandRunStatus.TimeLimitExceeded, None)
    assert r.run_result.stdout == "started\n"  # what it printed before the kill comes back
    ok = run_code(code("print('next')"))
    assert ok.status == RunStatus.Success and ok.run_result.stdout == "next\n"


def test_no_state_leaks_between_requests(server: Server) -> None:
    """A file written anywhere, a background process and an exported variable of one request
    are gone in the next: each runs in a sandbox of its own, fresh from the snapshot."""
    body = server.post("/run_code", json={"language": "bash", "code": (
        "echo secret > /tmp/leak; echo secret > leak.txt; export LEAK=1; echo LEAK=1 >> ~/.bashrc\n"
        "nohup sleep 300 >/dev/null 2>&1 &\necho planted")}).json()
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "planted\n"
    first = body["executor_pod_name"]
    body = server.post("/run_code", json={"language": "bash", "code": (
        "ls /tmp/leak leak.txt 2>&1 | wc -l; test -e /tmp/leak && echo LEAKED; test -e leak.txt && echo LEAKED\n"
        "grep -q LEAK ~/.bashrc 2>/dev/null && echo LEAKED; echo \"LEAK=${LEAK:-}\"\n"
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 300' || true")}).json()
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "2\nLEAK=\n0\n"  # two "No such file" lines, nothing else
    assert body["executor_pod_name"] != first  # another sandbox


def test_out_of_memory_is_killed_137_and_the_server_goes_on(server: Server) -> None:
    """A program whose pages fill the sandbox's memory is killed by the agent's OOM watcher:
    run_result Error, return code 137 (128 + SIGKILL), the response's message says out of
    memory; what it printed before comes back, and the next request runs normally."""
    body = server.post("/run_code", json={"language": "python", "code": HOG, "run_timeout": 60}).json()
    assert body["status"] == "Failed", body
    rr = body["run_result"]
    assert (rr["status"], rr["return_code"]) == ("Error", 137), body
    assert body["message"].startswith("out of memory"), body
    printed = rr["stdout"].split()
    assert "survived" not in printed and printed == [str(i) for i in range(len(printed))] and len(printed) >= 2
    ok = run_code(code("print(sum(range(10)))"))
    assert ok.status == RunStatus.Success and ok.run_result.stdout == "45\n"
