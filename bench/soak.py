"""Churn soak: create -> exec -> terminate, many times at once, then count what is left.

    python -m bench.soak [--cycles 2000] [--concurrency 16]      (`make soak`)

Every fourth sandbox is networked (its own namespaces, veth, firewall chain and a host port),
every tenth runs on the runc tier, the rest are loopback-only gVisor. At the end every count of `rollbox.server.inventory` must be back to
where it started and no row may be live: the script prints the counts as a table and one JSON
line, and exits 1 on any leak. The CI suite runs the same function with 200 cycles
(tests/load/test_churn.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import secrets
import sys
import time
from typing import Any

from rollbox import Sandbox
from rollbox.config import Paths
from rollbox.sdk.sandbox import default_client
from rollbox.server import inventory


def _inventory() -> inventory.HostInventory:
    ready = default_client().request("GET", "/health")["network"]["ready"]
    return inventory.take(Paths.from_env(), ready_slots=ready)


def churn(cycles: int, concurrency: int = 16, networked_every: int = 4, runc_every: int = 10) -> dict[str, Any]:
    """Runs `cycles` create -> exec -> terminate at `concurrency` (every `networked_every`th
    networked, every `runc_every`th on the runc tier); returns the counts before and after,
    what leaked (after beyond before, per kind), failures and rates."""
    tag = "churn-" + secrets.token_hex(4)
    before = _inventory()
    failures: list[str] = []

    def one(i: int) -> None:
        net = networked_every and i % networked_every == 0
        runtime = "runc" if runc_every and i % runc_every == 1 else "gvisor"
        sb = Sandbox(memory=256, tags={"rollbox.churn": tag}, runtime=runtime,
                     **({"ports": [8000]} if net else {})).create()  # type: ignore[arg-type]
        try:
            r = sb.exec("sh", "-c", "echo $((6*7)) > /root/x && cat /root/x")
            if r.stdout != b"42\n":
                failures.append(f"cycle {i}: {r}")
        finally:
            sb.terminate()

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        for fut in [ex.submit(one, i) for i in range(cycles)]:
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - counted and reported, never hidden
                failures.append(f"{type(e).__name__}: {e}")
    seconds = time.perf_counter() - t0
    after = _inventory()
    rows = default_client().request("GET", "/sandboxes", params={"all": "true"})
    live = [r["sandbox_id"] for r in rows
            if r.get("tags", {}).get("rollbox.churn") == tag and r["state"] not in ("terminated", "oom", "paused")]
    b, a = before.leaked(), after.leaked()
    leaked = {k: max(0, a[k] - b[k]) for k in a}
    leaked["live_rows"] = len(live)
    return {"cycles": cycles, "concurrency": concurrency, "seconds": round(seconds, 1),
            "cycles_per_s": round(cycles / seconds, 2), "failures": failures[:10], "failed": len(failures),
            "before": before.to_dict(), "after": after.to_dict(), "leaked": leaked,
            "total_leaked": sum(leaked.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args(argv)
    res = churn(args.cycles, args.concurrency)
    print(f"{'kind':<16}{'before':>8}{'after':>8}{'leaked':>8}")
    for k, v in res["leaked"].items():
        print(f"{k:<16}{res['before'].get(k, 0):>8}{res['after'].get(k, 0):>8}{v:>8}")
    print(f"{res['cycles']} cycles at concurrency {res['concurrency']} in {res['seconds']} s "
          f"({res['cycles_per_s']}/s), {res['failed']} failed")
    print(json.dumps({k: res[k] for k in ("cycles", "concurrency", "seconds", "cycles_per_s", "failed",
                                           "total_leaked", "leaked")}))
    return 0 if res["total_leaked"] == 0 and res["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
