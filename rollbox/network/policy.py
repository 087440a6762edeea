"""What a sandbox may reach: validated before anything is created, resolved when it starts.

Pure values and checks; the firewall module turns a resolved policy into nftables rules.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass, field

from ..errors import InvalidArgument

# RFC 1123 host names: labels of letters, digits and hyphens, 253 characters at most.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_port(port: object) -> int:
    """A TCP port in 1..65535; raises InvalidArgument otherwise."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgument(f"port {port!r} is out of range: a TCP port is an integer in 1..65535")
    return port


MAX_PORTS = 64  # exposed ports per sandbox: each is a listener (a file descriptor) in the daemon


def check_ports(ports: object) -> tuple[int, ...]:
    if ports is None:
        return ()
    if isinstance(ports, (str, bytes)) or not hasattr(ports, "__iter__"):
        raise InvalidArgument(f"ports={ports!r} must be a list of TCP port numbers")
    out: list[int] = []
    for p in ports:
        p = check_port(p)
        if p not in out:
            out.append(p)
        if len(out) > MAX_PORTS:
            raise InvalidArgument(f"at most {MAX_PORTS} exposed ports per sandbox")
    return tuple(out)


def _is_cidr(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
        return True
    except ValueError:
        return False


def _is_hostname(name: str) -> bool:
    return 0 < len(name) <= 253 and all(_LABEL.match(label) for label in name.rstrip(".").split("."))


@dataclass(frozen=True)
class NetworkPolicy:
    """A sandbox's outbound policy.

    block_network: True (the default) blocks every outbound connection; the sandbox can still
        serve its exposed ports. allow_list: with block_network=False, limits outbound traffic to
        these IPv4 CIDRs ("10.0.0.0/8", "1.2.3.4") and host names ("pypi.org"); names are
        resolved when the sandbox starts (or when the policy is updated), as Modal and Beam do,
        and pinned in the sandbox's /etc/hosts so that its own lookups agree. None: no limit.
    """

    block_network: bool = True
    allow_list: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, block_network: object = True, allow_list: object = None) -> "NetworkPolicy":
        """Validates; raises InvalidArgument naming the bad entry."""
        if not isinstance(block_network, bool):
            raise InvalidArgument(f"block_network={block_network!r} must be True or False")
        if allow_list is None:
            return cls(block_network, None)
        if isinstance(allow_list, (str, bytes)) or not hasattr(allow_list, "__iter__"):
            raise InvalidArgument(f"allow_list={allow_list!r} must be a list of CIDRs and host names")
        entries: list[str] = []
        for e in allow_list:
            if not isinstance(e, str) or not e.strip():
                raise InvalidArgument(f"allow_list entry {e!r} must be a non-empty string (a CIDR or a host name)")
            e = e.strip()
            if block_network:
                raise InvalidArgument("allow_list needs block_network=False: with block_network=True nothing "
                                      "outbound is allowed")
            try:
                net = ipaddress.ip_network(e, strict=False)
            except ValueError:
                if "/" in e or ":" in e or re.fullmatch(r"[0-9.]+", e) or re.fullmatch(r"0[xX][0-9a-fA-F]+", e):
                    raise InvalidArgument(f"allow_list entry {e!r} is not a valid CIDR (e.g. '10.0.0.0/8')") from None
                if not _is_hostname(e) or "-" in e.split(".")[-1] and e.split(".")[-1][0].isdigit():
                    raise InvalidArgument(f"allow_list entry {e!r} is neither a CIDR nor a valid host name") from None
                e = e.rstrip(".").lower()
            else:
                if net.version != 4:
                    raise InvalidArgument(f"allow_list entry {e!r} is IPv6; sandboxes have IPv4 networking only")
                e = str(net)
            if e not in entries:
                entries.append(e)
        return cls(block_network, tuple(entries))

    @property
    def cidrs(self) -> list[str]:
        return [e for e in self.allow_list or () if _is_cidr(e)]

    @property
    def names(self) -> list[str]:
        return [e for e in self.allow_list or () if not _is_cidr(e)]

    def to_wire(self) -> dict[str, object]:
        return {"block_network": self.block_network,
                "allow_list": None if self.allow_list is None else list(self.allow_list)}

    @classmethod
    def from_wire(cls, d: dict[str, object] | None) -> "NetworkPolicy":
        d = d or {}
        return cls.parse(d.get("block_network", True), d.get("allow_list"))


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy with its names looked up: `hosts` maps each name to its IPv4 addresses."""

    policy: NetworkPolicy
    hosts: dict[str, list[str]] = field(default_factory=dict)

    @property
    def allowed(self) -> list[str]:
        """Every allowed destination as a CIDR or address (empty: no limit or all blocked)."""
        out = list(self.policy.cidrs)
        for addrs in self.hosts.values():
            out.extend(a for a in addrs if a not in out)
        return out


def resolve(policy: NetworkPolicy) -> ResolvedPolicy:
    """Looks up the allow list's names (IPv4). A name that does not resolve is an error: a
    silent empty allow list would look like a network fault inside the sandbox."""
    hosts: dict[str, list[str]] = {}
    if policy.block_network:
        return ResolvedPolicy(policy, hosts)
    for name in policy.names:
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise InvalidArgument(f"allow_list name {name!r} does not resolve ({e.strerror}); "
                                  "check the name or give its addresses as CIDRs") from None
        hosts[name] = sorted({str(i[4][0]) for i in infos})
    return ResolvedPolicy(policy, hosts)


@dataclass(frozen=True)
class NetworkSpec:
    """A networked sandbox's settings, as created and as captured in its snapshots.

    ports: TCP ports in the sandbox exposed on the host (each gets a URL).
    """

    policy: NetworkPolicy = NetworkPolicy()
    ports: tuple[int, ...] = ()

    @classmethod
    def parse(cls, ports: object = None, block_network: object = True,
              allow_list: object = None) -> "NetworkSpec | None":
        """None when the sandbox needs no network at all (no ports, outbound blocked): it then
        runs with loopback only, the cheapest set-up. Raises InvalidArgument."""
        spec = cls(NetworkPolicy.parse(block_network, allow_list), check_ports(ports))
        if not spec.ports and spec.policy.block_network:
            return None
        return spec

    def to_wire(self) -> dict[str, object]:
        return {**self.policy.to_wire(), "ports": list(self.ports)}

    @classmethod
    def from_wire(cls, d: dict[str, object] | None) -> "NetworkSpec | None":
        if not d:
            return None
        return cls(NetworkPolicy.from_wire(d), check_ports(d.get("ports")))
