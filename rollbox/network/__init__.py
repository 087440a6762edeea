"""Sandbox networking: per-sandbox namespaces, the egress firewall, exposed ports."""

from .policy import NetworkPolicy, NetworkSpec, ResolvedPolicy, check_port, check_ports

__all__ = ["NetworkPolicy", "NetworkSpec", "ResolvedPolicy", "check_port", "check_ports"]
