"""The benchmark's "processes" section (gh-16): background processes and run_code.

- write-to-client latency: a `python3 -u` loop in the sandbox prints time.time() every 50 ms;
  the client stamps each line when its chunk arrives through the streamed HTTP answer (both
  clocks are the host's: gVisor's time comes from it), p50/p99 in ms.
- start latency: `sb.process.exec("true")` returning its handle, and the first byte of
  `echo hi` after the call (start + stream set-up + first chunk).
- run_code round trip of `1+1` against `sb.exec("python3", "-c", "print(1+1)")` (the first
  run_code, which starts the interpreter, reported apart).

`rollbox bench processes [--n 40] [--agent python]` runs it alone against the daemon of
ROLLBOX_HOME (--agent: the agent a daemon the SDK starts boots sandboxes with); `rollbox bench`
runs it as one section.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from rollbox.errors import RollboxError
from rollbox.sdk.sandbox import Sandbox, SandboxInstance

from .stats import pct

TICKER = ("import time\nfor _ in range({n}):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.05)")


def _r(x: float, nd: int = 2) -> float:
    return round(x, nd)


def write_to_client_ms(sb: SandboxInstance, n: int) -> list[float]:
    """Latency of each of `n` lines from its write in the sandbox to its arrival here."""
    p = sb.process.exec("python3", "-u", "-c", TICKER.format(n=n))
    out: list[float] = []
    buf = b""
    for chunk in p.stdout:
        now = time.time()
        buf += chunk
        *lines, buf = buf.split(b"\n")
        out += [(now - float(line)) * 1000 for line in lines if line.strip()]
    p.wait(timeout=30)
    return out[1:]  # the first line also waited for the stream's set-up


def start_ms(sb: SandboxInstance, n: int) -> tuple[list[float], list[float]]:
    """(process.exec returning, first byte of `echo hi` after the call) in ms, `n` of each."""
    starts, first = [], []
    for _ in range(n):
        t = time.perf_counter()
        sb.process.exec("true")
        starts.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        p = sb.process.exec("echo", "hi")
        it = iter(p.stdout)
        next(it)
        first.append((time.perf_counter() - t) * 1000)
        it.close()
    return starts, first


def run_code_vs_exec_ms(sb: SandboxInstance, n: int) -> tuple[float, list[float], list[float]]:
    """(first run_code ms, run_code `1+1` ms, exec `python3 -c print(1+1)` ms)."""
    t = time.perf_counter()
    assert sb.process.run_code("1+1").value == "2"
    first = (time.perf_counter() - t) * 1000
    rc, ex = [], []
    for _ in range(n):
        t = time.perf_counter()
        assert sb.process.run_code("1+1").value == "2"
        rc.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        assert sb.exec("python3", "-c", "print(1+1)").stdout == b"2\n"
        ex.append((time.perf_counter() - t) * 1000)
    return first, rc, ex


def measure(n: int = 40) -> dict[str, Any]:
    """The section's figures, or {"error": ...} when the daemon's agent has no background
    processes (an agent build without the proc_* ops)."""
    try:
        with Sandbox(memory=512).create() as sb:
            lat = write_to_client_ms(sb, n)
            starts, first = start_ms(sb, max(5, n // 2))
            rc_first, rc, ex = run_code_vs_exec_ms(sb, max(5, n // 2))
    except RollboxError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {
        "write_to_client_p50_ms": _r(pct(lat, .5)), "write_to_client_p99_ms": _r(pct(lat, .99)),
        "start_p50_ms": _r(pct(starts, .5)), "start_p99_ms": _r(pct(starts, .99)),
        "first_byte_p50_ms": _r(pct(first, .5)),
        "run_code_first_ms": _r(rc_first), "run_code_p50_ms": _r(pct(rc, .5)), "run_code_p99_ms": _r(pct(rc, .99)),
        "exec_python_p50_ms": _r(pct(ex, .5)), "exec_python_p99_ms": _r(pct(ex, .99)),
        "samples": {"lines": len(lat), "starts": len(starts), "run_code": len(rc)},
    }


def rows(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The section's rows of the benchmark's table."""
    if "error" in res:
        return [("processes", "n/a", "-", res["error"][:100])]
    return [
        ("process write -> client p50 / p99 (ms)", f"{res['write_to_client_p50_ms']} / {res['write_to_client_p99_ms']}",
         "-", "python -u prints time.time() every 50 ms; streamed NDJSON"),
        ("process.exec start p50 / p99 (ms)", f"{res['start_p50_ms']} / {res['start_p99_ms']}", "-",
         f"`true`; first byte of `echo hi` {res['first_byte_p50_ms']} ms"),
        ("run_code 1+1 vs exec python3 -c (ms)", f"{res['run_code_p50_ms']} vs {res['exec_python_p50_ms']}", "-",
         f"p50; first run_code (starts the interpreter) {res['run_code_first_ms']} ms"),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rollbox bench processes", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="samples per figure")
    ap.add_argument("--agent", choices=("native", "python"), default=None,
                    help="the agent of a daemon the SDK starts (ROLLBOX_AGENT); a running daemon keeps its own")
    args = ap.parse_args(argv)
    if args.agent:
        os.environ["ROLLBOX_AGENT"] = args.agent
    res = measure(args.n)
    for name, value, _raw, note in rows(res):
        print(f"{name:<42} {value:<18} {note}")
    print(json.dumps({"processes": res}, separators=(",", ":")), flush=True)
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
