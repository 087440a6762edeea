"""Networking glue between sandboxes and the network manager: a sandbox's network columns,
its /etc/hosts and /etc/resolv.conf, exposed ports and outbound policy changes.

The slots, namespaces and firewall rules themselves belong to `rollbox.network`.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from .. import errors
from ..network.netns import Slot
from ..network.policy import NetworkPolicy, NetworkSpec, ResolvedPolicy, check_port
from ..runtime.channel import AgentChannel
from ..types import SandboxInfo
from .context import ServiceContext
from .registry import Live, Running
from .validation import BOOT_TIMEOUT_S

class Networking:
    def __init__(self, ctx: ServiceContext, running: Running) -> None:
        self.ctx = ctx
        self.reg = ctx.registry
        self.running = running

    def net_columns(self, sandbox_id: str, net: NetworkSpec | None) -> dict[str, Any]:
        """The row's network columns: the slot (for recovery), the spec and the exposed URLs."""
        slot = self.reg.slots.get(sandbox_id)
        ports = self.ctx.net.ports
        return {"net_slot": slot.index if slot else None,
                "network": json.dumps(net.to_wire()) if net else None,
                "urls": json.dumps({str(p): u for p, u in ports.urls(sandbox_id).items()}),
                "host_ports": json.dumps({str(p): hp for p, hp in ports.host_ports(sandbox_id).items()})}

    async def write_net_files(self, channel: AgentChannel, sandbox_id: str, resolved: ResolvedPolicy | None) -> None:
        """/etc/hosts (localhost and the allow list's names pinned to the addresses
        the firewall allows) and, with outbound access, /etc/resolv.conf (the host's
        nameservers), as Docker manages both."""
        # The host name resolves locally (servers such as http.server look it up at start).
        lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{sandbox_id}"]
        for name, addrs in (resolved.hosts if resolved else {}).items():
            lines += [f"{a}\t{name}" for a in addrs]
        files = {"/etc/hosts": "\n".join(lines) + "\n"}
        if resolved is not None and not resolved.policy.block_network and self.ctx.net.nameservers:
            files["/etc/resolv.conf"] = "".join(f"nameserver {n}\n" for n in self.ctx.net.nameservers)
        else:
            # Blocked: gVisor's netstack does not hand the firewall's ICMP reject to a UDP socket,
            # so a lookup sent to the host's nameserver waited out the resolver's timeouts (10 s
            # measured). A local address answers "refused" at once.
            files["/etc/resolv.conf"] = ("# outbound network blocked by rollbox: name lookups fail at once\n"
                                         "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        for path, text in files.items():
            await channel.request("write_file", wait_s=BOOT_TIMEOUT_S, path=path,
                                  data=base64.b64encode(text.encode()).decode(), mode=0o644)

    def _networked(self, sandbox_id: str, lv: Live) -> tuple[Slot, NetworkSpec]:
        slot = self.reg.slots.get(sandbox_id)
        if slot is None or lv.net is None:
            raise errors.InvalidArgument(
                f"sandbox {sandbox_id} was created without networking (loopback only); create it with "
                "ports=[...] or block_network=False to expose ports or change its network", sandbox_id=sandbox_id)
        return slot, lv.net

    async def expose_port(self, sandbox_id: str, port: int) -> str:
        """The host URL that reaches `port` in the sandbox; the same URL for the same port.

        Raises:
            InvalidArgument: a bad port, or the sandbox was created without networking.
        """
        check_port(port)
        lv = await self.running(sandbox_id)
        slot, net = self._networked(sandbox_id, lv)
        url = (await self.ctx.net.expose(sandbox_id, slot, [port]))[port]
        if port not in net.ports:
            lv.net = NetworkSpec(net.policy, (*net.ports, port))
        self.ctx.store.update_sandbox(sandbox_id, **self.net_columns(sandbox_id, lv.net))
        return url

    def list_urls(self, sandbox_id: str) -> dict[int, str]:
        """The exposed URLs of a running sandbox; none while it is paused or after it ended."""
        if sandbox_id in self.reg.live:
            return self.ctx.net.ports.urls(sandbox_id)
        self.reg.info(sandbox_id)  # SandboxNotFound
        return {}

    async def update_network_permissions(self, sandbox_id: str, block_network: bool,
                                         allow_list: list[str] | None) -> SandboxInfo:
        """Changes a networked sandbox's outbound policy at once (open connections included).

        Raises:
            InvalidArgument: a bad allow list, or the sandbox was created without networking.
        """
        policy = NetworkPolicy.parse(block_network, allow_list)
        lv = await self.running(sandbox_id)
        slot, net = self._networked(sandbox_id, lv)
        resolved = await self.ctx.net.update(slot, policy)
        lv.net = NetworkSpec(policy, net.ports)
        await self.write_net_files(lv.channel, sandbox_id, resolved)
        self.ctx.store.update_sandbox(sandbox_id, **self.net_columns(sandbox_id, lv.net))
        return self.reg.info(sandbox_id)
