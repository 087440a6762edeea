"""`python3 kernel.py < REQUEST.json`: runs notebook cells in order in this one interpreter, so
state carries from cell to cell (what `/run_jupyter` promises), and reports each cell as
SandboxFusion's jupyter runner does: `{"stdout", "stderr", "display", "error"}`.

Runs inside the sandbox. Protocol: stdin is one JSON object `{"cells": [str], "cell_timeout":
seconds (0: none), "total_timeout": seconds (0: none), "memory_limit_MB": MiB (<= 0: none)}`;
stdout gets one JSON line per cell as it finishes (`{"cell": {...}}`), then `{"status":
"Finished" | "TimeLimitExceeded"}`. A cell's own output (print, sys.stderr, subprocesses)
goes to files per cell, never to that stream. Like a Jupyter kernel: the value of a cell's
last expression is displayed as `{"text/plain": repr(value)}` (not when it is None or the
cell ends with `;`), an exception is the cell's `error` (`ename`, `evalue`, `traceback`) and
the next cell still runs. A cell past `cell_timeout`, or past what is left of
`total_timeout`, gets a TimeoutError and ends the run (status TimeLimitExceeded).
"""

import ast
import io
import json
import linecache
import os
import resource
import signal
import sys
import tempfile
import time
import traceback


class CellTimeout(BaseException):
    """Raised in a cell by the timer; a BaseException so that `except Exception` in the
    cell cannot swallow it."""


def _alarm(_signum, _frame):
    raise CellTimeout()


def _limit_memory(mib):
    for res in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        _soft, hard = resource.getrlimit(res)
        want = mib << 20
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        resource.setrlimit(res, (want, want))


def _error(e):
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # the kernel's frames are not the cell's
    lines = "".join(traceback.format_exception(type(e), e, tb)).splitlines()
    return {"ename": type(e).__name__, "evalue": str(e), "traceback": lines}


def _run(source, name, ns):
    """Executes one cell; returns the displayed value's repr, or None."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    tree = ast.parse(source, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not source.rstrip().endswith(";"):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), ns)
    if last is None:
        return None
    value = eval(compile(last, name, "eval"), ns)
    if value is None:
        return None
    ns["_"] = value
    return repr(value)


class _Capture:
    """Points fds 1 and 2 (and sys.stdout/sys.stderr) at fresh files for one cell."""

    def __init__(self):
        self.files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]

    def start(self):
        for fd, f in zip((1, 2), self.files):
            f.seek(0)
            f.truncate()
            os.dup2(f.fileno(), fd)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)

    def stop(self):
        out = []
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - a cell may have closed or replaced it
                pass
        for f in self.files:
            f.seek(0)
            out.append(f.read().decode("utf-8", "replace"))
        return out


def main():
    request = json.load(sys.stdin)
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # a cell's input() sees end of file, as in a kernel without a frontend
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    if int(request.get("memory_limit_MB") or -1) > 0:
        _limit_memory(int(request["memory_limit_MB"]))
    cell_timeout = float(request.get("cell_timeout") or 0)
    total = float(request.get("total_timeout") or 0)
    deadline = time.monotonic() + total if total > 0 else None
    signal.signal(signal.SIGALRM, _alarm)
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    capture = _Capture()
    status = "Finished"
    for i, source in enumerate(request.get("cells") or []):
        limits = [t for t in (cell_timeout if cell_timeout > 0 else None,
                              None if deadline is None else deadline - time.monotonic()) if t is not None]
        display, error = [], []
        capture.start()
        try:
            if limits:
                signal.setitimer(signal.ITIMER_REAL, max(min(limits), 0.001))
            shown = _run(source, "<cell %d>" % i, ns)
            if shown is not None:
                display.append({"text/plain": shown})
        except CellTimeout:
            status = "TimeLimitExceeded"
            error.append({"ename": "TimeoutError", "evalue": "the cell ran past its time limit (cell_timeout %g s, "
                          "total_timeout %g s)" % (cell_timeout, total), "traceback": []})
        except BaseException as e:  # noqa: BLE001 - a cell's exception is its result (SystemExit too)
            error.append(_error(e))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        stdout, stderr = capture.stop()
        report.write(json.dumps({"cell": {"stdout": stdout, "stderr": stderr, "display": display,
                                          "error": error}}) + "\n")
        report.flush()
        if status != "Finished":
            break
    report.write(json.dumps({"status": status}) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
