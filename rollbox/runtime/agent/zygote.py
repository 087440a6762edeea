"""rollbox's episode-container zygote: a warm Python interpreter inside a pooled gVisor sandbox
that makes one fresh container per episode.

Why (issue #15, PLATFORM.md "Costs inside a gVisor sandbox"): a `runsc restore` per episode
costs ~140 ms of CPU and a fresh `python3` ~65 ms, so neither carries 30 programs/s on two
cores. A pooled sandbox is restored once;
this process, started in it on first use, keeps the interpreter and common modules loaded,
and every container process is a clone of its template (template.py: a fork of this process
made before the key or any request was read, so no program's memory holds another episode's
data or the sandbox's key). This process forks nothing after that.

A container is what it is in a gVisor pod: its own PID, mount, IPC, UTS and network namespaces
inside gVisor's kernel, a copy-on-write root (nsutil.make_filesystem: an overlay over the
pooled sandbox's root with a size-capped tmpfs upper, so every write ends as ENOSPC at the
cap), fresh /proc, /dev and /dev/shm, its own host name, and only Docker's default
capabilities. Its filesystem lives in this process's mount namespace, so it outlives the
container's init; the init (PID 1 of the container's namespaces, a clone of the template) is
made on the container's first request and serves the rest (container_init.py). Killing an init
makes gVisor's kernel kill every process of its namespace, setsid'd and double-forked too.

The fast path: a Python command (warm_python.python_command) in a container whose init has
not started anything yet is run by that init itself, in place: one fork per episode instead of
two. Like `docker run`, the container's processes end when that command ends; the files stay,
and the next request gets a fresh init. This process collects its output, enforces its timeout
(by killing the init) and signs the reply, since nothing of the init is trusted after user
code ran in it.

Channel: the agent relays `container_*` request frames unchanged to our stdin and copies our
stdout frames back to the daemon (agent.py's frames: length, HMAC-SHA256 under the sandbox
key, JSON); the key arrives on fd 3 from the launcher the agent forked before dropping
CAP_SYS_ADMIN. Single-threaded: a fork of a threaded Python process costs twice as much.
"""

import gc
import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent  # noqa: E402  (agent.py, next to this file)
import container_init  # noqa: E402
import inits  # noqa: E402
import nsutil  # noqa: E402
import seccomp  # noqa: E402
import template  # noqa: E402
import warm_python  # noqa: E402

# Warm modules: what episode programs commonly import (HumanEval's prompts and tests), loaded
# once here and shared copy-on-write by every fork. Each group of modules makes every fork
# dearer (measured under gVisor: 20 ms bare, 23 ms with json..typing, 27 ms with unittest,
# decimal, statistics and friends too), so only the common ones.
WARM_MODULES = ("json", "math", "re", "collections", "itertools", "functools", "typing", "string", "heapq",
                "bisect", "random", "runpy", "traceback", "io")
# Memory-backed bounds (MiB) when the request does not say (both count against the pooled
# sandbox's memory limit; the daemon passes a share of it).
DEFAULT_ROOT_MIB = 256
DEFAULT_SHM_MIB = 64


class Container:
    def __init__(self, cid, root, spec):
        self.cid = cid
        self.root = root
        self.env = dict(spec.get("env") or {})
        self.hostname = spec.get("hostname") or cid
        self.shm_mib = int(spec.get("shm_mib") or DEFAULT_SHM_MIB)
        self.as_mib = int(spec.get("as_mib") or 0) or None
        self.binds = [b for b in spec.get("binds") or [] if isinstance(b, str) and b.startswith("/")]
        self.init = None      # (pid, socket) of the serving init, or None
        self.spawned = False  # the serving init has started a command: no in-place run there
        self.inplace = None   # container_init.Running of the command running in place
        self.queue = []       # frames that arrived while it ran
        self.pidns = set()    # PID namespaces its inits had (to check nothing is left)
        self.pending = {}     # request id -> (op, deadline or None) of frames its init owes a reply
        self.init_lost = False  # an init died or hung while it owed replies (the pool retires the sandbox)
        self.cgroup = None    # its pids cgroup on the host kernel (Confinement.make_cgroup)
        self.key = os.urandom(32)  # signs what passes between this zygote and its inits


class _Proc:
    """What container_init.Running needs of a process: pid and its pipes."""

    def __init__(self, pid, stdin, stdout, stderr):
        self.pid = pid
        self.stdin = os.fdopen(stdin, "wb", buffering=0) if stdin is not None else None
        self.stdout = os.fdopen(stdout, "rb", buffering=0)
        self.stderr = os.fdopen(stderr, "rb", buffering=0)
        self.returncode = None


class Zygote(inits.Inits):
    def __init__(self, tmpl, confine=None):
        self.template = tmpl  # template.Template: where every container process is cloned from
        self.confine = confine or nsutil.Confinement()  # what every container's init applies
        self.containers = {}  # cid -> Container
        self.by_fd = {}       # init socket fd -> [Container, buffer]
        self.wake_r, wake_w = os.pipe()
        for fd in (self.wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    # ---- replies ------------------------------------------------------------------------

    def reply(self, msg):
        agent.send(msg)

    def fail(self, req, kind, message):
        self.reply({"id": req.get("id"), "ok": False, "error": kind, "message": message})

    # ---- inits --------------------------------------------------------------------------

    # ---- requests -----------------------------------------------------------------------

    def create(self, req):
        cid = req.get("cid")
        if not isinstance(cid, str) or not cid.replace("-", "").isalnum() or cid in self.containers:
            return self.fail(req, "invalid_argument", "container id %r is malformed or already in use" % (cid,))
        t0 = time.process_time()
        try:
            root = nsutil.make_filesystem(cid, int(req.get("root_mib") or DEFAULT_ROOT_MIB))
        except OSError as e:
            nsutil.remove_filesystem(cid)
            return self.fail(req, "container_error", "making container %s's filesystem: %s" % (cid, e))
        c = self.containers[cid] = Container(cid, root, req)
        c.cgroup = self.confine.make_cgroup(cid)
        self.reply({"id": req.get("id"), "ok": True, "container": cid,
                    "setup_cpu_ms": (time.process_time() - t0) * 1000})

    def destroy(self, req):
        c = self.containers.pop(req.get("cid"), None)
        if c is None:
            return self.fail(req, "container_not_found", "container %s not found (already destroyed?)" % (req.get("cid"),))
        pids = []
        if c.inplace is not None:
            pids.append(c.inplace.pid)
            c.inplace.close_stdin()
            for f in (c.inplace.proc.stdout, c.inplace.proc.stderr):
                f.close()
        if c.init is not None:
            pids.append(c.init[0])
            self.forget_init(c)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # an init: the kernel kills the rest of its namespace
            except ProcessLookupError:
                pass
            self.template.wait(pid)
        nsutil.remove_filesystem(c.cid)
        cgroup_left = not self.confine.remove_cgroup(c.cid)
        # The kernel kills a PID namespace with its init; anything still in one is a leftover
        # the daemon must not trust the pooled sandbox with (it replaces it).
        left = [p for p in _pids() if nsutil.pid_namespace(p) in c.pidns] if c.pidns else []
        if cgroup_left and not left:
            left = [0]  # a task the cgroup still holds, though no /proc entry names it
        self.reply({"id": req.get("id"), "ok": True, "cid": c.cid, "killed": len(pids), "leftovers": len(left),
                    "init_lost": c.init_lost})

    def write_here(self, c, req):
        """Writes a file into the container's root from here, so a program's upload needs no
        init (a fork of this process that runs Python, ~20 ms of CPU under gVisor). True when
        done (replied); False sends it to the init, which also gives every error its reply."""
        try:
            size = nsutil.write_file_in_root(c.root, req, mounts=("/dev", "/proc", "/.rollbox", *c.binds))
        except OSError:
            return False  # an ENOSPC, a directory in the way...: the init says what failed
        if size is None:
            return False
        self.reply({"id": req.get("id"), "ok": True, "size": size})
        return True

    def exec_in_place_or_forward(self, c, req, frame):
        env = dict(os.environ)
        env.update(c.env)
        env.update(req.get("env") or {})
        argv = req.get("argv")
        cmd = None
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv) and not req.get("user") \
                and not c.spawned and not self.confine.host_kernel:
            # Not on the host kernel: there a namespace's PID 1 ignores the signals it has no
            # handler for (a program's own SIGTERM, say), which a command must not; a fork
            # costs ~1 ms there instead of gVisor's ~25, so the init runs every command.
            cmd = warm_python.python_command(argv, env, c.root)
            home = env.get("HOME")
            cwd = req.get("cwd") or (home if home and os.path.isdir(c.root + home) else "/")  # as _home_or_root
            if cmd is not None and not os.path.isdir(c.root + "/" + str(cwd).lstrip("/")):
                cmd = None  # the init reports a missing working directory as exec does
        if cmd is None:
            self.send_to_init(c, frame[36:], req=req)
            # After the send: it makes the init when there is none, and a new init has started
            # nothing. What this command leaves running (`sh -c 'server &'`) must outlive the
            # next Python command, which therefore may not run in place (its end ends the init).
            c.spawned = True
            return None
        in_r = in_w = None
        if req.get("stdin") is not None:
            in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = [out_w, err_w] + ([in_r] if in_r is not None else [])
        if c.init is None:
            # No init yet (nothing but files happened here): the command's process is the
            # container's first, cloned straight into its namespaces with its pipes; no
            # socket, no request loop, no signed order to check in the fork.
            pid = self.clone_running(c, env, cmd, cwd, (in_r, out_w, err_w), [in_w, out_r, err_r])
        else:
            order = dict(req, op="inplace", cwd=cwd)
            self.send_to_init(c, json.dumps(order, separators=(",", ":")).encode(), fds)
            pid = c.init[0]
            self.forget_init(c)  # the init now runs the command: it serves nothing more
        for fd in fds:
            os.close(fd)
        stdin_data = agent.base64.b64decode(req["stdin"]) if in_w is not None else None
        cap = agent.DEFAULT_MAX_OUTPUT if req.get("max_output") is None else int(req["max_output"])
        c.inplace = container_init.Running(req, _Proc(pid, in_w, out_r, err_r), "", stdin_data, cap,
                                           req.get("timeout"))

    def clone_running(self, c, env, cmd, cwd, stdio, parent_fds):
        """Has the template clone the container's first process, which sets the container up
        and becomes the Python command `cmd` (warm_python.run_in_place); returns its pid.
        `stdio`: its (stdin or None, stdout, stderr) fds; `parent_fds`: our ends (the clone,
        made from the template, never had them). The command, its environment and working
        directory go to the clone on a pipe of its own, never through the template."""
        cmd_r, cmd_w = os.pipe()
        stdin, out, err = stdio
        try:
            pid = self.template.clone(self.clone_spec(c, "run"), [cmd_r, out, err] + ([stdin] if stdin is not None else []))
        finally:
            os.close(cmd_r)
        mode, target, args, flags = cmd
        self.send_order(cmd_w, {"cmd": [mode, target, args, sorted(flags)], "env": env, "cwd": cwd})
        ns = nsutil.pid_namespace(pid)
        if ns is not None:
            c.pidns.add(ns)
        return pid

    def from_agent(self):
        hdr = agent.read_exact(0, 4)
        if hdr is None:
            os._exit(0)  # the agent is gone: so is the sandbox
        (n,) = agent._HDR.unpack(hdr)
        frame = agent.read_exact(0, n)
        if frame is None:
            os._exit(0)
        mac, body = frame[:32], frame[32:]
        if not agent._compare_digest(mac, agent.hmac_sha256(agent._key["key"], body)):
            return
        try:
            req = json.loads(body)
        except ValueError:
            return
        if not isinstance(req, dict):
            return
        self.route(req, hdr + frame)

    def route(self, req, frame):
        try:
            self._route(req, frame)
        except Exception as e:  # noqa: BLE001 - no request may end the zygote (every container's)
            self.fail(req, "agent_error", "%s: %s" % (type(e).__name__, e))

    def _route(self, req, frame):
        op = req.get("op")
        if op == "container_create":
            return self.create(req)
        if op == "container_destroy":
            return self.destroy(req)
        if op == "container_list":
            return self.reply({"id": req.get("id"), "ok": True, "containers": sorted(self.containers)})
        c = self.containers.get(req.get("cid"))
        if c is None:
            return self.fail(req, "container_not_found", "container %s not found" % (req.get("cid"),))
        if c.inplace is not None:
            c.queue.append((req, frame))  # served by a fresh init once the command ends
            return
        try:
            if op == "container_exec":
                self.exec_in_place_or_forward(c, req, frame)
            elif op == "container_write_file" and self.write_here(c, req):
                pass
            else:
                self.send_to_init(c, frame[36:], req=req)
        except OSError as e:
            self.init_gone(c, "did not take a request (%s)" % e)
            self.fail(req, "container_ended", "container %s: its init is gone: %s; start a new episode" % (c.cid, e))
        except Exception as e:  # noqa: BLE001 - no request may end the zygote (every container's)
            self.fail(req, "agent_error", "%s: %s" % (type(e).__name__, e))

    # ---- output and exits ---------------------------------------------------------------

    def finish_in_place(self, c):
        r = c.inplace
        c.inplace = None
        res = r.result()
        res["id"] = r.req.get("id")
        res["ok"] = True
        res["in_place"] = True
        self.reply(res)
        queued, c.queue = c.queue, []
        for req, frame in queued:
            self.route(req, frame)

    def reap(self):
        """Statuses the template reported (its clones are its children, not ours)."""
        self.template.poll()
        for c in self.containers.values():
            r = c.inplace
            if r is not None and r.status is None:
                status = self.template.take(r.pid)
                if status is not None:
                    r.status = status
                    r.exited_at = time.monotonic()

    def run(self):
        while True:
            running = [c.inplace for c in self.containers.values() if c.inplace is not None]
            readable = container_init.wait_and_pump(running, [0, self.template.status_r, *self.by_fd], self.wake_r,
                                                    self.reap)
            for fd in readable:
                if fd in self.by_fd:
                    self.from_init(fd)
            if 0 in readable:
                self.from_agent()
            now = time.monotonic()
            self.check_deadlines(now)
            for c in list(self.containers.values()):
                r = c.inplace
                if r is None:
                    continue
                if r.deadline is not None and now >= r.deadline and r.status is None and not r.timed_out:
                    r.timed_out = True
                    r.tree = _namespace_size(r.pid)  # a fork bomb filled it: reported pids_limited
                    try:
                        os.kill(r.pid, signal.SIGKILL)  # the init: its whole namespace goes
                    except ProcessLookupError:
                        pass
                    st = self.template.wait(r.pid)
                    r.status = st if st is not None else r.status
                if r.done(now):
                    self.finish_in_place(c)


def _pids():
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _namespace_size(pid):
    """Processes in `pid`'s PID namespace (0 when it is gone), counted before a timeout kills
    them, as the container's init counts the tree it kills (container_init.Running.tree)."""
    ns = nsutil.pid_namespace(pid)
    return 0 if ns is None else sum(1 for p in _pids() if nsutil.pid_namespace(p) == ns)


def _read_key():
    key = b""
    try:
        while True:
            chunk = os.read(3, 4096)
            if not chunk:
                break
            key += chunk
        os.close(3)
    except OSError:
        pass
    return key


def main():
    if not hasattr(socket, "send_fds"):
        os._exit(2)  # Python < 3.9: the agent reports container isolation as unavailable here
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    agent.PIDS_REPORT_AT = nsutil.CONTAINER_PIDS_REPORT_AT  # what a command run in place reports against
    nsutil.libc.prctl(nsutil.PR_SET_DUMPABLE, 0, 0, 0, 0)  # no /proc/PID/mem or fd access from outside
    nsutil.libc.prctl(nsutil.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    nsutil.private_mounts()
    os.umask(0o022)  # what the containers' inits set: files written from here get the same modes
    bounding = nsutil.narrow_bounding_set()
    host_kernel = os.environ.get("ROLLBOX_RUNTIME") == "runc"
    confine = nsutil.Confinement(bounding, host_kernel, seccomp.Filter() if host_kernel else None,
                                 nsutil.host_pids_cgroup() if host_kernel else None)
    for name in WARM_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    # What is loaded now lives as long as the zygote: frozen, no collection here or in a fork
    # walks it (a full collection writes every object's header: a copy-on-write fault per page).
    gc.collect()
    gc.freeze()
    # The template first: every container process is a clone of it, so it must never hold
    # the key or a request (template.py). This process forks nothing after it.
    tmpl = template.Template.start(confine)
    agent._key["key"] = _read_key()
    Zygote(tmpl, confine).run()


if __name__ == "__main__":
    main()
