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
    """This terminal's (columns, rows); 80x24 for a dimension it does not have (a fresh pty,
    as `script` or `ssh -t` make, may say 0)."""
    try:
        s = os.get_terminal_size(sys.stdout.fileno())
        return s.columns or 80, s.lines or 24
    except OSError:
        return 80, 24


class _Ended(Exception):
    """This side ended the session (a closed terminal, SIGHUP/SIGTERM/SIGINT): `code` is
    the CLI's exit code, 128 + the signal as shells report it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _on_signal(signum: int, _frame: object) -> None:
    raise _Ended(128 + signum)


def run_shell(sandbox_id: str, cmd: list[str]) -> int:
    """Runs `cmd` (default: the image's bash or sh) in the sandbox, wired to this terminal in
    raw mode (keys in, bytes out, its size followed) until it ends. As with ssh and `docker
    exec -t`, it gets a terminal only when this stdin is one; piped input reaches it through a
    pipe and ends at EOF. A closed terminal or SIGHUP/SIGTERM/SIGINT here kills it.
    Returns its exit code (1 when its timeout or a signal gave none; 128+N for signal N here).

    Raises:
        SandboxNotFound, SandboxTerminated, DaemonUnavailable: (the CLI prints one line).
    """
    from .. import errors
    from ..sdk.sandbox import Sandbox

    sb = Sandbox().connect(sandbox_id)
    fd = sys.stdin.fileno()
    interactive = os.isatty(fd)
    cols, rows = _size()
    # This terminal's type, as `docker exec -t` and ssh pass it (clear, less and vim need it).
    term = os.environ.get("TERM") or "xterm"
    p = sb.process.exec(*(cmd or DEFAULT_SHELL), pty=interactive, cols=cols, rows=rows, env={"TERM": term})
    done = threading.Event()
    failed: list[BaseException] = []

    def pump_out() -> None:
        try:
            for stream, chunk in p.logs():
                os.write((sys.stdout if stream == "stdout" else sys.stderr).fileno(), chunk)
        except OSError:  # this terminal is gone: nobody is left to show it to
            failed.append(_Ended(128 + signal.SIGHUP))
        except Exception as e:  # noqa: BLE001 - raised by the main thread, once the terminal is itself again
            failed.append(e)
        finally:
            done.set()

    def follow_size() -> None:
        """Sends this terminal's size whenever it changes, looking every 0.1 s. A thread of
        its own, so a resize arrives while the input loop is blocked in a write the command
        does not read; polling, so no SIGWINCH can be lost (its handler would run only
        between the main thread's bytecodes, and CI once saw a resize never arrive)."""
        last = (cols, rows)
        while not done.wait(0.1):
            now = _size()
            if now != last:
                try:
                    p.resize(*now)
                except errors.RollboxError:  # the command or its sandbox ended meanwhile
                    return
                last = now

    threads = [threading.Thread(target=pump_out, daemon=True)]
    if interactive:
        threads.append(threading.Thread(target=follow_size, daemon=True))
    for t in threads:
        t.start()
    saved = termios.tcgetattr(fd) if interactive else None
    old = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    ended: int | None = None
    try:
        if saved is not None:
            tty.setraw(fd)
        while not done.is_set():
            if not select.select([fd], [], [], 0.1)[0]:
                continue
            data = os.read(fd, 4096)
            if not data:  # input ended: the command reads EOF (a terminal gets ^D), then may go on
                p.stdin.close()
                done.wait()
                break
            p.stdin.write(data, timeout=None)  # blocks while the command does not read, as a pipe does
    except _Ended as e:
        ended = e.code
    except OSError:  # reading a terminal that was closed
        ended = 128 + signal.SIGHUP
    except (errors.StdinClosed, errors.ProcessNotFound):
        pass  # the command ended between two reads here: its exit code below
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if saved is not None:
            try:
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)
            except termios.error:  # the terminal is gone
                pass
    if ended is None:
        threads[0].join(5)
        if failed and isinstance(failed[0], _Ended):
            ended = failed[0].code
        elif failed:  # the sandbox ended under the command, or the daemon went: one line from the CLI
            raise failed[0]
    if ended is not None:
        try:
            p.kill()  # nobody is left at this end: what it started goes too
        except errors.RollboxError:
            pass
        return ended
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
def process_logs(sandbox_id: str, pid: int,
                 follow: bool = typer.Option(True, "--follow/--no-follow", "-f/-F",
                                             help="stream until it ends (default), or print what is retained and exit")
                 ) -> None:
    """Print a background process's retained output (stdout, stderr), streaming until it ends."""
    from ..sdk.sandbox import Sandbox

    p = Sandbox().connect(sandbox_id).process.get_process(pid)
    for stream, chunk in p.logs(follow=follow):
        (sys.stdout if stream == "stdout" else sys.stderr).buffer.write(chunk)
        (sys.stdout if stream == "stdout" else sys.stderr).flush()


@process_app.command("kill")
def process_kill(sandbox_id: str, pid: int, sig: int = typer.Option(9, "--signal", "-s", help="signal number")) -> None:
    """Signal a background process's whole tree (default SIGKILL)."""
    from ..sdk.sandbox import Sandbox

    n = Sandbox().connect(sandbox_id).process.get_process(pid).kill(sig)
    print(f"signalled {n} process(es)")
