"""Warm Python for episode containers: a fork of the zygote's interpreter runs a command that
would otherwise exec a fresh `python3` (~65 ms of CPU under gVisor, against ~25 ms for a fork;
PLATFORM.md "Costs inside a gVisor sandbox"), with what a fresh interpreter would have: its
own argv, environment, working directory, stdio, `__main__`, a re-seeded `random`, and the
interpreter's exit status rules. What it shares with its parent is what was imported before
the fork (zygote.WARM_MODULES), copy-on-write, and the string hash seed.
"""

import os
import runpy
import signal
import sys

_PY_FLAGS = set("uBsEIdqbOR")


def python_command(argv, env, root=""):
    """(mode, target, args, flags) when `argv` runs this very interpreter on a script (`-c`,
    `-m` or a path), so a fork of the warm process can run it; None otherwise (exec'd as is).
    `root`: where the command's filesystem is mounted here ("" inside it), so that a
    container that replaced its python3 gets its own (an absolute symlink: not warm)."""
    prog = argv[0]
    if "/" not in prog:
        for d in (env.get("PATH") or "/usr/bin:/bin").split(":"):
            cand = os.path.join(d or ".", prog)
            if cand.startswith("/") and os.path.isfile(root + cand) and os.access(root + cand, os.X_OK):
                prog = cand
                break
        else:
            return None
    elif not prog.startswith("/"):
        return None  # relative to a working directory: the init resolves it
    try:
        if os.path.realpath(root + prog) != root + os.path.realpath(sys.executable):
            return None
    except OSError:
        return None
    flags = set()
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-c", "-m"):
            if i + 1 >= len(argv):
                return None
            return (a[1], argv[i + 1], argv[i + 2:], flags)
        if a.startswith("-") and len(a) > 1 and set(a[1:]) <= _PY_FLAGS:
            flags |= set(a[1:])
            i += 1
            continue
        if a.startswith("-"):
            return None  # -W, -X, -, ...: the real interpreter parses those
        return ("f", a, argv[i + 1:], flags)
    return None  # an interactive interpreter reading stdin


class WarmProcess:
    """The slice of subprocess.Popen that agent.op_exec uses, for a forked warm interpreter."""

    def __init__(self, pid, stdin, stdout, stderr):
        self.pid = pid
        self.stdin = os.fdopen(stdin, "wb") if stdin is not None else None
        self.stdout = os.fdopen(stdout, "rb", buffering=0)
        self.stderr = os.fdopen(stderr, "rb", buffering=0)
        self.returncode = None


def launch_warm_python(argv, env, cwd, want_stdin, user):
    """agent.op_exec's launcher in a container: a fork of this interpreter runs a Python
    command; None for anything else (then exec'd). Raises what Popen raises for a bad cwd."""
    if user:
        return None
    cmd = python_command(argv, env)
    if cmd is None:
        return None
    if not os.path.isdir(cwd):
        raise FileNotFoundError(2, "No such file or directory", cwd)
    in_r = in_w = None
    if want_stdin:
        in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            # Only what the container's init changed (resetting all 64 costs ~10 ms here);
            # SIGPIPE and SIGXFSZ stay ignored, as a fresh interpreter has them.
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for name in INIT_HANDLED:  # the init's no-op handlers: a program gets a fresh python3's
                signal.signal(getattr(signal, name), _FRESH.get(name, signal.SIG_DFL))
            if in_r is None:
                in_r = os.open("/dev/null", os.O_RDONLY)
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 65536)
            os.chdir(cwd)
            _run_python(cmd, env)
        finally:
            os._exit(120)
    for fd in (out_w, err_w, in_r):
        if fd is not None:
            os.close(fd)
    return WarmProcess(pid, in_w, out_r, err_r)


# Signals the container's init catches with a no-op (container_init.py), so that `kill -TERM 1`
# from inside cannot end it; a warm program forked from it gets the defaults back.
INIT_HANDLED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE")
_FRESH = {"SIGINT": signal.default_int_handler, "SIGPIPE": signal.SIG_IGN}  # CPython's own at start


# As PID 1 of its namespace the in-place program would ignore these when sent by itself or a
# child (the kernel drops default-action signals to an init): a handler makes each end the
# program as its default action would, with the shell's status 128+N.
_FATAL = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT", "SIGVTALRM", "SIGPROF")


def _die_as_default(signum, _frame):
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        pass
    os._exit(128 + signum)


def run_in_place(cmd, env, cwd, stdio):
    """Runs the command in this process (the container's init, forked from the zygote) and
    _exits with its status. stdio: fds for 0, 1, 2 (None: /dev/null for stdin)."""
    try:
        stdin, out, err = stdio
        if stdin is None:
            stdin = os.open("/dev/null", os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, 65536)
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for name in _FATAL:
            signal.signal(getattr(signal, name), _die_as_default)
        os.chdir(cwd)
    except BaseException:  # noqa: BLE001 - a set-up failure is the command's failure
        os._exit(126)
    _run_python(cmd, env)


def _run_python(cmd, env):
    """In the fork: what `python3 [flags] (-c code | -m mod | file) args` does, then _exit."""
    import io
    _forget_secrets()
    mode, target, args, flags = cmd
    os.environ.clear()
    os.environ.update(env)
    unbuffered = "u" in flags or bool(env.get("PYTHONUNBUFFERED"))
    enc = "utf-8"
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=enc, errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=enc, errors="surrogateescape",
                                  line_buffering=unbuffered, write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=enc, errors="backslashreplace",
                                  line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    code = 0
    try:
        if "random" in sys.modules:
            sys.modules["random"].seed()  # as a fresh interpreter would: from os.urandom
        if mode == "c":
            sys.argv = ["-c", *args]
            sys.path[0] = ""
            main = type(sys)("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        elif mode == "m":
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.realpath(target))
            code_obj = _script_code(target)
            if code_obj is None:
                runpy.run_path(target, run_name="__main__")  # a directory or zip with __main__.py
            else:
                main = type(sys)("__main__")
                ext = sys.modules.get("_frozen_importlib_external")
                main.__dict__.update(__builtins__=__builtins__, __file__=target, __cached__=None,
                                     __loader__=ext.SourceFileLoader("__main__", target) if ext else None)
                sys.modules["__main__"] = main
                exec(code_obj, main.__dict__)
    except SystemExit as e:
        code = _exit_status(e.code)
    except BaseException as e:  # noqa: BLE001 - as the interpreter does: traceback, status 1
        import traceback
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next  # our frames and runpy's (frozen since Python 3.11) are not the program's
        try:
            traceback.print_exception(type(e), e, tb)
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe loses output, as it would anyway
            pass
    os._exit(code)


def _forget_secrets():
    """The fork carries the zygote's memory: the sandbox's channel key (every restore of the
    snapshot shares it) and the HMAC pads made from it must not reach the user's program."""
    ag = sys.modules.get("agent")
    if ag is not None:
        key = getattr(ag, "_key", None)
        if isinstance(key, dict):
            key.clear()
        pads = getattr(ag, "_pads", None)
        if isinstance(pads, dict):
            pads.clear()


def _script_code(path):
    """The compiled code of the script at `path`, read and compiled as `python3 path` does
    (runpy.run_path would first try it as a zip archive and import pkgutil: ~20 syscalls and
    two imports in every fork); None for a directory or zip archive (runpy runs those). A file
    that cannot be opened ends the process as CPython does: the message and status 2."""
    import io
    try:
        with io.open_code(path) as f:
            source = f.read()
    except IsADirectoryError:
        return None
    except OSError as e:
        sys.stderr.write("python3: can't open file %r: [Errno %d] %s\n" % (path, e.errno, e.strerror))
        sys.stderr.flush()
        os._exit(2)
    if source[:4] == b"PK\x03\x04":
        return None
    return compile(source, path, "exec", dont_inherit=True)


def _exit_status(value):
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        sys.stderr.write("%s\n" % (value,))
    except BaseException:  # noqa: BLE001
        pass
    return 1


