"""The zygote's links to its containers' inits (zygote.py): cloning one, sending it requests,
relaying its signed replies, and answering for it when it dies or hangs.

An init is PID 1 of its container's namespaces and serves the requests the zygote cannot
(container_init.py). gVisor delivers signals to a namespace's init from inside it, SIGKILL and
SIGSTOP too (Linux drops them), so a program can kill or freeze its own container's init: the
zygote keeps, per container, the requests its init owes a reply and a deadline for each, and
answers them itself when the init ends or misses a deadline (killing it: the namespace goes
with it). Without that the daemon waited out its own timeout and ended the whole pooled
sandbox, neighbours included.
"""

import json
import os
import re
import select
import signal
import socket
import time

import agent
import container_init
import nsutil
import warm_python

# An init that owes a reply this long past its exec's timeout, or this long for any other
# request, is taken as stopped (SIGSTOP from inside) and killed; under the daemon's own waits
# (an exec's timeout + 30 s, 30 s for files), so the episode gets an answer, not a lost sandbox.
INIT_GRACE_S = 3.0
INIT_REPLY_S = 20.0
SEND_TIMEOUT_S = 5.0
_ID_RE = re.compile(rb'"id":(-?[0-9]+)')


class Inits:
    """Mixed into zygote.Zygote, whose `containers`, `by_fd`, `confine` and `reply` it uses."""

    def new_init(self, c):
        """Has the template clone the container's init; it sets itself up and serves what is
        on its socket, signed with the container's own key (never the sandbox's)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd_r, cmd_w = os.pipe()
        try:
            pid = self.template.clone(self.clone_spec(c, "init"), [cmd_r, child.fileno()])
        finally:
            os.close(cmd_r)
            child.close()
        self.send_order(cmd_w, {"env": c.env, "key": c.key.hex()})
        parent.setblocking(False)
        ns = nsutil.pid_namespace(pid)
        if ns is not None:
            c.pidns.add(ns)
        c.init = (pid, parent)
        c.spawned = False
        self.by_fd[parent.fileno()] = [c, bytearray()]
        return c.init

    def clone_spec(self, c, kind):
        """The template's order for a process of container `c` (template.py): nothing of a
        command, environment or key goes there."""
        return {"kind": kind, "root": c.root, "shm_mib": c.shm_mib, "hostname": c.hostname, "as_mib": c.as_mib,
                "binds": c.binds, "cgroup": c.cgroup}

    @staticmethod
    def send_order(fd, order):
        """Writes a clone's own order to its pipe and closes it; a clone that already ended
        (a set-up failure: its status says so) breaks the pipe, which is not an error here."""
        try:
            write_all(fd, json.dumps(order, separators=(",", ":")).encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def forget_init(self, c):
        if c.init is not None:
            pid, sock = c.init
            self.by_fd.pop(sock.fileno(), None)
            sock.close()
            c.init = None

    def send_to_init(self, c, body, fds=(), req=None):
        """Sends a request body to the container's init (made first if there is none), signed
        with the container's key. `req`: the request it carries, whose reply the init then
        owes (see owe). Raises OSError when the init does not take it within SEND_TIMEOUT_S
        (stopped by a signal, say)."""
        if c.init is None:
            self.new_init(c)
        frame = agent._HDR.pack(len(body) + 32) + agent.hmac_sha256(c.key, body) + body
        sock = c.init[1]
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            if fds:
                socket.send_fds(sock, [frame], list(fds))
            else:
                sock.sendall(frame)
        finally:
            sock.setblocking(False)
        if req is not None:
            self.owe(c, req)

    def owe(self, c, req):
        """Notes that the init owes `req` a reply, by a deadline: an exec's timeout plus
        INIT_GRACE_S, other requests INIT_REPLY_S (an exec without a timeout: none)."""
        op = req.get("op", "")
        timeout = req.get("timeout")
        if op == "container_exec":
            deadline = time.monotonic() + float(timeout) + INIT_GRACE_S if timeout else None
        else:
            deadline = time.monotonic() + INIT_REPLY_S
        c.pending[req.get("id")] = (op, deadline)

    def init_gone(self, c, why, timed_out=False):
        """The init died (a process of the container killed it: gVisor delivers even SIGKILL
        and SIGSTOP to a namespace's init from inside) or stopped answering (then it is
        killed here, and with it the container's namespace): every request it owed gets its
        answer now, instead of the daemon waiting and declaring the whole pooled sandbox lost."""
        if c.init is not None:
            pid = c.init[0]
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.template.wait(pid)
            self.forget_init(c)
        owed, c.pending = c.pending, {}
        if owed:
            c.init_lost = True
        note = "rollbox: the container's init %s; the container's processes ended with it\n" % why
        for rid, (op, _deadline) in owed.items():
            if op == "container_exec":
                self.reply({"id": rid, "ok": True, "exit_code": None if timed_out else 137,
                            "signal": None if timed_out else signal.SIGKILL, "stdout": "",
                            "stderr": agent.base64.b64encode(note.encode()).decode(), "stdout_bytes": 0,
                            "stderr_bytes": len(note), "truncated": False, "timed_out": timed_out,
                            "pids_limited": False, "duration_s": 0.0, "init_lost": True})
            else:
                self.reply({"id": rid, "ok": False, "error": "container_ended",
                            "message": "container %s: its init %s; start a new episode" % (c.cid, why)})

    def check_deadlines(self, now):
        for c in list(self.containers.values()):
            if any(d is not None and now >= d for _op, d in c.pending.values()):
                self.init_gone(c, "stopped answering (a process of the container stopped or killed it?) and "
                                  "was killed", timed_out=True)

    def from_init(self, fd):
        c, buf = self.by_fd[fd]
        sock = c.init[1]
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            # It died: its sandbox is going, or a process of the container killed it.
            self.init_gone(c, "was killed")
            return
        buf += chunk
        while len(buf) >= 4:
            (n,) = agent._HDR.unpack(buf[:4])
            if len(buf) < 4 + n:
                break
            frame = bytes(buf[:4 + n])
            del buf[:4 + n]
            body = frame[36:]
            if not agent._compare_digest(frame[4:36], agent.hmac_sha256(c.key, body)):
                continue
            # Signed again with the sandbox's key, which the init never has; only for a
            # request of this container's, so that it cannot answer for a neighbour's.
            rid = reply_id(body)
            if rid is None or rid not in c.pending:
                continue
            del c.pending[rid]
            write_all(1, agent._HDR.pack(len(body) + 32) + agent.hmac_sha256(agent._key["key"], body) + body)


def init_main(sock_fd, env, key):
    """The container's init, in a clone of the template (template.py) that entered the
    container: serve `sock_fd`, signing with the container's `key` (never returns)."""
    try:
        os.dup2(sock_fd, 0)
        os.dup2(sock_fd, 1)
        os.closerange(3, 65536)
        agent._out_fd = 1
        agent._identity["env"] = dict(env)
        agent._key["key"] = key
        del key  # only agent._key holds it: warm_python._forget_secrets clears that in each fork
        agent.PIDS_REPORT_AT = nsutil.CONTAINER_PIDS_REPORT_AT
        init = container_init.ContainerInit(warm_python.launch_warm_python)
    except BaseException:  # noqa: BLE001 - its requests fail as a gone init
        os._exit(1)
    try:
        init.run()
    finally:
        os._exit(0)


def reply_id(body):
    """The request id of a reply frame's JSON body without parsing it whole (read_file replies
    are large): agent.send puts it last (after the result's fields) or, for a failure, first."""
    m = _ID_RE.search(body, max(0, len(body) - 64)) or _ID_RE.match(body, 1)
    return int(m.group(1)) if m else None


def write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
