"""The init of one episode container (PID 1 of its namespaces), forked from zygote.py.

Single-threaded on purpose: under gVisor a fork of a Python process with six threads cost
~55 ms of CPU against ~25 ms with one (measured 2026-12-01, systrap), and every Python command
of the episode is a fork of this process (a warm interpreter). So requests, the output of
running commands, their timeouts and the reaping of orphans all share one select() loop.

Requests are agent.py's (`exec`, `write_file`, `read_file`, `list_files`, `remove`, `ping`),
arriving as `container_<op>` frames on the socket to the zygote; replies are signed frames
with the sandbox key, as the agent's.
"""

import json
import os
import select
import signal
import socket
import subprocess
import time

import agent
import warm_python

# EBUSY (a mount point, e.g. "/"), ENAMETOOLONG, EROFS, EINVAL, ENOSPC, EDQUOT, EFBIG, ELOOP.
_INVALID_ERRNOS = frozenset({16, 36, 30, 22, 28, 122, 27, 40})
AFTER_EXIT_S = 0.05  # after a command exits, its background children may hold its pipes
READ_CHUNK = 65536


class Running:
    """One exec in flight: its process, output so far and deadline."""

    def __init__(self, req, proc, mark, stdin_data, cap, timeout):
        self.req = req
        self.proc = proc
        self.pid = proc.pid
        self.mark = mark
        self.start = time.monotonic()
        self.deadline = self.start + timeout if timeout else None
        self.cap = cap
        self.out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        self.totals = {fd: 0 for fd in self.out}
        self.open = set(self.out)
        self.stdout_fd, self.stderr_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.stdin = proc.stdin
        self.pending = memoryview(stdin_data) if stdin_data is not None else None
        if self.stdin is not None:
            os.set_blocking(self.stdin.fileno(), False)
        for fd in self.open:
            os.set_blocking(fd, False)
        self.status = None
        self.exited_at = None
        self.timed_out = False
        self.tree = 0

    def take(self, fd):
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.open.discard(fd)
            return
        self.totals[fd] += len(chunk)
        room = self.cap - len(self.out[fd])
        if room > 0:
            self.out[fd] += chunk[:room]

    def feed(self):
        try:
            n = os.write(self.stdin.fileno(), self.pending)
            self.pending = self.pending[n:]
        except BlockingIOError:
            return
        except OSError:
            self.pending = memoryview(b"")
        if not self.pending:
            self.close_stdin()

    def close_stdin(self):
        if self.stdin is not None:
            try:
                self.stdin.close()
            except OSError:
                pass
            self.stdin = None
            self.pending = None

    def done(self, now):
        if self.timed_out:
            return True
        if self.status is None:
            return False
        return not self.open or now - self.exited_at > AFTER_EXIT_S

    def result(self):
        for fd in list(self.open):
            self.take(fd)
        self.close_stdin()
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        st = self.status
        self.proc.returncode = agent.exit_code_of(st) if st is not None else -9
        return {
            "exit_code": None if self.timed_out or st is None else agent.exit_code_of(st),
            "signal": os.WTERMSIG(st) if st is not None and os.WIFSIGNALED(st) else None,
            "stdout": agent.base64.b64encode(bytes(self.out[self.stdout_fd])).decode(),
            "stderr": agent.base64.b64encode(bytes(self.out[self.stderr_fd])).decode(),
            "stdout_bytes": self.totals[self.stdout_fd],
            "stderr_bytes": self.totals[self.stderr_fd],
            "truncated": self.totals[self.stdout_fd] > self.cap or self.totals[self.stderr_fd] > self.cap,
            "timed_out": self.timed_out,
            "pids_limited": self.tree >= agent.PIDS_REPORT_AT,
            "duration_s": time.monotonic() - self.start,
        }


def wait_and_pump(running, extra_fds, wake_fd, reap):
    """One turn of a single-threaded exec loop: select() on `extra_fds` and the pipes of the
    `running` execs (until the nearest deadline), drain the SIGCHLD wake-up pipe, `reap()`,
    then read output and feed stdin. Returns the readable fds among `extra_fds`."""
    now = time.monotonic()
    rfds = [*extra_fds, wake_fd]
    wfds = []
    wait = 1.0
    for r in running:
        rfds.extend(r.open)
        if r.pending is not None:
            wfds.append(r.stdin.fileno())
        if r.deadline is not None:
            wait = min(wait, max(0.0, r.deadline - now))
        if r.status is not None:
            wait = min(wait, AFTER_EXIT_S)
    try:
        readable, writable, _ = select.select(rfds, wfds, [], wait)
    except InterruptedError:
        readable, writable = [], []
    if wake_fd in readable:
        try:
            os.read(wake_fd, 4096)
        except OSError:
            pass
    reap()
    for r in running:
        for fd in list(r.open):
            if fd in readable:
                r.take(fd)
        if r.stdin is not None and r.stdin.fileno() in writable:
            r.feed()
    return [fd for fd in readable if fd in extra_fds]


class ContainerInit:
    """Serves one container's requests on `sock` (fds 0/1) until the zygote closes it."""

    def __init__(self, launcher):
        self.launcher = launcher  # zygote.launch_warm_python
        self.running = {}         # pid -> Running
        self.inbuf = bytearray()
        self.sock = socket.socket(fileno=0)
        self.fds = []             # received with the zygote's `inplace` order
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # gVisor delivers signals to a PID namespace's init from inside it (Linux drops those
        # the init has no handler for): `kill -TERM 1` in a container must not end its init.
        # A handler, not SIG_IGN, so that what the init execs gets the default back.
        for name in warm_python.INIT_HANDLED:
            signal.signal(getattr(signal, name), lambda *_: None)

    def reply(self, req, res):
        res["id"] = req.get("id")
        res["ok"] = True
        agent.send(res)

    def fail(self, req, kind, message):
        agent.send({"id": req.get("id"), "ok": False, "error": kind, "message": message})

    def handle(self, req):
        op = req.get("op", "")
        if op.startswith("container_"):
            op = op[len("container_"):]
        if op == "exec":
            return self.start_exec(req)
        if op == "inplace":
            return self.run_in_place(req)
        fn = {"write_file": agent.op_write_file, "read_file": agent.op_read_file,
              "list_files": agent.op_list_files, "remove": agent.op_remove, "ping": agent.op_ping}.get(op)
        if fn is None:
            return self.fail(req, "agent_error", "KeyError: %r" % op)
        t0 = time.monotonic()
        try:
            res = fn(req)
        except FileNotFoundError as e:
            return self.fail(req, "not_found", str(e))
        except IsADirectoryError as e:
            return self.fail(req, "is_a_directory", str(e))
        except NotADirectoryError as e:
            return self.fail(req, "not_a_directory", str(e))
        except FileExistsError as e:  # os.makedirs met a file where a parent directory goes
            return self.fail(req, "not_a_directory", "%s: a parent of %s is not a directory" % (e, req.get("path")))
        except OSError as e:
            if e.errno in _INVALID_ERRNOS:  # the path or the filesystem refuses it: the caller's to fix
                return self.fail(req, "invalid_argument", str(e))
            return self.fail(req, "agent_error", "%s: %s" % (type(e).__name__, e))
        except PermissionError as e:
            return self.fail(req, "permission_denied", str(e))
        except ValueError as e:
            return self.fail(req, "invalid_argument", str(e))
        except BaseException as e:  # noqa: BLE001 - every failure goes back as a reply
            return self.fail(req, "agent_error", "%s: %s" % (type(e).__name__, e))
        res["agent_s"] = time.monotonic() - t0
        self.reply(req, res)

    def start_exec(self, req):
        t0 = time.monotonic()
        try:
            argv = [str(a) for a in req["argv"]]
            timeout = req.get("timeout")
            cap = agent.DEFAULT_MAX_OUTPUT if req.get("max_output") is None else int(req["max_output"])
            mark = "%d-%s" % (os.getpid(), os.urandom(12).hex())
            env = dict(os.environ)
            env.update(agent._identity["env"])
            env.update(req.get("env") or {})
            env[agent.MARK] = mark
            cwd = req.get("cwd") or agent._home_or_root(env)
            stdin_data = agent.base64.b64decode(req["stdin"]) if req.get("stdin") is not None else None
            user = req.get("user")
        except (KeyError, TypeError, ValueError) as e:
            return self.fail(req, "agent_error", "%s: %s" % (type(e).__name__, e))
        try:
            proc = self.launcher(argv, env, cwd, stdin_data is not None, user)
            proc = proc or subprocess.Popen(
                argv, stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True, restore_signals=True,
                **agent._user_kwargs(user))
        except FileNotFoundError as e:
            if cwd is not None and e.filename == cwd:
                return self.reply(req, agent._spawn_failure(126, "rollbox: no such working directory: %s\n" % cwd, t0))
            return self.reply(req, agent._spawn_failure(127, "rollbox: command not found: %s\n" % argv[0], t0))
        except ValueError as e:
            return self.fail(req, "invalid_argument", str(e))
        except OSError as e:
            return self.reply(req, agent._spawn_failure(126, "rollbox: cannot run %r: %s\n" % (argv[0], e), t0))
        self.running[proc.pid] = Running(req, proc, mark, stdin_data, cap, timeout)

    def run_in_place(self, req):
        """The zygote's order: become the command (see zygote.py); never returns."""
        env = dict(os.environ)
        env.update(agent._identity["env"])
        env.update(req.get("env") or {})
        cmd = warm_python.python_command(req["argv"], env)
        fds = self.fds
        if cmd is None or len(fds) < 2:
            os._exit(126)
        warm_python.run_in_place(cmd, env, req["cwd"], (fds[2] if len(fds) > 2 else None, fds[0], fds[1]))

    def read_requests(self):
        try:
            chunk, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 20, 4)
            self.fds.extend(fds)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        if not chunk:
            return False  # the zygote closed us: the container is being destroyed
        self.inbuf += chunk
        while len(self.inbuf) >= 4:
            (n,) = agent._HDR.unpack(self.inbuf[:4])
            if len(self.inbuf) < 4 + n:
                break
            frame = bytes(self.inbuf[4:4 + n])
            del self.inbuf[:4 + n]
            mac, body = frame[:32], frame[32:]
            if not agent._compare_digest(mac, agent.hmac_sha256(agent._key["key"], body)):
                continue
            try:
                req = json.loads(body)
            except ValueError:
                continue
            if isinstance(req, dict):
                self.handle(req)
        return True

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            r = self.running.get(pid)
            if r is not None and r.status is None:
                r.status = status
                r.exited_at = time.monotonic()

    def run(self):
        os.set_blocking(0, False)
        while True:
            readable = wait_and_pump(list(self.running.values()), [0], self.wake_r, self.reap)
            if 0 in readable and not self.read_requests():
                os._exit(0)
            now = time.monotonic()
            for pid, r in list(self.running.items()):
                if r.deadline is not None and now >= r.deadline and r.status is None and not r.timed_out:
                    r.timed_out = True
                    r.tree = agent.kill_tree(r.pid, r.mark)
                    self.reap()
                if r.done(now):
                    if r.timed_out:
                        agent.kill_tree(r.pid, r.mark)
                    del self.running[pid]
                    self.reply(r.req, r.result())
