"""The clean template every episode container's first process is cloned from (zygote.py).

Why (break-it trial, gh-15): a container's process used to be a fork of the zygote itself, so
it carried the zygote's heap: earlier and neighbouring episodes' exec arguments, environments,
files and output (freed Python memory keeps its bytes), and the sandbox's channel key with the
HMAC pads made from it. A program read them back through /proc/self/mem. The template is a
fork of the zygote made once, before the zygote reads the key or any request: it holds the warm
interpreter and nothing else, and it only ever sees the small orders below (a container's
root, host name and limits; never a command, an environment, a file or a key). Each clone of
it gets its command (or, for an init, its environment and its per-container key) through a
pipe of its own, after the clone, from the zygote.

Orders (SOCK_SEQPACKET, one per message): JSON {"kind": "run" | "init", "root", "shm_mib",
"hostname", "as_mib", "binds", "cgroup"} with fds [command pipe, then the child's stdout and
stderr (and stdin) for "run", its socket to the zygote for "init"]; the answer is (pid, errno).
gVisor ignores CLONE_PARENT here (runsc 20240729: the clone stayed the template's child), so
the template reaps its clones and reports (pid, wait status) on a pipe the zygote reads.
"""

import json
import os
import select
import signal
import socket
import struct

import nsutil

_PAIR = struct.Struct("<ii")  # (pid, errno) answers; (pid, wait status) reports
_MAX_UNCLAIMED = 4096


class Template:
    """The zygote's handle on its template process (made by `start`)."""

    def __init__(self, pid, sock, status_r):
        self.pid = pid
        self.sock = sock          # orders out, (pid, errno) back
        self.status_r = status_r  # (pid, wait status) of every clone that ended
        self.statuses = {}        # reported, not yet claimed by `take` or `wait`
        self._buf = b""

    @classmethod
    def start(cls, confine):
        """Forks the template (call before the key or any request is read; fd 3, the key's
        pipe, is closed unread there)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_r, status_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                os.close(status_r)
                _serve(theirs, status_w, confine)
            finally:
                os._exit(1)
        theirs.close()
        os.close(status_w)
        os.set_blocking(status_r, False)
        return cls(pid, ours, status_r)

    def clone(self, spec, fds):
        """A new container process (see the module docstring); returns its pid. `fds` are
        passed to it (the caller still closes its own copies). Raises OSError when the clone
        failed, or the template is gone."""
        socket.send_fds(self.sock, [json.dumps(spec, separators=(",", ":")).encode()], list(fds))
        data = self.sock.recv(_PAIR.size)
        if len(data) != _PAIR.size:
            raise OSError(32, "the container template is gone")
        pid, err = _PAIR.unpack(data)
        if pid <= 0:
            raise OSError(err, "clone: %s" % os.strerror(err))
        return pid

    def poll(self):
        """Reads what was reported (non-blocking) into `statuses`. Exits the zygote when the
        template is gone: no container can be made here any more (the daemon replaces the
        pooled sandbox)."""
        while True:
            try:
                chunk = os.read(self.status_r, 4096)
            except BlockingIOError:
                return
            if not chunk:
                os._exit(3)
            self._buf += chunk
            n = len(self._buf) // _PAIR.size * _PAIR.size
            for off in range(0, n, _PAIR.size):
                pid, status = _PAIR.unpack_from(self._buf, off)
                self.statuses[pid] = status
            self._buf = self._buf[n:]
            while len(self.statuses) > _MAX_UNCLAIMED:  # inits that ended unwatched
                del self.statuses[next(iter(self.statuses))]

    def take(self, pid):
        """The wait status of `pid` if it was reported (claimed), else None."""
        return self.statuses.pop(pid, None)

    def wait(self, pid, timeout_s=10.0):
        """Waits for `pid`'s report (after a SIGKILL: its namespace is being torn down);
        returns its wait status, or None after `timeout_s`."""
        import time
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if pid in self.statuses:
                return self.statuses.pop(pid)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            select.select([self.status_r], [], [], left)


def _serve(sock, status_w, confine):
    """The template's loop: clone on order, report ends. Never returns."""
    try:
        os.close(3)  # the key's pipe: never read here
    except OSError:
        pass
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):  # the agent's channel is the zygote's alone
        os.dup2(null, fd)
    os.close(null)
    nsutil.libc.prctl(nsutil.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        try:
            readable, _, _ = select.select([sock, wake_r], [], [])
        except InterruptedError:
            readable = []
        if wake_r in readable:
            try:
                os.read(wake_r, 4096)
            except OSError:
                pass
        _report(status_w)
        if sock not in readable:
            continue
        msg, fds, _flags, _addr = socket.recv_fds(sock, 65536, 8)
        if not msg:
            os._exit(0)  # the zygote is gone
        try:
            spec = json.loads(msg)
            pid = nsutil.clone_container()
        except (OSError, ValueError) as e:
            for fd in fds:
                os.close(fd)
            sock.send(_PAIR.pack(-1, getattr(e, "errno", None) or 22))
            continue
        if pid == 0:
            for fd in (sock.fileno(), status_w, wake_r, wake_w):
                os.close(fd)
            _child(spec, fds, confine)
        for fd in fds:
            os.close(fd)
        sock.send(_PAIR.pack(pid, 0))


def _report(status_w):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        os.write(status_w, _PAIR.pack(pid, status))


def _read_all(fd):
    data = b""
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            os.close(fd)
            return data
        data += chunk


def _child(spec, fds, confine):
    """In a fresh clone: the container's first process. Never returns."""
    signal.set_wakeup_fd(-1)
    try:
        nsutil.enter_root(spec["root"], spec["shm_mib"], spec["hostname"], spec["as_mib"], binds=spec["binds"],
                          confine=confine, cgroup=spec["cgroup"])
        order = json.loads(_read_all(fds[0]))
    except BaseException:  # noqa: BLE001 - a set-up failure is the command's failure
        os._exit(126)
    if spec["kind"] == "init":
        import inits
        # Popped: no frame of the init keeps the key that a warm command forked from it could read.
        inits.init_main(fds[1], order.pop("env"), bytes.fromhex(order.pop("key")))
    import warm_python
    mode, target, args, flags = order["cmd"]
    stdio = (fds[3] if len(fds) > 3 else None, fds[1], fds[2])
    warm_python.run_in_place((mode, target, args, set(flags)), order["env"], order["cwd"], stdio)
    os._exit(120)
