"""Network namespaces for sandboxes: the address plan and one slot's set-up and removal.

Why two namespaces per sandbox (see ../shared/PLATFORM.md, Networking): gVisor's netstack
takes the addresses of the interface in its namespace, and a memory snapshot restores the
netstack *with* the addresses it captured (runsc 20240729 restored into a namespace with other
addresses came up with loopback only). So every sandbox namespace ("S") is identical inside
(eth0 = SANDBOX_IP, same MACs), which makes any snapshot restorable into any slot, and a
per-sandbox router namespace ("R") between S and the host gives the copy a unique address:

    host: <prefix><i>  (uplink_ip - 1)  <-veth->  R: up (uplink_ip)   NAT   sb (GATEWAY_IP)  <-veth->  S: eth0 (SANDBOX_IP)

R masquerades the sandbox's outbound traffic to its uplink address and forwards to the sandbox
(DNAT) only what the host end sends to the uplink address for an exposed port; anything else
to the uplink is refused there. The host's rollbox table (firewall.py) decides what the
uplinks may reach, and lets only rollbox's own port listeners (their connections carry the
layout's `mark`) open connections to them. Netlink goes through pyroute2; sysctls and R's NAT table
through `nsenter` + `sysctl`/`nft`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute, NetNS, config as pyroute2_config, netns
from pyroute2.netlink.exceptions import NetlinkError

from ..errors import RuntimeMissing

SANDBOX_IP = "172.31.255.2"
GATEWAY_IP = "172.31.255.1"
SANDBOX_PREFIXLEN = 30
# Fixed, locally administered MACs: a restored netstack keeps the MAC it captured.
SANDBOX_MAC = "02:72:62:00:00:02"
GATEWAY_MAC = "02:72:62:00:00:01"
NETNS_DIR = Path("/run/netns")
# 100.64.0.0/10 (RFC 6598 shared address space) holds every daemon's uplinks; one /18 block per
# daemon (4096 slots of a /30 each), chosen from its state directory.
UPLINK_SPACE = ipaddress.IPv4Network("100.64.0.0/10")
BLOCK_PREFIXLEN = 18
MAX_SLOTS = 1 << (32 - BLOCK_PREFIXLEN - 2)
# pyroute2 runs namespace operations in a helper process and gives up on it after 2 s by
# default; on a saturated 2-core host (64 sandboxes starting at once) that was too short.
pyroute2_config.default_communicate_timeout = 30


@dataclass(frozen=True)
class NetLayout:
    """One daemon's names and addresses. `tag` (3 hex digits) keeps daemons with different
    state directories apart: interface names, namespace names, nft table and address block."""

    tag: str
    block: ipaddress.IPv4Network

    @classmethod
    def for_home(cls, home: Path | str) -> "NetLayout":
        digest = hashlib.sha256(str(home).encode()).hexdigest()
        blocks = list(UPLINK_SPACE.subnets(new_prefix=BLOCK_PREFIXLEN))
        return cls(tag=digest[:3], block=blocks[int(digest[3:7], 16) % len(blocks)])

    @property
    def prefix(self) -> str:
        return "rb" + self.tag

    @property
    def table(self) -> str:
        return "rollbox_" + self.tag

    @property
    def mark(self) -> int:
        """The packet mark (SO_MARK) of this daemon's port listeners' connections to uplinks:
        the host's table refuses every other new connection to them."""
        return 0x72620000 | int(self.tag, 16)

    def slot(self, index: int) -> "Slot":
        if not 0 <= index < MAX_SLOTS:
            raise ValueError(f"slot {index} out of range 0..{MAX_SLOTS - 1}")
        return Slot(self, index)


@dataclass(frozen=True)
class Slot:
    """One prepared network for one sandbox."""

    layout: NetLayout
    index: int

    @property
    def host_if(self) -> str:
        return f"{self.layout.prefix}{self.index:04x}"  # <= 15 characters (IFNAMSIZ)

    @property
    def router_ns(self) -> str:
        return f"{self.layout.prefix}-{self.index:04x}-r"

    @property
    def sandbox_ns(self) -> str:
        return f"{self.layout.prefix}-{self.index:04x}-s"

    @property
    def sandbox_ns_path(self) -> str:
        return str(NETNS_DIR / self.sandbox_ns)

    @property
    def host_ip(self) -> str:
        return str(self.layout.block.network_address + 4 * self.index + 1)

    @property
    def uplink_ip(self) -> str:
        """The address the host reaches this sandbox's ports on."""
        return str(self.layout.block.network_address + 4 * self.index + 2)


def _nsenter(ns: str, script: str, stdin: str | None = None) -> None:
    res = subprocess.run(["nsenter", f"--net={NETNS_DIR / ns}", "sh", "-c", script], input=stdin,
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeMissing(f"configuring network namespace {ns} failed: {res.stderr.strip()[-400:]} "
                             "(needs root, nftables and iproute2: run `make setup`)")


def router_ruleset(slot: Slot, ports: Iterable[int] = ()) -> str:
    """R's table as one idempotent nft transaction (chains flushed and filled again, so it
    also brings a table an older rollbox made up to date). Only the host end's connections to
    `ports` are forwarded to the sandbox; anything else to the uplink address is refused."""
    t = "ip rollbox"
    elements = f"add element {t} ports {{ {', '.join(str(p) for p in sorted(set(ports)))} }}\n" if ports else ""
    return f"""add table {t}
add set {t} ports {{ type inet_service; }}
flush set {t} ports
{elements}add chain {t} pre {{ type nat hook prerouting priority dstnat; policy accept; }}
flush chain {t} pre
add rule {t} pre iifname "up" ip saddr {slot.host_ip} ip daddr {slot.uplink_ip} tcp dport @ports dnat to {SANDBOX_IP}
add chain {t} post {{ type nat hook postrouting priority srcnat; policy accept; }}
flush chain {t} post
add rule {t} post oifname "up" masquerade
add chain {t} inbound {{ type filter hook forward priority filter; policy accept; }}
flush chain {t} inbound
add rule {t} inbound iifname "up" oifname "sb" ct status dnat accept
add rule {t} inbound iifname "up" oifname "sb" ct state established,related accept
add rule {t} inbound iifname "up" oifname "sb" drop
add chain {t} input {{ type filter hook input priority filter; policy drop; }}
flush chain {t} input
add rule {t} input ct state established,related accept
add rule {t} input iifname "up" meta l4proto tcp reject with tcp reset
"""


def open_ports(slot: Slot, ports: Iterable[int]) -> None:
    """Forwards exactly `ports` of the slot's sandbox from the host end (blocking)."""
    _nsenter(slot.router_ns, "nft -f -", stdin=router_ruleset(slot, ports))


def create_slot(slot: Slot) -> None:
    """Creates both namespaces, both veth pairs, addresses, routes and R's NAT. Blocking
    (run it in a thread); on failure removes what it made and raises."""
    try:
        netns.create(slot.router_ns)
        netns.create(slot.sandbox_ns)
        v6off = "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
        _nsenter(slot.sandbox_ns, v6off)
        _nsenter(slot.router_ns, f"{v6off} net.ipv4.ip_forward=1 && nft -f -", stdin=router_ruleset(slot))
        with IPRoute() as ip:
            ip.link("add", ifname=slot.host_if, kind="veth", peer={"ifname": "up", "net_ns_fd": slot.router_ns})
            idx = ip.link_lookup(ifname=slot.host_if)[0]
            ip.addr("add", index=idx, address=slot.host_ip, prefixlen=30)
            ip.link("set", index=idx, state="up")
        with NetNS(slot.router_ns) as r:
            r.link("add", ifname="sb", kind="veth", address=GATEWAY_MAC,
                   peer={"ifname": "eth0", "address": SANDBOX_MAC, "net_ns_fd": slot.sandbox_ns})
            up = r.link_lookup(ifname="up")[0]
            sb = r.link_lookup(ifname="sb")[0]
            r.addr("add", index=up, address=slot.uplink_ip, prefixlen=30)
            r.addr("add", index=sb, address=GATEWAY_IP, prefixlen=SANDBOX_PREFIXLEN)
            for i in (up, sb):
                r.link("set", index=i, state="up")
            r.route("add", dst="0.0.0.0/0", gateway=slot.host_ip)
        with NetNS(slot.sandbox_ns) as s:
            lo = s.link_lookup(ifname="lo")[0]
            eth = s.link_lookup(ifname="eth0")[0]
            s.addr("add", index=eth, address=SANDBOX_IP, prefixlen=SANDBOX_PREFIXLEN)
            s.link("set", index=lo, state="up")
            s.link("set", index=eth, state="up")
            s.route("add", dst="0.0.0.0/0", gateway=GATEWAY_IP)
    except BaseException:
        destroy_slot(slot)
        raise


def reset_slot(slot: Slot) -> None:
    """Makes a used slot ready again: gVisor takes eth0's address and route out of the host
    side of the sandbox namespace when it starts, so put them back (idempotent)."""
    with NetNS(slot.sandbox_ns) as s:
        eth = s.link_lookup(ifname="eth0")[0]
        s.flush_addr(index=eth)
        s.addr("add", index=eth, address=SANDBOX_IP, prefixlen=SANDBOX_PREFIXLEN)
        s.route("replace", dst="0.0.0.0/0", gateway=GATEWAY_IP)


def destroy_slot(slot: Slot) -> None:
    """Removes the slot's namespaces (their veths go with them) and the host end. Idempotent."""
    for name in (slot.router_ns, slot.sandbox_ns):
        try:
            netns.remove(name)
        except (OSError, NetlinkError):
            pass
    with IPRoute() as ip:
        for idx in ip.link_lookup(ifname=slot.host_if):
            try:
                ip.link("del", index=idx)
            except NetlinkError:
                pass


def existing_slots(layout: NetLayout) -> set[int]:
    """Indexes of slots that have a namespace or a host interface on this host."""
    found: set[int] = set()
    want = layout.prefix + "-"
    for name in netns.listnetns():
        if name.startswith(want):
            try:
                found.add(int(name[len(want):len(want) + 4], 16))
            except ValueError:
                pass
    with IPRoute() as ip:
        for link in ip.get_links():
            name = link.get_attr("IFLA_IFNAME") or ""
            if name.startswith(layout.prefix) and len(name) == len(layout.prefix) + 4:
                try:
                    found.add(int(name[len(layout.prefix):], 16))
                except ValueError:
                    pass
    return found
