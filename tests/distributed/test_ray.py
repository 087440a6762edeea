"""The Ray backend on a real two-node Ray cluster on this machine, with real gVisor sandboxes.

The cluster: `ray start --head` and a second `ray start --address=...`, each with its own CPU
count, a custom resource naming it, and its own rollbox state directory (ROLLBOX_HOME in the
raylet's environment, which the node actor inherits). Ports and `--temp-dir` are this test's
own, and teardown stops exactly the processes under that temp dir (never `ray stop`, which
would stop every Ray on the machine). Base images are hard-linked into both homes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

if os.geteuid() != 0 or shutil.which("runsc") is None:
    pytest.skip("the Ray backend tests need root and gVisor runsc (run `make setup`)", allow_module_level=True)
ray = pytest.importorskip("ray", reason="the Ray backend tests need Ray: pip install 'rollbox[ray]'")

import rollbox  # noqa: E402
import rollbox.distributed  # noqa: E402
from rollbox import Sandbox, SandboxPool  # noqa: E402
from rollbox.client.transport import Client, daemon_running, stop_daemon  # noqa: E402
from rollbox.config import DEFAULT_HOME, Paths  # noqa: E402
from rollbox.distributed import transfer  # noqa: E402
from rollbox.images.debian import DEBIAN_IMAGE_ID  # noqa: E402
from rollbox.sdk.backends import set_default_backend  # noqa: E402
from rollbox.sdk.sandbox import default_client  # noqa: E402

pytestmark = pytest.mark.system

# Ray 2.60 turns token auth on once ~/.ray/auth_token exists (any earlier local ray.init writes
# it), and a second `ray start` then failed to reach the head's GCS: these throwaway local
# clusters run without it, in this process and in the `ray start` children.
os.environ["RAY_AUTH_MODE"] = "disabled"
N1 = Path(os.environ.get("ROLLBOX_RAY_N1", "/var/lib/rollbox-ray-n1"))
N2 = Path(os.environ.get("ROLLBOX_RAY_N2", "/var/lib/rollbox-ray-n2"))
RAY_BIN = str(Path(sys.executable).parent / "ray")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _provision(home: Path) -> None:
    """The Debian base image, hard-linked from the user's (or the test home's) store."""
    Paths(home).ensure()
    dest = home / "images" / DEBIAN_IMAGE_ID
    if (dest / "meta.json").is_file():
        return
    for src_home in (Path(os.environ.get("ROLLBOX_USER_HOME", DEFAULT_HOME)), Paths.from_env().home):
        src = src_home / "images" / DEBIAN_IMAGE_ID
        if (src / "meta.json").is_file():
            tmp = dest.with_name(DEBIAN_IMAGE_ID + ".linking")
            subprocess.run(["rm", "-rf", str(tmp)], check=True)
            subprocess.run(["cp", "-al", str(src), str(tmp)], check=True)
            tmp.rename(dest)
            return
    pytest.skip("no Debian base image to link (run `make setup`)")


def _processes_under(needle: bytes) -> set[int]:
    """Our Ray processes: those whose command line names our temp dir, and their descendants."""
    kids: dict[int, list[int]] = {}
    roots = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{p}/cmdline").read_bytes():
                roots.append(int(p))
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(p))
        except (OSError, ValueError, IndexError):
            pass
    out: set[int] = set()
    stack = roots
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack += kids.get(pid, [])
    return out


def _stop_ray(temp_dir: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _processes_under(str(temp_dir).encode())
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if Path(f"/proc/{p}").exists()}
            time.sleep(0.1)


def _ray_start(home: Path, args: list[str], temp_dir: Path) -> None:
    ports = _free_ports(7)
    # Worker ports below the kernel's ephemeral range, which the ports above come from (CI: a
    # worker range of 39200-39299 held the dashboard agent's 39203 and `ray start` refused).
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    base = 10000 + secrets.randbelow(max(1, (low - 10100) // 100)) * 100
    argv = [RAY_BIN, "start", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats",
            f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}",
            f"--dashboard-agent-listen-port={ports[2]}", f"--dashboard-agent-grpc-port={ports[3]}",
            f"--runtime-env-agent-port={ports[4]}", f"--metrics-export-port={ports[5]}",
            f"--min-worker-port={base}", f"--max-worker-port={base + 99}", "--object-store-memory=300000000", *args]
    env = dict(os.environ, ROLLBOX_HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """A two-node Ray cluster; yields {"n1": node id, "n2": node id}."""
    for home in (N1, N2):
        _provision(home)
    temp_dir = Path(f"/tmp/rbray-{secrets.token_hex(3)}")
    port = _free_ports(1)[0]
    try:
        _ray_start(N1, ["--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                        f"--dashboard-port={_free_ports(1)[0]}", '--resources={"rollbox_n1": 1}'], temp_dir)
        _ray_start(N2, [f"--address=127.0.0.1:{port}", "--num-cpus=1", '--resources={"rollbox_n2": 1}'], temp_dir)
        rollbox.init(address=f"127.0.0.1:{port}")
        ids: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while len(ids) < 2 and time.monotonic() < deadline:
            for n in ray.nodes():
                for name in ("n1", "n2"):
                    if n["Alive"] and f"rollbox_{name}" in n["Resources"]:
                        ids[name] = n["NodeID"]
            time.sleep(0.2)
        assert len(ids) == 2, ray.nodes()
        yield ids
    finally:
        rollbox.distributed._configured.clear()
        set_default_backend(None)  # undo rollbox.init()
        if ray.is_initialized():
            ray.shutdown()
        _stop_ray(temp_dir)
        for home in (N1, N2):
            stop_daemon(Paths(home))
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def snapshot_id(cluster) -> Iterator[str]:  # type: ignore[no-untyped-def]
    sb = Sandbox(memory=256).create()
    try:
        snap = sb.snapshot_memory()
    finally:
        sb.terminate()
    yield snap
    default_client().request("DELETE", f"/snapshots/{snap}")
    for home in (N1, N2):
        try:
            Client(paths=Paths(home), autostart=False).request("DELETE", f"/snapshots/{snap}")
        except rollbox.RollboxError:
            pass


def square(sb, task):  # type: ignore[no-untyped-def]
    if task % 16 == 5:
        raise ValueError("episode code failed")
    r = sb.exec("expr", str(task), "*", str(task), timeout=30)
    return {"reward": 1.0, "out": int(r.text())}


def host_traces(paths: Paths, sandbox_id: str) -> list[str]:
    """What is left on the host of one sandbox: its directory, mounts, processes."""
    cid = sandbox_id.removeprefix("sb-")
    out = [f"dir {paths.sandboxes / sandbox_id}"] if (paths.sandboxes / sandbox_id).exists() else []
    with open("/proc/self/mounts") as f:
        out += [f"mount {line.split()[1]}" for line in f if sandbox_id in line.split()[1]]
    out += [f"process {p.pid}" for p in psutil.process_iter(["cmdline"]) if any(cid in a for a in p.info["cmdline"] or ())]
    return out


def _live_sandboxes(home: Path) -> list[str]:
    return [i["sandbox_id"] for i in Client(paths=Paths(home), autostart=False).request("GET", "/sandboxes")]


def test_two_nodes_run_a_batch_like_the_local_backend(cluster, snapshot_id) -> None:  # type: ignore[no-untyped-def]
    tasks = list(range(32))
    with SandboxPool(snapshot_id, max_concurrency=8, backend="local") as pool:
        local = list(pool.map(square, tasks, timeout=60, ordered=True, progress=False))
    with SandboxPool(snapshot_id, max_concurrency=8, backend="ray") as pool:
        remote = list(pool.map(square, tasks, timeout=60, ordered=True, progress=False))
        sent = pool._remote.cluster.sent
    key = [(r.index, r.status, r.value, r.reward) for r in local]
    assert key == [(r.index, r.status, r.value, r.reward) for r in remote]
    assert {r.status for r in remote} == {"ok", "error"} and remote[7].value == {"reward": 1.0, "out": 49}
    assert {r.node for r in local} == {"local"}
    per_node = {name: sum(r.node == nid for r in remote) for name, nid in cluster.items()}
    assert per_node["n1"] > 0 and per_node["n2"] > 0, per_node
    # The snapshot went to each node once (the base image was already there); a second pool
    # on it sends nothing.
    assert {n: [i.kind for i in items] for n, items in sent.items()} == {cluster["n1"]: ["snapshot"],
                                                                          cluster["n2"]: ["snapshot"]}
    with SandboxPool(snapshot_id, max_concurrency=2) as pool:  # rollbox.init made "ray" the default
        again = list(pool.map(square, [3, 4], timeout=60, ordered=True, progress=False))
        assert pool._remote is not None and pool._remote.cluster.sent == {}
    assert [r.value["out"] for r in again] == [9, 16]
    for home in (N1, N2):
        assert _live_sandboxes(home) == []


def test_container_pools_on_ray_keep_their_runtime_gh15(cluster, snapshot_id) -> None:  # type: ignore[no-untyped-def]
    """isolation="container" with runtime="runc" reaches the nodes' pools: every episode ran in
    a container of a pooled runc sandbox there (the host kernel's uname, not gVisor's)."""
    def kernel(sb, task):  # type: ignore[no-untyped-def]
        return sb.exec("cat", "/proc/version", timeout=30).text()
    host = open("/proc/version").read()
    with SandboxPool(snapshot_id, max_concurrency=4, backend="ray", isolation="container", runtime="runc") as pool:
        res = list(pool.map(kernel, range(8), timeout=60, ordered=True, progress=False))
    assert [r.status for r in res] == ["ok"] * 8, [r.error for r in res]
    assert {r.value for r in res} == {host}
    assert {r.node for r in res} <= set(cluster.values())
    for home in (N1, N2):
        assert _live_sandboxes(home) == []


def slow(sb, task):  # type: ignore[no-untyped-def]
    r = sb.exec("sleep", "3", timeout=30)
    return float(r.exit_code == 0)


def test_killed_node_daemon_mid_batch_retries_on_the_other_node(cluster, snapshot_id) -> None:  # type: ignore[no-untyped-def]
    n2 = Paths(N2)
    old_pid = int(n2.daemon_lock.read_text())
    results = []
    killed_at = None
    with SandboxPool(snapshot_id, max_concurrency=6, backend="ray") as pool:
        for res in pool.map(slow, range(12), timeout=60, retries=2, progress=False):
            results.append(res)
            if killed_at is None:
                # Episodes are mid-`sleep` on both nodes: kill node 2's daemon under them.
                os.kill(old_pid, signal.SIGKILL)
                killed_at = len(results)
    assert sorted(r.index for r in results) == list(range(12))
    assert all(r.status == "ok" and r.reward == 1.0 for r in results), [(r.status, r.error) for r in results]
    retried = [r for r in results if r.attempts > 1]
    assert retried, "no episode was in flight on node 2 when its daemon died"
    lost_sandboxes = []
    for r in retried:
        first = r.extra["attempts"][0]
        assert first["node"] == cluster["n2"] and first["status"] == "infra_error", r.extra
        assert "DaemonUnavailable" in first["error"] or "SandboxLost" in first["error"], first
        assert r.node == cluster["n1"]  # retried on the other node
        lost_sandboxes += [a["sandbox_id"] for a in r.extra["attempts"][:-1] if a["sandbox_id"]]
    # The node actor restarted the daemon; the restarted daemon re-adopted the lost episodes'
    # sandboxes and the actor ended them: nothing of theirs is left on the host.
    assert daemon_running(n2) and int(n2.daemon_lock.read_text()) != old_pid
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (any(host_traces(n2, s) for s in lost_sandboxes) or _live_sandboxes(N2)):
        time.sleep(0.5)
    assert [host_traces(n2, s) for s in lost_sandboxes] == [[] for _ in lost_sandboxes]
    assert _live_sandboxes(N2) == []
    info = ray.get(ray.get_actor(f"rollbox-node-{cluster['n2']}").info.remote())
    assert info.restarts >= 1 and info.home == str(N2)


def test_hung_node_is_given_up_after_the_timeout_and_retried(cluster, snapshot_id, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A node actor that stops answering (SIGSTOP: alive to Ray, but hung) does not hang the
    map: its attempts are given up `timeout + ATTEMPT_GRACE_S` after they started and retried
    on the other node, as infrastructure faults."""
    from rollbox.distributed import backend as ray_backend

    monkeypatch.setattr(ray_backend, "ATTEMPT_GRACE_S", 4.0)
    actor = ray.get_actor(f"rollbox-node-{cluster['n2']}")
    pid = ray.get(actor.info.remote()).actor_pid
    assert pid > 0
    results = []
    stopped = False
    try:
        with SandboxPool(snapshot_id, max_concurrency=4, backend="ray") as pool:
            for res in pool.map(slow, range(8), timeout=8, retries=2, progress=False):
                results.append(res)
                if not stopped:
                    os.kill(pid, signal.SIGSTOP)
                    stopped = True
            # Resumed before the pool closes: closing asks every node, the hung one included.
            os.kill(pid, signal.SIGCONT)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert sorted(r.index for r in results) == list(range(8))
    assert all(r.status == "ok" for r in results), [(r.status, r.error) for r in results]
    given_up = [r for r in results if r.attempts > 1]
    assert given_up, "no episode was in flight on node 2 when its actor stopped"
    for r in given_up:
        first = r.extra["attempts"][0]
        assert first["node"] == cluster["n2"] and "did not answer" in first["error"], r.extra
        assert r.node == cluster["n1"]


def quick(sb, task):  # type: ignore[no-untyped-def]
    return float(sb.exec("true").exit_code == 0)


def test_restarted_node_actor_gets_the_pool_again(cluster, snapshot_id) -> None:  # type: ignore[no-untyped-def]
    """A node actor that dies between two maps of one pool is restarted by Ray without the
    pool; the next map reopens it there instead of failing, and no attempt is spent on it."""
    actor = ray.get_actor(f"rollbox-node-{cluster['n2']}")
    with SandboxPool(snapshot_id, max_concurrency=4, backend="ray") as pool:
        first = list(pool.map(quick, range(4), timeout=60, progress=False))
        assert all(r.status == "ok" for r in first), [(r.status, r.error) for r in first]
        old = ray.get(actor.info.remote()).actor_pid
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:  # calls fail until Ray has restarted the actor
            try:
                if ray.get(actor.info.remote(), timeout=30).actor_pid != old:
                    break
            except ray.exceptions.RayActorError:
                pass
            assert time.monotonic() < deadline, "Ray did not restart the node actor"
            time.sleep(0.5)
        second = list(pool.map(quick, range(8), timeout=60, retries=0, progress=False))
    assert all(r.status == "ok" and r.attempts == 1 for r in second), [(r.status, r.error) for r in second]
    assert {r.node for r in second} == {cluster["n1"], cluster["n2"]}


@rollbox.function(memory=256, timeout=60, backend="ray")
def cube(x: int) -> int:
    return x ** 3


@rollbox.function(memory=256, timeout=60, backend="ray")
def boom(x: int) -> float:
    return 1 / x


def test_function_on_ray(cluster) -> None:  # type: ignore[no-untyped-def]
    assert cube.remote(3) == 27
    assert list(cube.map([1, 2, 3, 4], max_concurrency=4)) == [1, 8, 27, 64]
    with pytest.raises(ZeroDivisionError):
        boom.remote(0)


def test_unknown_snapshot_on_ray_is_a_clear_error(cluster) -> None:  # type: ignore[no-untyped-def]
    with SandboxPool("sn-" + "e" * 24, max_concurrency=1, backend="ray") as pool:
        with pytest.raises(rollbox.SnapshotNotFound):
            list(pool.map(square, [1], progress=False))


def test_transfer_is_content_addressed(cluster, snapshot_id, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Through a shared directory: packed once, a node that has the item skips it."""
    items = transfer.items_for_snapshot(Paths.from_env(), snapshot_id)
    assert [i.kind for i in items] == ["image", "snapshot"] and items[0].key == DEBIAN_IMAGE_ID
    assert transfer.missing(Paths(N1), items) == []
    tar = transfer.pack(Paths.from_env(), items[1], tmp_path / "snap.tar")
    assert transfer.unpack(Paths(N1), items[1], tar) is False  # already there: nothing done
    assert json.loads((N1 / "snapshots" / snapshot_id / "meta.json").read_text())["snapshot_id"] == snapshot_id
