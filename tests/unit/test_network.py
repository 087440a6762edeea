"""Network policy validation, the address plan and the firewall rules (pure functions)."""

from __future__ import annotations

import socket

import pytest

from rollbox import InvalidArgument
from rollbox.network import firewall
from rollbox.network.netns import MAX_SLOTS, NetLayout, router_ruleset
from rollbox.network.policy import NetworkPolicy, NetworkSpec, ResolvedPolicy, check_ports, resolve


def test_ports_are_checked() -> None:
    assert check_ports([8000, 8000, 22]) == (8000, 22)
    assert check_ports(None) == ()
    for bad in ([0], [65536], [-1], ["80"], [True], "8000", 8000):
        with pytest.raises(InvalidArgument):
            check_ports(bad)


def test_policy_parse_normalises_and_rejects() -> None:
    p = NetworkPolicy.parse(False, ["10.1.2.3/8", "PyPI.org.", "1.2.3.4", "pypi.org"])
    assert p.allow_list == ("10.0.0.0/8", "pypi.org", "1.2.3.4/32")
    assert p.cidrs == ["10.0.0.0/8", "1.2.3.4/32"] and p.names == ["pypi.org"]
    for bad in (["10.0.0.0/33"], ["999.1.1.1"], ["::1/128"], ["bad name"], [""], [5], "10.0.0.0/8"):
        with pytest.raises(InvalidArgument):
            NetworkPolicy.parse(False, bad)
    with pytest.raises(InvalidArgument, match="block_network=False"):
        NetworkPolicy.parse(True, ["10.0.0.0/8"])
    with pytest.raises(InvalidArgument):
        NetworkPolicy.parse("yes", None)


def test_spec_none_means_loopback_only_and_round_trips() -> None:
    assert NetworkSpec.parse() is None
    spec = NetworkSpec.parse([8000], False, ["10.0.0.0/8"])
    assert spec is not None and NetworkSpec.from_wire(spec.to_wire()) == spec
    assert NetworkSpec.from_wire(None) is None


def test_resolve_pins_names_and_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(name: str, *_a: object) -> list[tuple[object, ...]]:
        if name == "gone.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    r = resolve(NetworkPolicy.parse(False, ["example.com", "10.0.0.0/8"]))
    assert r.hosts == {"example.com": ["93.184.216.34"]}
    assert r.allowed == ["10.0.0.0/8", "93.184.216.34"]
    with pytest.raises(InvalidArgument, match="does not resolve"):
        resolve(NetworkPolicy.parse(False, ["gone.example"]))
    assert resolve(NetworkPolicy()).hosts == {}  # blocked: nothing to look up


def test_layout_is_per_home_and_fits_interface_names() -> None:
    a, b = NetLayout.for_home("/var/lib/rollbox"), NetLayout.for_home("/var/lib/rollbox-test")
    assert a.tag != b.tag and a.table != b.table
    last = a.slot(MAX_SLOTS - 1)
    assert len(last.host_if) <= 15
    assert last.uplink_ip in [str(x) for x in a.block.hosts()]
    s = a.slot(3)
    assert s.host_ip.endswith(str(int(s.uplink_ip.rsplit(".", 1)[1]) - 1))
    with pytest.raises(ValueError):
        a.slot(MAX_SLOTS)


def test_firewall_rules_never_open_the_host_or_other_sandboxes() -> None:
    layout = NetLayout.for_home("/x")
    base = firewall.base_ruleset(layout, ["10.255.255.53"])
    for must in ("100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8", "meta nfproto ipv6 drop", "masquerade",
                 f'iifname "{layout.prefix}*" reject'):
        assert must in base
    slot = layout.slot(1)
    blocked = firewall.policy_rules(slot, ResolvedPolicy(NetworkPolicy()))
    assert "accept" not in blocked
    open_ = firewall.policy_rules(slot, ResolvedPolicy(NetworkPolicy(False, None)))
    assert open_.rstrip().endswith(" accept")
    limited = firewall.policy_rules(slot, ResolvedPolicy(NetworkPolicy.parse(False, ["10.0.0.0/8"])))
    assert "ip daddr { 10.0.0.0/8 } accept" in limited and "th dport 53" in limited
    assert slot.uplink_ip in router_ruleset(slot)


def test_host_nameservers_skip_loopback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "resolv.conf"
    f.write_text("nameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\nsearch x\n")
    assert firewall.host_nameservers(f) == ["10.0.0.2"]
    assert firewall.host_nameservers(tmp_path / "missing") == []


def test_slot_preparation_is_retried_then_fails_typed(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A slot whose namespaces fail to come up (pyroute2's helper missing its deadline on a
    saturated host) is torn down and tried again, 3 times in all; then ResourceExhausted.
    Host calls are replaced by recorders: the claim is the retry policy, not netlink."""
    import asyncio

    from pyroute2.netlink.exceptions import NetlinkError

    from rollbox import ResourceExhausted
    from rollbox.network import manager as mgr

    calls: list[str] = []
    faults: list[BaseException] = []

    def create(slot) -> None:  # type: ignore[no-untyped-def]
        calls.append("create")
        if faults:
            raise faults.pop(0)

    monkeypatch.setattr(mgr, "create_slot", create)
    monkeypatch.setattr(mgr, "destroy_slot", lambda slot: calls.append("destroy"))
    monkeypatch.setattr(mgr.firewall, "nft", lambda rules: None)
    monkeypatch.setattr(mgr, "SLOT_RETRY_WAIT_S", 0.0)
    m = mgr.NetworkManager(tmp_path)

    faults[:] = [NetlinkError(110, "no response from the child")] * 2
    asyncio.run(m._make())
    assert calls == ["create", "destroy", "create", "destroy", "create"]

    calls.clear()
    faults[:] = [OSError("busy")] * 3
    with pytest.raises(ResourceExhausted, match="failed 3 times: busy"):
        asyncio.run(m._make())
    assert calls == ["create", "destroy"] * 3

    calls.clear()
    faults[:] = [ValueError("a bug, not a flaky host")]
    with pytest.raises(ValueError):
        asyncio.run(m._make())
    assert calls == ["create", "destroy"]  # not retried, and nothing half-made is left
    assert m._creating == set()


def test_uplinks_take_only_exposed_ports_and_only_from_rollbox_gh19() -> None:
    """A server on a port never exposed answered a host process connecting to the sandbox's
    uplink address: the router forwarded everything. Now it forwards the exposed ports only,
    from the host end only, and the host lets only marked (the proxy's) connections out."""
    layout = NetLayout.for_home("/x")
    slot = layout.slot(1)
    rules = router_ruleset(slot, [9000, 8000, 8000])
    dnat = [line for line in rules.splitlines() if "dnat to" in line]
    assert dnat and all(f"ip saddr {slot.host_ip} ip daddr {slot.uplink_ip} tcp dport @ports" in d for d in dnat)
    assert "add element ip rollbox ports { 8000, 9000 }" in rules
    assert "add element" not in router_ruleset(slot) and "flush set ip rollbox ports" in router_ruleset(slot)
    assert 'iifname "up" oifname "sb" drop' in rules  # nothing but DNATed or replies goes in
    base = firewall.base_ruleset(layout, [])
    assert f'oifname "{layout.prefix}*" ct state new meta mark != {layout.mark:#x} reject' in base
    assert NetLayout.for_home("/y").mark != layout.mark
