"""`rollbox shell ID` (an interactive terminal in a sandbox) and `rollbox process ...`
(its background processes), on the SDK's `sb.process` (gh-16)."""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from typing import Optional

import typer

process_app = typer.Typer(help="Background processes of a sandbox.", no_args_is_help=True)

# bash when the image has it, else sh; a login shell, so the profile's PATH and prompt apply.
DEFAULT_SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"]


def _size() -> tuple[int, int]:
    try:
        s = os.get_terminal_size(sys.stdout.fileno())
        if s.columns > 0 and s.lines > 0:  # a fresh pty (script, ssh -t) may say 0x0
            return s.columns, s.lines
    except OSError:
        pass
    return 80, 24


def run_shell(sandbox_id: str, cmd: list[str]) -> int:
    """Runs `cmd` (default: the image's bash or sh) under a terminal in the sandbox, this
    terminal in raw mode wired to it (keys in, bytes out, SIGWINCH -> resize) until it ends.
    Returns its exit code (1 when its timeout or a signal gave none)."""
    from ..sdk.sandbox import Sandbox

    sb = Sandbox().connect(sandbox_id)
    cols, rows = _size()
    p = sb.process.exec(*(cmd or DEFAULT_SHELL), pty=True, cols=cols, rows=rows)
    done = threading.Event()

    def pump_out() -> None:
        try:
            for chunk in p.stdout:
                os.write(sys.stdout.fileno(), chunk)
        finally:
            done.set()

    out = threading.Thread(target=pump_out, daemon=True)
    out.start()
    fd = sys.stdin.fileno()
    interactive = os.isatty(fd)
    saved = termios.tcgetattr(fd) if interactive else None
    # The handler only notes the resize; the loop below sends it. A request made inside the
    # handler would run nested in whatever call the main thread was blocked in (a stdin write).
    # A plain flag: an Event's lock, held by the loop when the signal lands, would deadlock it.
    resized = [False]

    def on_winch(*_: object) -> None:
        resized[0] = True

    old_winch = signal.signal(signal.SIGWINCH, on_winch) if interactive else None
    try:
        if interactive:
            tty.setraw(fd)
        while not done.is_set():
            if resized[0]:
                resized[0] = False  # before reading the size: a resize during the request is sent next
                p.resize(*_size())
            if not select.select([fd], [], [], 0.1)[0]:
                continue
            data = os.read(fd, 4096)
            if not data:  # piped stdin ended: the terminal gets ^D
                p.stdin.close()
                done.wait()
                break
            p.stdin.write(data)
    except Exception:  # noqa: BLE001 - stdin closed when the process ended between two keys
        if not done.is_set():
            raise
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, old_winch)
    out.join(5)
    res = p.wait(timeout=30)
    return res.exit_code if res.exit_code is not None else 1


def shell(sandbox_id: str = typer.Argument(..., help="sandbox id (sb-...)"),
          cmd: Optional[list[str]] = typer.Argument(None, help="command instead of the shell, after --")) -> None:
    """An interactive terminal in a sandbox: rollbox shell ID [-- CMD...]. Exits with its code."""
    raise typer.Exit(run_shell(sandbox_id, list(cmd or [])))


@process_app.command("ls")
def process_ls(sandbox_id: str) -> None:
    """List a sandbox's background processes (running, and recently ended)."""
    from ..sdk.sandbox import Sandbox

    now = time.time()
    print(f"{'PID':>7} {'STATE':<9} {'EXIT':>5} {'AGE':>7} {'OUT':>10} {'ERR':>10}  COMMAND")
    for p in Sandbox().connect(sandbox_id).process.list_processes():
        state = "running" if p.running else ("timeout" if p.timed_out else "exited")
        code = "" if p.exit_code is None else str(p.exit_code)
        print(f"{p.pid:>7} {state:<9} {code:>5} {now - p.started_at:>6.0f}s {p.stdout_total:>10} {p.stderr_total:>10}  "
              f"{' '.join(p.argv)[:80]}")


@process_app.command("logs")
def process_logs(sandbox_id: str, pid: int) -> None:
    """Print a background process's retained output (stdout, stderr), streaming until it ends."""
    from ..sdk.sandbox import Sandbox

    p = Sandbox().connect(sandbox_id).process.get_process(pid)
    for stream, chunk in p.logs():
        (sys.stdout if stream == "stdout" else sys.stderr).buffer.write(chunk)
        (sys.stdout if stream == "stdout" else sys.stderr).flush()


@process_app.command("kill")
def process_kill(sandbox_id: str, pid: int, sig: int = typer.Option(9, "--signal", "-s", help="signal number")) -> None:
    """Signal a background process's whole tree (default SIGKILL)."""
    from ..sdk.sandbox import Sandbox

    n = Sandbox().connect(sandbox_id).process.get_process(pid).kill(sig)
    print(f"signalled {n} process(es)")
