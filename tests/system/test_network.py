"""Networking on real sandboxes: exposed ports, egress policy, what is never reachable, forks
with their own network identity, port allocation under concurrency, no leaks, daemon restarts.

"The outside" is a network namespace made by the `outside` fixture: a server on 198.18.0.2
and 198.18.1.2 (RFC 2544 benchmark addresses) and a fake metadata service on 169.254.169.254,
all routed from the host, so the tests need no Internet access.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import rollbox
from rollbox import Sandbox, SandboxInstance
from rollbox.network.netns import NetLayout
from rollbox.sdk.sandbox import default_client

EXT_NS = "rbtest-ext"
EXT_IF = "rbtestx0"
EXT_A, EXT_B, METADATA = "198.18.0.2", "198.18.1.2", "169.254.169.254"
EXT_PORT = 8080

# A server that answers each connection with the sandbox's host name (fresh in every copy).
HOSTNAME_SERVER = r"""
import http.server, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = socket.gethostname().encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
"""
REACH = ("import socket,sys\n"
         "try:\n s=socket.create_connection((sys.argv[1],int(sys.argv[2])),2); s.close(); print('reached')\n"
         "except OSError as e: print('blocked', e); sys.exit(3)\n")


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture(scope="module")
def outside() -> Iterator[None]:
    subprocess.run(["ip", "netns", "del", EXT_NS], capture_output=True)
    subprocess.run(["ip", "link", "del", EXT_IF], capture_output=True)
    _sh("ip", "netns", "add", EXT_NS)
    _sh("ip", "link", "add", EXT_IF, "type", "veth", "peer", "name", "eth0", "netns", EXT_NS)
    _sh("ip", "addr", "add", "198.18.0.1/24", "dev", EXT_IF)
    _sh("ip", "link", "set", EXT_IF, "up")
    for addr in (f"{EXT_A}/24", f"{EXT_B}/24", f"{METADATA}/32"):
        _sh("ip", "-n", EXT_NS, "addr", "add", addr, "dev", "eth0")
    _sh("ip", "-n", EXT_NS, "link", "set", "eth0", "up")
    _sh("ip", "-n", EXT_NS, "link", "set", "lo", "up")
    _sh("ip", "-n", EXT_NS, "route", "add", "default", "via", "198.18.0.1")
    for dst in ("198.18.1.0/24", f"{METADATA}/32"):
        _sh("ip", "route", "replace", dst, "via", EXT_A)
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{EXT_NS}", "python3", "-c",
         f"import http.server as h; h.ThreadingHTTPServer(('0.0.0.0', {EXT_PORT}), h.SimpleHTTPRequestHandler).serve_forever()"],
        cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection((EXT_B, EXT_PORT), 1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield
    finally:
        server.kill()
        server.wait()
        for dst in ("198.18.1.0/24", f"{METADATA}/32"):
            subprocess.run(["ip", "route", "del", dst], capture_output=True)
        subprocess.run(["ip", "link", "del", EXT_IF], capture_output=True)
        subprocess.run(["ip", "netns", "del", EXT_NS], capture_output=True)


def reaches(sb: SandboxInstance, host: str, port: int) -> bool:
    r = sb.exec("python3", "-c", REACH, host, str(port), timeout=20)
    assert r.exit_code in (0, 3), r.stderr
    return r.exit_code == 0


def get(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_get(url: str, deadline_s: float = 20.0) -> str:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return get(url)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def start_hostname_server(sb: SandboxInstance) -> str:
    sb.fs.write_file("/work/server.py", HOSTNAME_SERVER)
    assert sb.exec("sh", "-c", "python3 /work/server.py >/dev/null 2>&1 &").exit_code == 0
    url = sb.expose_port(8000)
    assert wait_get(url) == sb.sandbox_id
    return url


def net_slot(paths, sandbox_id: str) -> int:  # type: ignore[no-untyped-def]
    db = sqlite3.connect(str(paths.db))
    try:
        return int(db.execute("SELECT net_slot FROM sandboxes WHERE sandbox_id=?", (sandbox_id,)).fetchone()[0])
    finally:
        db.close()


def host_address() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((EXT_A, 9))
        return str(s.getsockname()[0])
    finally:
        s.close()


def prefixed(layout: NetLayout) -> tuple[list[str], list[str]]:
    nss = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
           if n.startswith(layout.prefix + "-")]
    links = [ln.split(":")[1].strip().split("@")[0] for ln in
             subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
             if ln.split(":")[1].strip().startswith(layout.prefix)]
    return nss, links


# ---- ports --------------------------------------------------------------------------------


def test_exposed_port_reaches_the_server_and_is_stable(make_sandbox) -> None:
    sb = make_sandbox(ports=[8000], memory=256)
    url = start_hostname_server(sb)
    assert url.startswith("http://127.0.0.1:")
    assert sb.expose_port(8000) == url  # twice: the same URL
    assert sb.list_urls() == {8000: url}
    assert sb.info().urls == {"8000": url}
    assert get(url) == sb.sandbox_id


def http_status(url: str) -> tuple[int, str]:
    """(status, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def listens_inside(sb: SandboxInstance, port: int, host: str = "127.0.0.1") -> None:
    for _ in range(100):
        if reaches(sb, host, port):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing came to listen on {host}:{port} in the sandbox")


def test_an_exposed_port_with_nothing_listening_answers_502_saying_so_gh19(make_sandbox) -> None:
    """It answered nothing (`RemoteDisconnected`); a server on 127.0.0.1 only looked the same."""
    sb = make_sandbox(ports=[8000], memory=256)
    url = sb.list_urls()[8000]
    status, body = http_status(url)
    assert status == 502, body
    assert f"nothing is listening on port 8000 of sandbox {sb.sandbox_id}" in body
    assert sb.exec("sh", "-c", "python3 -m http.server --bind 127.0.0.1 8000 >/dev/null 2>&1 &").exit_code == 0
    listens_inside(sb, 8000)
    status, body = http_status(url)
    assert status == 502, body
    assert "a server listens on 127.0.0.1:8000 only" in body and "Bind it to 0.0.0.0" in body


def _marked_connect(ip: str, port: int, mark: int) -> None:
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        s.settimeout(3)
        s.connect((ip, port))
    finally:
        s.close()


def test_only_exposed_ports_reach_a_sandbox_and_only_through_its_url_gh19(make_sandbox, paths) -> None:
    """A server on a port never exposed answered a host process connecting to the sandbox's
    uplink address; so did an exposed one, past rollbox's listener."""
    sb = make_sandbox(ports=[8000], memory=256)
    url = start_hostname_server(sb)  # 0.0.0.0:8000, exposed
    assert sb.exec("sh", "-c", "python3 -m http.server --bind 0.0.0.0 8001 >/dev/null 2>&1 &").exit_code == 0
    listens_inside(sb, 8001)  # 0.0.0.0:8001, never exposed
    layout = NetLayout.for_home(paths.home)
    slot = layout.slot(net_slot(paths, sb.sandbox_id))
    for port in (8000, 8001):  # from the host, straight to the uplink: refused either way
        with pytest.raises(OSError):
            socket.create_connection((slot.uplink_ip, port), 3).close()
    # Past the host's rule (a connection carrying rollbox's own mark), the sandbox's router
    # still forwards its exposed ports only.
    _marked_connect(slot.uplink_ip, 8000, layout.mark)
    with pytest.raises(OSError):
        _marked_connect(slot.uplink_ip, 8001, layout.mark)
    assert get(url) == sb.sandbox_id  # through its URL: served
    other = make_sandbox(block_network=False, memory=256)  # from another sandbox: neither
    assert not reaches(other, slot.uplink_ip, 8000) and not reaches(other, slot.uplink_ip, 8001)
    url2 = sb.expose_port(8001)  # exposed later: then reachable, and again only through its URL
    assert "Directory listing" in wait_get(url2)
    with pytest.raises(OSError):
        socket.create_connection((slot.uplink_ip, 8001), 3).close()


def test_bad_network_input_is_refused_before_anything_is_made(make_sandbox) -> None:
    before = len(default_client().request("GET", "/sandboxes"))
    for kw in ({"ports": [0]}, {"ports": [70000]}, {"block_network": False, "allow_list": ["10.0.0.0/33"]},
               {"block_network": False, "allow_list": ["not a name!"]}, {"allow_list": ["10.0.0.0/8"]},
               {"ports": list(range(1000, 1100))}, {"ports": ["80"]}, {"ports": [True]}, {"block_network": "no"},
               {"block_network": False, "allow_list": ["0x7f000001"]}, {"gpu": ""}):
        with pytest.raises(rollbox.InvalidArgument):
            Sandbox(**kw).create()  # type: ignore[arg-type]
    assert len(default_client().request("GET", "/sandboxes")) == before
    plain = make_sandbox(memory=256)
    with pytest.raises(rollbox.InvalidArgument, match="without networking"):
        plain.expose_port(8000)
    net = make_sandbox(ports=[8000], memory=256)
    with pytest.raises(rollbox.InvalidArgument, match="out of range"):
        net.expose_port(65536)
    with pytest.raises(rollbox.InvalidArgument, match="CIDR"):
        net.update_network_permissions(block_network=False, allow_list=["300.1.1.1/8"])


# ---- egress policy ------------------------------------------------------------------------


def test_egress_policy_default_open_allow_list_and_live_update(outside, make_sandbox) -> None:
    blocked = make_sandbox(ports=[8000], memory=256)  # networked, outbound blocked (the default)
    assert not reaches(blocked, EXT_A, EXT_PORT)
    open_ = make_sandbox(block_network=False, memory=256)
    assert reaches(open_, EXT_A, EXT_PORT) and reaches(open_, EXT_B, EXT_PORT)
    limited = make_sandbox(block_network=False, allow_list=["198.18.0.0/24"], memory=256)
    assert reaches(limited, EXT_A, EXT_PORT)
    assert not reaches(limited, EXT_B, EXT_PORT)
    # Live changes, both ways.
    limited.update_network_permissions(block_network=True)
    assert not reaches(limited, EXT_A, EXT_PORT)
    limited.update_network_permissions(block_network=False, allow_list=[f"{EXT_B}/32"])
    assert reaches(limited, EXT_B, EXT_PORT) and not reaches(limited, EXT_A, EXT_PORT)
    limited.update_network_permissions(block_network=False)
    assert reaches(limited, EXT_A, EXT_PORT)


def test_never_reachable_whatever_the_policy(outside, make_sandbox, paths) -> None:
    # A host service on all addresses, reachable from the host itself.
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(64)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                srv.accept()[0].close()
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        neighbour = make_sandbox(ports=[8000], memory=256)
        start_hostname_server(neighbour)
        sb = make_sandbox(block_network=False, memory=256)
        layout = NetLayout.for_home(paths.home)
        own = layout.slot(net_slot(paths, sb.sandbox_id))
        other = layout.slot(net_slot(paths, neighbour.sandbox_id))
        host = host_address()
        # Sanity: each target is really there, for the host.
        socket.create_connection((host, port), 2).close()
        socket.create_connection(("127.0.0.1", int(neighbour.list_urls()[8000].rsplit(":", 1)[1])), 2).close()
        socket.create_connection((METADATA, EXT_PORT), 2).close()
        assert reaches(sb, EXT_A, EXT_PORT)  # the policy is open
        assert not reaches(sb, host, port), "the host's own address"
        assert not reaches(sb, own.host_ip, port), "the host end of the sandbox's own link"
        assert not reaches(sb, "198.18.0.1", port), "the host's address on another interface"
        assert not reaches(sb, other.uplink_ip, 8000), "another sandbox"
        assert not reaches(sb, METADATA, EXT_PORT), "link-local metadata"
        # Even an allow list naming them does not open them.
        sb.update_network_permissions(block_network=False,
                                      allow_list=[f"{host}/32", "169.254.0.0/16", "100.64.0.0/10"])
        assert not reaches(sb, host, port)
        assert not reaches(sb, METADATA, EXT_PORT)
        assert not reaches(sb, other.uplink_ip, 8000)
        # The daemon's API is a unix socket under a 0700 directory, not a network address.
        r = sb.exec("sh", "-c", f"ls {paths.home} 2>&1; echo rc=$?")
        assert b"rc=0" not in r.stdout or str(paths.socket).encode() not in r.stdout
    finally:
        stop.set()
        t.join()
        srv.close()


# ---- snapshots and forks ------------------------------------------------------------------


def test_sixteen_forks_each_answer_with_their_own_identity(make_sandbox) -> None:
    sb = make_sandbox(ports=[8000], memory=256)
    start_hostname_server(sb)
    kids = sb.fork(16, keep_warm_seconds=120)
    try:
        urls = [k.list_urls()[8000] for k in kids]
        assert len(set(urls)) == 16 and sb.list_urls()[8000] not in urls
        with ThreadPoolExecutor(16) as ex:
            answers = list(ex.map(wait_get, urls))
        assert answers == [k.sandbox_id for k in kids]
        assert get(sb.list_urls()[8000]) == sb.sandbox_id  # the source still answers for itself
    finally:
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda k: k.terminate(), kids))


def test_restored_copies_get_a_fresh_identity(make_sandbox) -> None:
    sb = make_sandbox(ports=[8000], memory=256)
    snap = sb.snapshot_memory()
    time.sleep(2.0)
    copies = [Sandbox().create_from_memory_snapshot(snap) for _ in range(2)]
    try:
        seen = []
        for c in copies:
            r = sb_exec = c.exec("sh", "-c", "hostname; echo $ROLLBOX_SANDBOX_ID; "
                                            "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s.%N")
            host, sid, rnd, clock = sb_exec.text().split("\n")[:4]
            assert r.exit_code == 0
            assert host == sid == c.sandbox_id
            assert abs(float(clock) - time.time()) < 2.0, "the wall clock reads the real time after restore"
            seen.append(rnd)
        assert seen[0] != seen[1]
        forks = sb.fork(2)
        try:
            assert [f.exec("sh", "-c", "echo $ROLLBOX_FORK_INDEX").text().strip() for f in forks] == ["0", "1"]
        finally:
            for f in forks:
                f.terminate()
    finally:
        for c in copies:
            c.terminate()
        default_client().request("DELETE", f"/snapshots/{snap}")


def test_pause_resume_keeps_the_url(make_sandbox) -> None:
    sb = make_sandbox(ports=[8000], memory=256)
    url = start_hostname_server(sb)
    sb.pause()
    sb.resume()
    assert sb.list_urls()[8000] == url
    assert wait_get(url) == sb.sandbox_id


# ---- allocation, leaks, restarts ----------------------------------------------------------


RESTORES = int(os.environ.get("ROLLBOX_NET_RESTORES", "32"))  # 64 is the size


def test_concurrent_restores_get_distinct_ports_released_at_the_end(make_sandbox) -> None:
    src = make_sandbox(ports=[8000], memory=256)
    snap = src.snapshot_memory()
    try:
        with ThreadPoolExecutor(RESTORES) as ex:
            sbs = list(ex.map(lambda _: Sandbox(memory=256).create_from_memory_snapshot(snap), range(RESTORES)))
        try:
            ports = [int(s.list_urls()[8000].rsplit(":", 1)[1]) for s in sbs]
            assert len(set(ports)) == RESTORES
        finally:
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(lambda s: s.terminate(), sbs))
        for p in ports:  # every listener is gone: the port can be bound again
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
            finally:
                s.close()
    finally:
        default_client().request("DELETE", f"/snapshots/{snap}")


CYCLES = int(os.environ.get("ROLLBOX_NET_CYCLES", "30"))


def test_networked_create_destroy_cycles_leave_nothing(paths) -> None:
    layout = NetLayout.for_home(paths.home)
    for _ in range(CYCLES):
        sb = Sandbox(ports=[8000], block_network=False, allow_list=["198.18.0.0/24"], memory=256).create()
        sb.terminate()
    health = default_client().request("GET", "/health")["network"]
    assert health["in_use"] == 0 and health["ports"] == 0
    nss, links = prefixed(layout)
    # Only the pool's prepared slots remain (two namespaces and one host link each).
    assert len(nss) == 2 * health["ready"] and len(links) == health["ready"], (nss, links, health)
    rules = subprocess.run(["nft", "-j", "list", "map", "inet", layout.table, "egress"],
                           capture_output=True, text=True).stdout
    elems = json.loads(rules)["nftables"][1]["map"].get("elem", [])
    assert len(elems) == health["ready"]


def _daemon_pid(paths) -> int:  # type: ignore[no-untyped-def]
    return int(paths.daemon_lock.read_text().strip())


def test_daemon_restart_keeps_urls_and_policy_and_crash_cleans_slots(outside, paths) -> None:
    sb = Sandbox(ports=[8000], block_network=False, allow_list=["198.18.0.0/24"], memory=256).create()
    try:
        url = start_hostname_server(sb)
        layout = NetLayout.for_home(paths.home)
        os.kill(_daemon_pid(paths), signal.SIGKILL)  # a crash: ready slots are left behind
        time.sleep(0.5)
        assert sb.exec("true").exit_code == 0  # a fresh daemon re-attaches
        assert sb.list_urls()[8000] == url
        assert wait_get(url) == sb.sandbox_id
        assert reaches(sb, EXT_A, EXT_PORT) and not reaches(sb, EXT_B, EXT_PORT)
        nss, links = prefixed(layout)
        health = default_client().request("GET", "/health")["network"]
        assert len(links) == 1 + health["ready"], (links, health)  # the crash's spare slots are gone
    finally:
        sb.terminate()
    from rollbox.client.transport import stop_daemon
    stop_daemon(paths)
    assert prefixed(layout) == ([], [])
    assert subprocess.run(["nft", "list", "table", "inet", layout.table], capture_output=True).returncode != 0


def test_blocked_lookup_fails_at_once_in_a_networked_sandbox(make_sandbox) -> None:
    # gVisor's netstack does not pass the firewall's ICMP reject to a UDP socket: a lookup
    # sent to the host's nameserver waited 10 s for the resolver's timeouts (new-user trial).
    sb = make_sandbox(memory=256, ports=[8000])
    code = "import socket\ntry:\n socket.getaddrinfo('pypi.org', 443)\nexcept OSError as e: print(type(e).__name__)"
    r = sb.exec("python3", "-c", code, timeout=30)
    assert r.stdout.strip() == b"gaierror" and r.duration_s < 3.0, r
    sb.update_network_permissions(block_network=False)
    assert b"127.0.0.1" not in sb.exec("cat", "/etc/resolv.conf").stdout  # the host's nameservers again
