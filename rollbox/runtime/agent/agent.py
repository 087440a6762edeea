"""rollbox in-sandbox agent: the container's init process (PID 1 inside gVisor).

It speaks length-prefixed JSON frames over its own stdin/stdout, which the daemon holds as
named FIFOs. That channel survives `runsc checkpoint`/`restore` (a restored init gets the new
caller's stdio), so a snapshot restores the agent with the processes it started, and every
command after a restore costs a pipe round trip (~0.1 ms) instead of a `runsc exec` (~25 ms).

Frame: 4-byte big-endian length, then a 32-byte HMAC-SHA256 of the JSON under a per-sandbox
key, then the UTF-8 JSON object (requests and replies alike). Binary data is base64.

Processes in the sandbox run as root and can open /proc/1/fd/{0,1} (gVisor does not hide them
for a non-dumpable process), so they could read and write frames in the channel. The MACs make
a forged reply (a fake "exit 0, tests passed") detectable and a swapped request (a different
command under a genuine id) ignored: the key reaches the agent as a file
that it unlinks before any user process exists, and its memory is not readable (non-dumpable).
Requests carry an integer `id`; the reply carries the same `id`. Requests run concurrently
(one thread each), so a long exec never blocks a ping or a file read.

The agent's other jobs live beside it (installed together at /.rollbox, imported as top-level
modules): frames.py (frame primitives, the HMAC), children.py (spawning, reaping and killing
child processes), execop.py (the exec and spawn requests), fileops.py (the file requests),
procs.py (background processes), jail.py (per-exec cgroups, the OOM watcher) and zygotelink.py
(the link to the episode-container zygote). agent.py itself serves the channel: it reads,
verifies and dispatches requests, and sends replies.

This file runs under the image's own `python3` and must import nothing outside the
standard library.
"""

import base64
import ctypes
import json
import os
import queue
import select
import signal
import socket
import subprocess
import threading
import time

try:
    import children  # beside this file (runtime/agentdir.py installs them; sys.path[0] is /.rollbox)
    import execop
    import fileops
    import frames
    import jail
    import procs
    import zygotelink
except ImportError:  # imported as rollbox.runtime.agent.agent (unit tests)
    from . import children  # type: ignore[no-redef]
    from . import execop  # type: ignore[no-redef]
    from . import fileops  # type: ignore[no-redef]
    from . import frames  # type: ignore[no-redef]
    from . import jail  # type: ignore[no-redef]
    from . import procs  # type: ignore[no-redef]
    from . import zygotelink  # type: ignore[no-redef]

# The siblings' names, also as agent.X: the episode-container modules (zygote.py, inits.py,
# container_init.py) and the unit tests use them so.
_HDR, MAX_FRAME, _compare_digest, _out_lock = frames._HDR, frames.MAX_FRAME, frames._compare_digest, frames._out_lock
hmac_sha256, read_exact = frames.hmac_sha256, frames.read_exact
MARK, PIDS_REPORT_AT, EXEC_PIDS_MAX = children.MARK, children.PIDS_REPORT_AT, children.EXEC_PIDS_MAX
_waiters, _identity = children._waiters, children._identity
reaper, marked_pids, kill_tree, exit_code_of = (children.reaper, children.marked_pids, children.kill_tree,
                                                children.exit_code_of)
_user_kwargs, _home_or_root, make_env, spawn = (children._user_kwargs, children._home_or_root, children.make_env,
                                                children.spawn)
DEFAULT_MAX_OUTPUT, op_spawn, _spawn_failure = execop.DEFAULT_MAX_OUTPUT, execop.op_spawn, execop._spawn_failure
op_write_file, op_read_file, op_list_files, op_remove = (fileops.op_write_file, fileops.op_read_file,
                                                         fileops.op_list_files, fileops.op_remove)

PROTOCOL = 2  # 2: requests carry an HMAC too
KILL_GRACE_S = 0.2


class Workers:
    """Threads made once at start and reused: creating one costs a clone through gVisor's
    kernel, and under a fork bomb (RLIMIT_NPROC reached) it fails. Beyond the reserve, extra
    threads are made when all are busy, if the kernel still allows it."""

    def __init__(self, reserve):
        self.q = queue.SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()
        for _ in range(reserve):
            self._start()

    def _start(self):
        t = threading.Thread(target=self._run, daemon=True)
        t.start()
        with self.lock:
            self.idle += 1

    def _run(self):
        while True:
            fn, args = self.q.get()
            with self.lock:
                self.idle -= 1
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a worker never dies
                pass
            with self.lock:
                self.idle += 1

    def submit(self, fn, *args):
        with self.lock:
            busy = self.idle <= 0
        if busy:
            try:
                self._start()
            except RuntimeError:
                pass  # no thread to be had: it waits for a free worker
        self.q.put((fn, args))


_pool = Workers(0)  # replaced with a reserve of threads by main()


_key = {"key": b""}
# Where replies go: the daemon's channel (stdout), or an episode container's socket (zygote.py).
_out_fd = 1
KEY_FILE = "/.rollbox-key"
TMP_MARKER = "/tmp/.rollbox-tmp-on-disk"  # keeps gVisor's tmpfs off /tmp (runtime/rootfs.py); gone at start


def _frame(msg):
    data = json.dumps(msg, separators=(",", ":")).encode()
    return _HDR.pack(len(data) + 32) + hmac_sha256(_key["key"], data) + data


def _write_frame(frame):
    """Writes one whole frame; the caller holds _out_lock."""
    view = memoryview(frame)
    while view:
        try:
            n = os.write(_out_fd, view)
        except BrokenPipeError:
            # The daemon is gone (restarting); drop the reply, it re-asks.
            return
        except BlockingIOError:
            select.select([], [_out_fd], [], 1.0)
            continue
        view = view[n:]


def send(msg):
    frame = _frame(msg)
    with _out_lock:
        _write_frame(frame)


class OutputGate:
    """`quiesce` and `resume` (gh-19): the channel at a frame boundary for a checkpoint.

    The daemon sends `quiesce` last before a checkpoint, so once this agent has read it no
    request is half-read. Its answer is written under _out_lock, after any reply being written,
    and the lock is then kept until `resume` names the hold (or `hold_s` passes): the checkpoint
    finds no reply half-written either. A restored copy carries the hold; its daemon's first
    request is a `resume` without a token, which releases whatever is held. A `resume` that
    arrives before its `quiesce` ran (answered too late, the daemon went on) cancels it."""

    def __init__(self):
        self.cv = threading.Condition(threading.Lock())
        self.held = None  # the token of the hold in force
        self.cancelled = []  # tokens resumed before their quiesce ran (the last 16)

    def quiesce(self, rid, token, hold_s):
        with _out_lock:
            with self.cv:
                stale = token in self.cancelled
                if stale:
                    self.cancelled.remove(token)
                else:
                    self.held = token
            _write_frame(_frame({"id": rid, "ok": True, "held": not stale}))
            if stale:
                return
            deadline = time.monotonic() + hold_s
            with self.cv:
                while self.held == token:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.held = None
                        break
                    self.cv.wait(left)

    def resume(self, req):
        token = req.get("token")
        if not isinstance(token, str):
            token = None
        with self.cv:
            if token is None or token == self.held:
                self.held = None
                self.cv.notify_all()
            elif token not in self.cancelled:
                self.cancelled.append(token)
                del self.cancelled[:-16]
        return {}


_gate = OutputGate()
QUIESCE_HOLD_MAX_S = 600.0


def op_exec(req):
    """The exec request (execop.py), its stdin fed by a worker of this agent's pool."""
    return execop.op_exec(req, _pool.submit)


def op_identity(req):
    """Per-copy identity after a restore/fork: env for later execs, fresh entropy, hostname."""
    _identity["env"] = dict(req.get("env") or {})
    seed = req.get("entropy")
    if seed:
        _run_restore_hook()
    if seed:
        try:
            # Mixing fresh host entropy in; gVisor's getrandom already reads host entropy.
            with open("/dev/urandom", "wb") as f:
                f.write(base64.b64decode(seed))
        except OSError:
            pass
    host = req.get("hostname")
    if host:
        try:
            socket.sethostname(host)
        except OSError:
            pass
        if os.path.isfile("/etc/hostname"):  # the copy's file still names its source
            try:
                with open("/etc/hostname", "w") as f:
                    f.write(host + "\n")
            except OSError:
                pass
    return {}


# The opt-in reseed hook (the Rust agent's RESTORE_HOOK says why): every restored copy runs
# it once, detached, with its identity and a fresh ROLLBOX_SEED in the environment.
RESTORE_HOOK = "/etc/rollbox/restore-hook"


def _run_restore_hook():
    if not os.path.isfile(RESTORE_HOOK):
        return
    env = {**os.environ, **_identity["env"], "ROLLBOX_SEED": os.urandom(16).hex()}
    mark = "ROLLBOX_RESTORE_HOOK=1"
    cg = jail.create(0, mark)  # cgroups of its own like any command (the root ones are the agent's)
    try:
        spawn([RESTORE_HOOK], env, "/", None, subprocess.DEVNULL, subprocess.DEVNULL, subprocess.DEVNULL, cg=cg)
    except (OSError, ValueError):
        pass
    finally:
        if cg:
            jail.release(cg, mark)


def op_ping(req):
    return {"pid": os.getpid(), "protocol": PROTOCOL, "time": time.time()}


def _spawn_jailed(argv, env, cwd, user, stdin, stdout, stderr, preexec=None):
    """spawn() for a background process: in cgroups of its own, as an exec (kill and the
    OOM watcher find its whole tree); they go when the process table forgets it."""
    mark = env.get(MARK, "")
    cg = jail.create(EXEC_PIDS_MAX, mark)
    try:
        return spawn(argv, env, cwd, user, stdin, stdout, stderr, preexec, cg=cg)
    except BaseException:
        if cg:
            jail.release(cg, mark)
        raise


def _forget_jail(mark):
    name = jail.for_mark(mark)
    if name:
        jail.release(name, mark)


_procs = procs.ProcessTable(_spawn_jailed, make_env, kill_tree, PIDS_REPORT_AT, forget=_forget_jail)


def op_proc_start(req):
    try:
        return _procs.start(req)
    except FileNotFoundError as e:
        cwd = req.get("cwd")
        if cwd and e.filename == cwd:
            raise ValueError("no such working directory: %s" % cwd)
        raise ValueError("command not found: %s" % req["argv"][0])
    except PermissionError as e:
        raise ValueError("cannot run %r: %s" % (req["argv"][0], e))
    except BlockingIOError:  # EAGAIN from fork: RLIMIT_NPROC (it counts threads too)
        raise procs.ProcError("resource_exhausted", "cannot start %r: the sandbox is at its process limit; "
                                                    "nothing was started" % req["argv"][0])


OPS = {
    "exec": op_exec,
    "proc_start": op_proc_start,
    "proc_read": _procs.read,
    "proc_write": _procs.write,
    "proc_kill": _procs.kill,
    "proc_resize": _procs.resize,
    "proc_list": _procs.list,
    "proc_status": _procs.status,
    "write_file": op_write_file,
    "read_file": op_read_file,
    "list_files": op_list_files,
    "remove": op_remove,
    "identity": op_identity,
    "spawn": op_spawn,
    "ping": op_ping,
    "resume": _gate.resume,
}


def handle(req):
    rid = req.get("id")
    t0 = time.monotonic()
    if req.get("op") == "quiesce":  # answers itself, under the output lock it keeps
        token = req.get("token")
        try:
            hold_s = float(req.get("hold_s") or 60.0)
        except (TypeError, ValueError):
            hold_s = 60.0
        if not isinstance(token, str):
            send({"id": rid, "ok": False, "error": "invalid_argument",
                  "message": "quiesce: a string `token` is required"})
            return
        hold_s = min(hold_s, QUIESCE_HOLD_MAX_S) if hold_s >= 0 else 0.0  # NaN too
        _gate.quiesce(rid, token, hold_s)
        return
    try:
        fn = OPS[req["op"]]
        res = fn(req)
        res["agent_s"] = time.monotonic() - t0
        res["id"] = rid
        res["ok"] = True
    except procs.ProcError as e:
        res = {"id": rid, "ok": False, "error": e.kind, "message": str(e)}
    except FileNotFoundError as e:
        res = {"id": rid, "ok": False, "error": "not_found", "message": str(e)}
    except IsADirectoryError as e:
        res = {"id": rid, "ok": False, "error": "is_a_directory", "message": str(e)}
    except NotADirectoryError as e:
        res = {"id": rid, "ok": False, "error": "not_a_directory", "message": str(e)}
    except PermissionError as e:
        res = {"id": rid, "ok": False, "error": "permission_denied", "message": str(e)}
    except ValueError as e:
        res = {"id": rid, "ok": False, "error": "invalid_argument", "message": str(e)}
    except BaseException as e:  # noqa: BLE001 - every failure goes back as a reply
        res = {"id": rid, "ok": False, "error": "agent_error", "message": "%s: %s" % (type(e).__name__, e)}
    send(res)


def _ignore(signum, frame):
    """A handler, not SIG_IGN: handlers reset on exec, so commands get default dispositions."""


def load_key():
    try:
        with open(KEY_FILE, "rb") as f:
            _key["key"] = f.read()
        os.unlink(KEY_FILE)
    except OSError:
        pass


def start_workers():
    """The worker threads and the reaper (started once the launcher is forked: threads do
    not survive fork)."""
    global _pool
    _pool = Workers(4)
    threading.Thread(target=reaper, daemon=True).start()


def serve(fd, relay=None):
    """Reads signed request frames from `fd` forever and runs each on a worker.

    relay: a callable taking the raw frame of a `container_*` request (zygote.py serves
    those)."""
    while True:
        try:
            hdr = read_exact(fd, 4)
        except OSError:
            hdr = None
        if hdr is None:
            # The daemon closed its end (restarting): wait for it to come back.
            time.sleep(0.1)
            continue
        (n,) = _HDR.unpack(hdr)
        if n > MAX_FRAME:
            # Garbage written into our stdin from inside the sandbox: the stream cannot be
            # resynchronised. Ending makes the daemon report the sandbox as ended by its workload.
            os._exit(3)
        frame = read_exact(fd, n)
        if frame is None or len(frame) < 32:
            continue
        mac, body = frame[:32], frame[32:]
        # A request not signed with this sandbox's key came from inside the sandbox (a process
        # writing into /proc/1/fd/0): drop it, never act on it.
        if not _compare_digest(mac, hmac_sha256(_key["key"], body)):
            continue
        try:
            req = json.loads(body)
            if not isinstance(req, dict) or "op" not in req:
                raise ValueError("not a request")
        except ValueError:
            continue
        op = req["op"]
        if relay is not None and isinstance(op, str) and op.startswith("container_"):
            relay(hdr + frame, req)
            continue
        _pool.submit(handle, req)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # As PID 1 we should not die of a stray signal from a process in the sandbox.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM):
        signal.signal(sig, _ignore)
    load_key()
    try:
        os.unlink(TMP_MARKER)
    except OSError:
        pass
    # Before CAP_SYS_ADMIN leaves the bounding set: the launcher of the episode-container
    # zygote keeps it (containers need mount and clone namespaces); no command ever has it.
    zygote = zygotelink.ZygoteLink(_key, send)
    # Per-exec cgroups (jail.py) need CAP_SYS_ADMIN to mount, and no command may run yet.
    # Only as a sandbox's PID 1 under gVisor: on a host (the unit tests) or on runc (the host
    # kernel: ROLLBOX_RUNTIME=runc) they would be the host's own hierarchies.
    if os.getpid() == 1 and os.environ.get("ROLLBOX_RUNTIME") != "runc":
        jail.init()
    try:
        mem_limit = int(os.environ.pop("ROLLBOX_MEMORY_MIB", "0") or 0) << 20
    except ValueError:
        mem_limit = 0
    threading.Thread(target=jail.watch, args=(mem_limit, EXEC_PIDS_MAX), daemon=True).start()
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE=0: no /proc/1/mem, no ptrace
        # The agent keeps CAP_SYS_ADMIN (to set a restored copy's host name) but drops it from
        # the bounding set, so no command it starts ever has it.
        if os.environ.pop("ROLLBOX_PRIVILEGED", "") != "1":
            libc.prctl(24, 21, 0, 0, 0)  # PR_CAPBSET_DROP, CAP_SYS_ADMIN
        else:
            jail.note_unjailed()  # its commands may move processes between cgroups themselves
    except (OSError, AttributeError):
        pass
    start_workers()
    send({"id": 0, "ok": True, "event": "ready", "pid": os.getpid(), "protocol": PROTOCOL})
    serve(0, relay=zygote.relay)


if __name__ == "__main__":
    main()
