"""Burst soak (gh-19 item 1): a burst of creates on a host already saturated by a CPU hog.

    python -m bench.burst [--creates 100] [--threads 10] [--hog 4]     (part of `make soak`)

What was seen once: 100 `Sandbox().create()` from 10 threads on a busy 2-core host gave
untyped `ProcessLookupError` 500s, the script died leaving ~90 spinning sandboxes, `ps` hung
and the daemon's zombies lived ~50 minutes. This run reproduces it and checks what must hold:

- every create either succeeds or fails with a typed, retryable error naming the condition
  (`ResourceExhausted`, `SandboxLost`, `DaemonUnavailable`), never an untyped `RollboxError`;
- `/health` and the sandbox list (`rollbox ps`) answer within 1 s throughout (a probe thread
  asks every 0.5 s; the worst of each is reported);
- the created sandboxes are then abandoned all at once, as a crashed script leaves them, and
  ended by their ids; within 60 s the host is back at its baseline (rollbox.server.inventory:
  mounts, loop devices, cgroups, netns, links, firewall elements, runsc processes, state) and
  no zombie child of the daemon is older than a few seconds.

A `--hog` of N busy-looping processes (default 2 per core) runs throughout. Prints one JSON
line; exits 1 when anything above does not hold.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import sys
import threading
import time
from typing import Any

import psutil

from rollbox import Sandbox, errors
from rollbox.config import Paths
from rollbox.sdk.sandbox import default_client
from rollbox.server import inventory

RETRYABLE = (errors.ResourceExhausted, errors.SandboxLost, errors.DaemonUnavailable)
SETTLE_S = 60.0
PROBE_LIMIT_S = 1.0


def _hog() -> None:
    while True:
        pass


def _inventory() -> inventory.HostInventory:
    ready = default_client().request("GET", "/health")["network"]["ready"]
    return inventory.take(Paths.from_env(), ready_slots=ready)


def _daemon_zombies(max_age_s: float) -> list[int]:
    """Zombie children of the daemon older than `max_age_s` seconds."""
    pid = int(default_client().request("GET", "/health")["pid"])
    now, old = time.time(), []
    for child in psutil.Process(pid).children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE and now - child.create_time() > max_age_s:
                old.append(child.pid)
        except psutil.Error:
            pass
    return old


class Probe(threading.Thread):
    """Asks /health and the sandbox list every 0.5 s; records the slowest answer of each."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.worst = {"health_s": 0.0, "ps_s": 0.0}
        self.errors: list[str] = []

    def run(self) -> None:
        c = default_client()
        while not self.stop.wait(0.5):
            for key, path in (("health_s", "/health"), ("ps_s", "/sandboxes")):
                t0 = time.perf_counter()
                try:
                    c.request("GET", path)
                except errors.RollboxError as e:
                    self.errors.append(f"{path}: {type(e).__name__}: {e}")
                self.worst[key] = max(self.worst[key], time.perf_counter() - t0)


def burst(creates: int, threads: int, hog: int) -> dict[str, Any]:
    before = _inventory()
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(hog)]
    for h in hogs:
        h.start()
    probe = Probe()
    probe.start()
    made: list[str] = []
    outcomes: dict[str, int] = {}
    untyped: list[str] = []
    lock = threading.Lock()

    def one(_i: int) -> None:
        try:
            sb = Sandbox(memory=256, keep_warm_seconds=900).create()
            with lock:
                made.append(sb.sandbox_id)
            kind = "ok"
        except RETRYABLE as e:
            kind = type(e).__name__
        except errors.RollboxError as e:
            kind = type(e).__name__
            if type(e) is errors.RollboxError or not getattr(e, "retryable", True):
                untyped.append(f"{kind}: {e}")
        with lock:
            outcomes[kind] = outcomes.get(kind, 0) + 1

    t0 = time.perf_counter()
    try:
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(one, range(creates)))
        burst_s = time.perf_counter() - t0
        # Abandoned as a crashed script leaves them; then ended by id, all at once.
        t1 = time.perf_counter()
        c = default_client()
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda sid: c.request("DELETE", f"/sandboxes/{sid}"), made))
    finally:
        for h in hogs:
            h.terminate()
        probe.stop.set()
        probe.join()
    deadline = time.monotonic() + SETTLE_S
    while True:
        after = _inventory()
        b, a = before.leaked(), after.leaked()
        leaked = {k: a[k] - b[k] for k in a if a[k] > b[k]}
        zombies = _daemon_zombies(5.0)
        if (not leaked and not zombies) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return {"creates": creates, "threads": threads, "hog": hog, "burst_s": round(burst_s, 1),
            "outcomes": outcomes, "untyped": untyped[:10], "worst_health_s": round(probe.worst["health_s"], 2),
            "worst_ps_s": round(probe.worst["ps_s"], 2), "probe_errors": probe.errors[:5],
            "settle_s": round(time.perf_counter() - t1, 1), "leaked": leaked, "old_zombies": len(zombies)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--creates", type=int, default=100)
    p.add_argument("--threads", type=int, default=10)
    p.add_argument("--hog", type=int, default=2 * (os.cpu_count() or 1))
    args = p.parse_args(argv)
    res = burst(args.creates, args.threads, args.hog)
    print(f"{res['creates']} creates from {res['threads']} threads beside {res['hog']} CPU hogs: {res['outcomes']} "
          f"in {res['burst_s']} s; slowest /health {res['worst_health_s']} s, sandbox list {res['worst_ps_s']} s; "
          f"host back at baseline {res['settle_s']} s after ending them; left: {res['leaked'] or 'nothing'}, "
          f"old zombies: {res['old_zombies']}")
    print(json.dumps(res))
    ok = (not res["untyped"] and not res["probe_errors"] and not res["leaked"] and not res["old_zombies"]
          and res["worst_health_s"] <= PROBE_LIMIT_S and res["worst_ps_s"] <= PROBE_LIMIT_S
          and res["settle_s"] <= SETTLE_S)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
