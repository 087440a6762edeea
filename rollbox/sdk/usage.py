"""Usage reports: per-sandbox rows from the daemon's ledger, summed per tag, priced by rates.

Rates are the user's own (there is no built-in price list): per CPU-hour reserved, per
GiB-hour of memory reserved, per GPU-hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..client.default import default_client
from ..client.transport import Client


@dataclass(frozen=True)
class Rates:
    """Prices per hour, in the user's currency. Reserved CPU and memory are the sandbox's
    limits times its running seconds (pauses excluded)."""

    cpu_hour: float = 0.0
    gib_hour: float = 0.0
    gpu_hour: float = 0.0

    def cost(self, row: dict[str, Any]) -> float:
        return float(row["reserved_cpu_seconds"] * self.cpu_hour + row["reserved_gib_seconds"] * self.gib_hour
                + row["gpu_seconds"] * self.gpu_hour) / 3600.0


SUMMED = ("wall_s", "run_s", "boot_s", "cpu_seconds", "gpu_seconds", "reserved_cpu_seconds", "reserved_gib_seconds")


def usage(client: Client | None = None, *, by_tag: str | None = None, rates: Rates | None = None
          ) -> list[dict[str, Any]]:
    """Per-sandbox usage rows, or with `by_tag="key"` one row per value of that tag (sandboxes
    without it under "-"), each with `cost` when `rates` is given."""
    rows: list[dict[str, Any]] = list((client or default_client()).request("GET", "/usage"))
    if rates is not None:
        for r in rows:
            r["cost"] = rates.cost(r)
    if by_tag is None:
        return rows
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = str(r.get("tags", {}).get(by_tag, "-"))
        g = groups.setdefault(key, {by_tag: key, "sandboxes": 0, "peak_memory_bytes": 0,
                                    **{k: 0.0 for k in SUMMED}, **({"cost": 0.0} if rates else {})})
        g["sandboxes"] += 1
        g["peak_memory_bytes"] = max(g["peak_memory_bytes"], r["peak_memory_bytes"])
        for k in SUMMED + (("cost",) if rates else ()):
            g[k] += r[k]
    return sorted(groups.values(), key=lambda g: g[by_tag])
