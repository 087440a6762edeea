"""The host's rollbox nftables table: what sandbox uplinks may reach, and NAT to the outside.

One table per daemon (`inet rollbox_<tag>`), so removing it removes every rule rollbox made.
Whatever a sandbox's policy, it never reaches: the host itself (any of its addresses, hence the
daemon and loopback services: the input chain drops new connections from uplinks), another
sandbox (all of 100.64.0.0/10), link-local metadata (169.254.0.0/16), or anything over IPv6.
Nor does anything reach a sandbox but rollbox's port listeners: the host's new connections to
the uplinks must carry the daemon's mark (`NetLayout.mark`, set by the proxy on its sockets),
the forward chain drops what other hosts or sandboxes send them, and each sandbox's router
forwards only its exposed ports (netns.router_ruleset).
Per-slot chains hold the allow list; a verdict map from uplink interface to chain selects it.
Refused traffic is rejected (ICMP administratively prohibited), not dropped, so a blocked
connection or DNS lookup fails at once instead of after the client's timeout.
Rules go through `nft -f -` (one atomic transaction per change).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import RuntimeMissing
from .netns import UPLINK_SPACE, NetLayout, Slot
from .policy import ResolvedPolicy

NEVER = ("0.0.0.0/8", str(UPLINK_SPACE), "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3")


def host_nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The host's IPv4 nameservers that a sandbox can reach (loopback ones cannot be)."""
    out: list[str] = []
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and "." in parts[1] and not parts[1].startswith("127."):
            out.append(parts[1])
    return out


def _elements(items: list[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def base_ruleset(layout: NetLayout, nameservers: list[str]) -> str:
    p = layout.prefix
    dns = f"elements = {_elements(nameservers)}" if nameservers else ""
    return f"""table inet {layout.table} {{
  set never {{ type ipv4_addr; flags interval; elements = {_elements(list(NEVER))} }}
  set dns {{ type ipv4_addr; {dns} }}
  map egress {{ type ifname : verdict; }}
  chain forward {{ type filter hook forward priority filter - 5; policy accept;
    iifname "{p}*" jump from_sandbox
    oifname "{p}*" ct state established,related accept
    oifname "{p}*" drop
  }}
  chain from_sandbox {{
    meta nfproto ipv6 drop
    ip daddr @never reject with icmpx type admin-prohibited
    iifname vmap @egress
    reject with icmpx type admin-prohibited
  }}
  chain input {{ type filter hook input priority filter - 5; policy accept;
    iifname "{p}*" ct state established,related accept
    iifname "{p}*" reject with icmpx type admin-prohibited
  }}
  chain output {{ type filter hook output priority filter - 5; policy accept;
    oifname "{p}*" ct state new meta mark != {layout.mark:#x} reject with icmpx type admin-prohibited
  }}
  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept;
    ip saddr {layout.block} oifname != "{p}*" masquerade
  }}
}}
"""


def policy_rules(slot: Slot, resolved: ResolvedPolicy | None) -> str:
    """Replaces one slot's chain: nothing (blocked: falls through to drop), everything, or the
    allow list plus DNS to the host's nameservers."""
    t, c = f"inet {slot.layout.table}", f"s{slot.index:04x}"
    lines = [f"flush chain {t} {c}"]
    if resolved is not None and not resolved.policy.block_network:
        allowed = resolved.allowed
        if resolved.policy.allow_list is None:
            lines.append(f"add rule {t} {c} accept")
        else:
            if allowed:
                lines.append(f"add rule {t} {c} ip daddr {_elements(allowed)} accept")
            lines.append(f"add rule {t} {c} ip daddr @dns meta l4proto {{ tcp, udp }} th dport 53 accept")
    return "\n".join(lines) + "\n"


def slot_rules(slot: Slot, resolved: ResolvedPolicy | None) -> str:
    t, c = f"inet {slot.layout.table}", f"s{slot.index:04x}"
    return (f"add chain {t} {c}\n" + policy_rules(slot, resolved)
            + f'add element {t} egress {{ "{slot.host_if}" : jump {c} }}\n')


def remove_slot_rules(slot: Slot) -> str:
    t, c = f"inet {slot.layout.table}", f"s{slot.index:04x}"
    return f'delete element {t} egress {{ "{slot.host_if}" }}\ndelete chain {t} {c}\n'


def nft(script: str) -> None:
    """Applies one nft transaction; raises RuntimeMissing with nft's message."""
    try:
        res = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise RuntimeMissing("nftables' `nft` is not installed: `apt-get install nftables` (or `make setup`)") from None
    if res.returncode != 0:
        raise RuntimeMissing(f"nft refused a rollbox rule: {res.stderr.strip()[-600:]}")


def reset(layout: NetLayout, nameservers: list[str], slots: dict[Slot, ResolvedPolicy | None]) -> None:
    """(Re)creates the table with exactly these slots, in one transaction."""
    script = (f"table inet {layout.table} {{}}\ndelete table inet {layout.table}\n"
              + base_ruleset(layout, nameservers)
              + "".join(slot_rules(s, r) for s, r in slots.items()))
    nft(script)


def drop(layout: NetLayout) -> None:
    nft(f"table inet {layout.table} {{}}\ndelete table inet {layout.table}\n")


def enable_forwarding() -> None:
    """Sandboxes with outbound access are routed through the host (a host-wide setting)."""
    p = Path("/proc/sys/net/ipv4/ip_forward")
    if p.read_text().strip() != "1":
        p.write_text("1\n")
