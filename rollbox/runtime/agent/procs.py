"""Background processes of the in-sandbox agent (gh-16): the process table behind the
`proc_*` ops (protocol: /work/notes/proc-spec.md, mirrored by the native agent).

The table lives in the agent, so a process outlives the client and the daemon that started it,
and a memory snapshot captures it with its retained output: every restored copy lists it and
keeps running it. The daemon only relays and streams.

Each process gets one reader thread that drains its output continuously (a process never
blocks because nobody reads), notices its exit (the agent's reaper reaps it) and enforces its
timeout. Output is retained per stream: the first `max_retained` bytes forever plus a sliding
window of the most recent TAIL_BYTES (`Retained`).

This file runs under the image's own `python3` next to agent.py and imports nothing outside
the standard library. It imports nothing of agent.py either (agent.py runs as __main__; a
second import would make a second copy of its state): agent.py hands it its helpers.
"""

import base64
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import threading
import time

DEFAULT_RETAINED = 1024 * 1024  # head bytes kept forever per stream, when a request does not say
TAIL_BYTES = 1024 * 1024  # the sliding window of recent output, per stream
MAX_WAIT_S = 10.0
DEFAULT_READ = 1024 * 1024
KEEP_ENDED = 64  # ended processes listed
FORGET_AFTER_S = 600.0
WRITE_WAIT_S = 5.0  # the longest one proc_write waits for a full pipe to take bytes
EXIT_GRACE_S = 0.05  # after the main process exits, background children may hold the pipes
STREAMS = ("stdout", "stderr")


class ProcError(Exception):
    """An error reply of kind `kind` (process_not_found, stdin_closed, not_a_pty)."""

    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind


class Retained:
    """One stream's retained output: bytes [0, len(head)) forever, plus the most recent
    `tail_cap` bytes as [tail_start, total). Memory stays under head_cap + 2 * tail_cap."""

    def __init__(self, head_cap, tail_cap=TAIL_BYTES):
        self.head_cap = max(0, int(head_cap))
        self.tail_cap = max(1, int(tail_cap))
        self.head = bytearray()
        self.tail = bytearray()
        self.tail_start = 0
        self.total = 0

    def append(self, data):
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
            self.tail_start = len(self.head)
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap:  # trim in batches: amortised O(1) per byte
                drop = len(self.tail) - self.tail_cap
                del self.tail[:drop]
                self.tail_start += drop

    def compact(self):
        """Trims the tail window to exactly tail_cap bytes (once the stream has ended)."""
        if len(self.tail) > self.tail_cap:
            drop = len(self.tail) - self.tail_cap
            del self.tail[:drop]
            self.tail_start += drop

    @property
    def dropped(self):
        """Whether some bytes are gone (between the head and the tail window)."""
        return self.tail_start > len(self.head)

    def read(self, offset, max_bytes):
        """(data, start, truncated): up to `max_bytes` from `offset` on; from the first kept byte
        after it (truncated=True) when `offset` lies in a dropped region."""
        offset = max(0, min(int(offset), self.total))
        max_bytes = max(1, int(max_bytes))
        if offset < len(self.head):
            return bytes(self.head[offset:offset + max_bytes]), offset, False
        start = max(offset, self.tail_start)
        i = start - self.tail_start
        return bytes(self.tail[i:i + max_bytes]), start, start > offset


class Proc:
    """One API-started process and its retained output."""

    def __init__(self, popen, waiter, mark, req, in_fd, out_fds, pty_fd):
        self.popen = popen
        self.pid = popen.pid
        self.waiter = waiter  # [event, status]: the agent's reaper fills it
        self.mark = mark
        self.argv = list(req["argv"])
        self.cwd = req.get("cwd")
        self.user = req.get("user")
        self.pty = pty_fd is not None
        self.pty_fd = pty_fd
        self.in_fd = in_fd
        self.in_lock = threading.Lock()
        self.out_fds = out_fds  # {fd: stream name}
        cap = DEFAULT_RETAINED if req.get("max_retained") is None else int(req["max_retained"])
        self.out = {s: Retained(cap) for s in STREAMS}
        self.closed = {s: False for s in STREAMS}  # reader reached EOF (or gave up) on it
        self.cond = threading.Condition()
        self.started_at = time.time()
        self.ended_at = None
        self.status = None
        self.timed_out = False
        self.pids_limited = False
        timeout = req.get("timeout")
        self.deadline = time.monotonic() + float(timeout) if timeout else None

    @property
    def running(self):
        return self.status is None and not self.waiter[0].is_set()

    def entry(self):
        st = self.status
        return {
            "pid": self.pid, "argv": self.argv, "cwd": self.cwd, "user": self.user, "pty": self.pty,
            "running": self.running,
            "exit_code": None if st is None or self.timed_out else _exit_code(st),
            "signal": os.WTERMSIG(st) if st is not None and os.WIFSIGNALED(st) else None,
            "timed_out": self.timed_out, "started_at": self.started_at, "ended_at": self.ended_at,
            "stdout_total": self.out["stdout"].total, "stderr_total": self.out["stderr"].total,
        }


def _exit_code(status):
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return -1


class ProcessTable:
    """The agent's background processes, by pid.

    spawn(argv, env, cwd, user, stdin, stdout, stderr, preexec) -> (Popen, waiter): agent.py's
    spawn (env/user as exec does them, own session, reaper registration).
    make_env(req) -> (env, mark): exec's environment, with the tree mark set.
    kill_tree(pid, mark, sig) -> processes signalled: the one kill mechanism of the agent.
    pids_report_at: a tree this large when its timeout kills it filled the process limit.
    """

    def __init__(self, spawn, make_env, kill_tree, pids_report_at, forget=lambda mark: None):
        self._spawn = spawn
        self._make_env = make_env
        self._kill_tree = kill_tree
        self._forget = forget  # forget(mark): the process left the table (its cgroups may go)
        self._pids_report_at = pids_report_at
        self._lock = threading.Lock()
        self._procs = {}

    # ---- ops ---------------------------------------------------------------------------

    def start(self, req):
        argv = req.get("argv")
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("proc_start needs a non-empty list of string arguments")
        env, mark = self._make_env(req)
        cwd = req.get("cwd") or _home_or_root(env)
        req = dict(req, cwd=cwd)
        try:
            return self._start(req, argv, env, mark, cwd)
        except BlockingIOError as e:  # EAGAIN from fork: the sandbox's process limit
            raise ProcError("resource_exhausted", "cannot start %r: the sandbox is at its process limit (%s); end "
                                                  "some processes (or raise pids=) and retry" % (argv[0], e)) from None

    def _start(self, req, argv, env, mark, cwd):
        pty_fd = None
        if req.get("pty"):
            master, slave = os.openpty()
            _set_size(master, int(req.get("cols") or 80), int(req.get("rows") or 24))
            try:
                popen, waiter = self._spawn(argv, env, cwd, req.get("user"), slave, slave, slave, _take_ctty)
            finally:
                os.close(slave)
            pty_fd = master
            in_fd, out_fds = master, {master: "stdout"}
        else:
            popen, waiter = self._spawn(argv, env, cwd, req.get("user"), subprocess.PIPE, subprocess.PIPE,
                                        subprocess.PIPE, None)
            in_fd = popen.stdin.fileno()
            out_fds = {popen.stdout.fileno(): "stdout", popen.stderr.fileno(): "stderr"}
        p = Proc(popen, waiter, mark, req, in_fd, out_fds, pty_fd)
        if p.pty:
            p.closed["stderr"] = True  # merged into the terminal
        try:
            threading.Thread(target=self._pump, args=(p,), daemon=True).start()
        except RuntimeError:
            # No thread to be had (the sandbox's process limit, a fork bomb): a process
            # nobody drains would block on a full pipe, so it is not left running.
            self._kill_tree(p.pid, p.mark, signal.SIGKILL)
            self._forget(p.mark)
            for f in (popen.stdin, popen.stdout, popen.stderr):
                if f is not None:
                    f.close()
            if pty_fd is not None:
                os.close(pty_fd)
            raise ProcError("resource_exhausted", "cannot start a reader thread for %r: the sandbox is at its "
                                                  "process limit; nothing was started" % argv[0])
        with self._lock:
            self._prune()
            self._procs[p.pid] = p
        return {"pid": p.pid, "started_at": p.started_at}

    def read(self, req):
        p = self._get(req)
        offsets = req.get("offsets") or {}
        want = {s: max(0, int(offsets.get(s) or 0)) for s in STREAMS}
        wait = max(0.0, min(float(req.get("wait") or 0.0), MAX_WAIT_S))
        max_bytes = int(req.get("max_bytes") or DEFAULT_READ)
        deadline = time.monotonic() + wait
        with p.cond:
            while True:
                ended = p.status is not None and all(p.closed.values())
                fresh = any(p.out[s].total > want[s] for s in STREAMS)
                left = deadline - time.monotonic()
                if fresh or ended or left <= 0:
                    break
                p.cond.wait(left)
            res = {"pid": p.pid}
            for s in STREAMS:
                data, start, truncated = p.out[s].read(want[s], max_bytes)
                res[s] = {"data": base64.b64encode(data).decode(), "offset": start, "total": p.out[s].total,
                          "truncated": truncated, "eof": ended and start + len(data) >= p.out[s].total}
            res.update({k: v for k, v in p.entry().items() if k in ("running", "exit_code", "signal", "timed_out")})
            res["pids_limited"] = p.pids_limited
            # `running` flips with the reap; the streams' eof waits for the reader to finish.
            res["running"] = not ended
        return res

    def write(self, req):
        """Writes what the pipe takes within WRITE_WAIT_S (a process that does not read must
        not hold a request past the daemon's patience: it would take the sandbox for wedged);
        `written` says how much, the caller sends the rest again. `close` applies once all
        was written."""
        p = self._get(req)
        data = base64.b64decode(req.get("data") or "")
        with p.in_lock:
            if p.in_fd is None:
                raise ProcError("stdin_closed", "stdin of process %d is closed" % p.pid)
            view = memoryview(data)
            deadline = time.monotonic() + WRITE_WAIT_S
            try:
                while view:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [p.in_fd], [], left)[1]:
                        break
                    os.set_blocking(p.in_fd, False)
                    try:
                        view = view[os.write(p.in_fd, view):]
                    except BlockingIOError:
                        pass
                    finally:
                        os.set_blocking(p.in_fd, True)
            except OSError as e:  # EPIPE: the process closed its end (or ended)
                raise ProcError("stdin_closed", "stdin of process %d is closed: %s" % (p.pid, e))
            written = len(data) - len(view)
            if req.get("close") and not view:
                if p.pty:
                    os.write(p.in_fd, b"\x04")  # EOF for the terminal's reader; the master stays ours
                else:
                    p.popen.stdin.close()
                p.in_fd = None
        return {"pid": p.pid, "written": written}

    def kill(self, req):
        p = self._get(req)
        sig = int(req.get("signal") or signal.SIGKILL)
        if sig <= 0 or sig >= 65:
            raise ValueError("signal %d is not a signal number (1..64)" % sig)
        return {"pid": p.pid, "killed": self._kill_tree(p.pid, p.mark, sig)}

    def resize(self, req):
        p = self._get(req)
        if not p.pty:
            raise ProcError("not_a_pty", "process %d has no terminal (start it with pty=True to resize)" % p.pid)
        _set_size(p.pty_fd, int(req["cols"]), int(req["rows"]))
        return {"pid": p.pid}

    def list(self, req):
        with self._lock:
            self._prune()
            procs = sorted(self._procs.values(), key=lambda p: p.started_at)
        return {"processes": [p.entry() for p in procs]}

    def status(self, req):
        return self._get(req).entry()

    # ---- internals ---------------------------------------------------------------------

    def _get(self, req):
        try:
            pid = int(req.get("pid"))
        except (TypeError, ValueError):
            raise ProcError("process_not_found", "pid %r is not a process id" % (req.get("pid"),))
        with self._lock:
            p = self._procs.get(pid)
        if p is None:
            raise ProcError("process_not_found", "no process with pid %d was started through the API (or it "
                                                 "ended over %d s ago)" % (pid, FORGET_AFTER_S))
        return p

    def _prune(self):
        """Forgets ended processes beyond the KEEP_ENDED most recent or older than
        FORGET_AFTER_S, killing what is left of their trees first: a process gone from the
        list is gone from the sandbox. Called with self._lock held."""
        now = time.time()
        ended = sorted((p for p in self._procs.values() if p.ended_at is not None), key=lambda p: p.ended_at)
        for i, p in enumerate(ended):
            if len(ended) - i > KEEP_ENDED or now - p.ended_at > FORGET_AFTER_S:
                self._kill_tree(p.pid, p.mark, signal.SIGKILL)
                self._forget(p.mark)
                del self._procs[p.pid]

    def _append(self, p, stream, chunk):
        with p.cond:
            p.out[stream].append(chunk)
            p.cond.notify_all()

    def _pump(self, p):
        """Drains the process's output until EOF, notes its exit and enforces its timeout."""
        fds = list(p.out_fds)
        exited_at = None
        while fds:
            now = time.monotonic()
            if exited_at is None and p.waiter[0].is_set():
                exited_at = now
                with p.cond:
                    p.status = p.waiter[1]
                    p.ended_at = time.time()
                    p.cond.notify_all()
            if exited_at is not None and now - exited_at > EXIT_GRACE_S:
                break
            if p.deadline is not None and now >= p.deadline and exited_at is None:
                p.timed_out = True
                p.deadline = None
                p.pids_limited = self._kill_tree(p.pid, p.mark, signal.SIGKILL) >= self._pids_report_at
            wait = 0.05 if exited_at is not None or p.deadline is not None else 0.5
            try:
                ready = select.select(fds, [], [], wait)[0]
            except (OSError, ValueError):
                break
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: a terminal whose last holder closed it
                    chunk = b""
                if chunk:
                    self._append(p, p.out_fds[fd], chunk)
                else:
                    fds.remove(fd)
        for fd in fds:  # what is buffered still counts
            try:
                while select.select([fd], [], [], 0)[0]:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    self._append(p, p.out_fds[fd], chunk)
            except OSError:
                pass
        p.waiter[0].wait()
        with p.cond:
            p.status = p.waiter[1]
            if p.ended_at is None:
                p.ended_at = time.time()
            for s in STREAMS:
                p.closed[s] = True
                p.out[s].compact()  # 64 ended processes are kept: each at most head + tail
            p.cond.notify_all()
        for f in (p.popen.stdout, p.popen.stderr):
            if f is not None:
                f.close()
        with p.in_lock:
            if p.pty_fd is not None:
                os.close(p.pty_fd)
                p.in_fd = None
            elif p.in_fd is not None:
                try:
                    p.popen.stdin.close()
                except OSError:
                    pass
                p.in_fd = None
        p.popen.returncode = _exit_code(p.status) if p.status is not None else -9


def _home_or_root(env):
    home = env.get("HOME")
    return home if home and os.path.isdir(home) else "/"


def _set_size(fd, cols, rows):
    if not (0 < cols < 65536 and 0 < rows < 65536):
        raise ValueError("terminal size %dx%d must be 1..65535 columns and rows" % (cols, rows))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_ctty():
    """In the child, after setsid: the terminal on fd 0 becomes its controlling terminal
    (job control, ^C as SIGINT)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
