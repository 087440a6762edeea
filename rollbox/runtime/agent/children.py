"""The agent's child processes (PID 1's job): starting a command in its own session and cgroup,
the reaper that waits for every child (adopted orphans included), and the one kill mechanism
for a command's whole tree; with the environment and user a command runs with.

This file runs under the image's own `python3` next to agent.py and imports nothing outside
the standard library. It imports nothing of agent.py (agent.py runs as __main__; a second
import would make a second copy of its state): agent.py imports what it needs from here.
"""

import os
import resource
import signal
import subprocess
import threading
import time

try:
    import jail  # beside this file (runtime/agentdir.py installs them)
except ImportError:  # imported as rollbox.runtime.agent.* (unit tests)
    from . import jail  # type: ignore[no-redef]

MARK = "ROLLBOX_EXEC_MARK"

_children_lock = threading.Lock()
# pid -> [event, status]; the reaper fills status for the pids execs wait on.
_waiters: dict = {}  # type: ignore[type-arg]
_have_children = threading.Event()
_identity: dict = {"env": {}}  # type: ignore[type-arg]

# An exec whose tree holds this many processes when it is killed ran into RLIMIT_NPROC (which
# counts every task of the sandbox, threads included; a bomb's tree, seen while it churns, was
# well under the limit itself).
_NPROC = resource.getrlimit(resource.RLIMIT_NPROC)[0]
PIDS_REPORT_AT = max(4, _NPROC // 2) if _NPROC != resource.RLIM_INFINITY else 1 << 30
# One exec's cgroup holds at most this many tasks: a fork bomb leaves the agent room for its
# threads and the next exec (as proc.rs's exec_pids_max).
EXEC_PIDS_MAX = max(4, _NPROC - max(16, _NPROC // 4)) if _NPROC != resource.RLIM_INFINITY else 0


def reaper():
    """Reaps every child, adopted orphans included (we are PID 1 in the sandbox)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            # No child now; a start sets the event. An orphan the kernel hands to PID 1 later
            # (a fork bomb's, once its parents exit) sets nothing: look again within a second
            # so such zombies do not pile up (the native agent waits for SIGCHLD: proc.rs).
            _have_children.wait(timeout=1.0)
            _have_children.clear()
            continue
        except InterruptedError:
            continue
        # exec registers its pid under this lock right after spawning, so a pid reaped
        # before registration is found here; any other pid is an orphan (we are PID 1).
        with _children_lock:
            w = _waiters.pop(pid, None)
        if w is not None:
            w[1] = status
            w[0].set()


def marked_pids(mark):
    """Pids whose environment carries this exec's mark: its whole tree, setsid'd ones too."""
    needle = ("%s=%s" % (MARK, mark)).encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == 1:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


def kill_tree(pid, mark, sig=signal.SIGKILL):
    """Signals the exec's (or background process's) process group and every process of its
    tree: the members of its cgroup (jail.py) when it has one, else every process carrying its
    mark: the one kill mechanism of execs and background processes. SIGKILL repeats until none
    is left; another signal is sent once. Returns how many processes the tree had when the
    kill began, counted before the first signal (a killed process leaves its cgroup and loses
    its environ at once)."""
    name = jail.for_mark(mark)
    first = max(jail.task_count(name), jail.count_members(name)) if name else len(marked_pids(mark))
    if sig != signal.SIGKILL:
        # Once to each: the group, then the tree's processes outside it (setsid'd ones).
        try:
            os.killpg(pid, sig)
        except OSError:
            pass
        for p in (jail.members(name) if name else marked_pids(mark)):
            try:
                if os.getpgid(p) != pid:
                    os.kill(p, sig)
            except OSError:
                pass
        return first
    # Passes until one finds no process not yet signalled; the killed are not waited for (one
    # with SIGKILL pending forks no more; a bomb's exits took gVisor seconds, all of them on
    # the timed-out reply: proc.rs kill_tree, gh-19). The cgroup goes once empty (jail.sweep).
    signalled = set()
    for _ in range(100):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        fresh = [p for p in (jail.killable(name) if name else marked_pids(mark)) if p not in signalled]
        for p in fresh:
            signalled.add(p)
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        if not fresh:
            break
        time.sleep(0.005)
    return first


def exit_code_of(status):
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return -1


def _user_kwargs(user):
    """Popen arguments for an image's `User` ("name", "uid", "name:group", "uid:gid"), resolved
    in the sandbox's own /etc/passwd and /etc/group. Raises ValueError for an unknown name."""
    if not user:
        return {}
    import pwd
    import grp
    name, _, group = str(user).partition(":")
    if name.isdigit():
        uid = int(name)
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
    else:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            # The inspect-ai/Docker wording, which agents and graders match on.
            raise ValueError("unable to find user %s: no matching entries in passwd file" % name)
        uid, gid = pw.pw_uid, pw.pw_gid
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise ValueError("group %r is not in the image's /etc/group" % group)
    if uid == 0 and gid == 0:
        return {}
    return {"user": uid, "group": gid, "extra_groups": []}


def _home_or_root(env):
    """No cwd asked for: HOME, or / when the image has no such directory (as Docker does)."""
    home = env.get("HOME")
    return home if home and os.path.isdir(home) else "/"


def make_env(req):
    """(env, mark) of a command: the agent's environment, the copy's identity, the request's
    env, and a fresh tree mark (kill_tree finds every descendant by it)."""
    # Random, not the request id: a process must not learn which reply it could try to forge.
    mark = "%d-%s" % (os.getpid(), os.urandom(12).hex())
    env = dict(os.environ)
    env.update(_identity["env"])
    env.update(req.get("env") or {})
    env[MARK] = mark
    return env, mark


def spawn(argv, env, cwd, user, stdin, stdout, stderr, preexec=None, cg=None):
    """Starts `argv` in its own session as `user` (in cgroup `cg` of jail.py when given: its
    whole tree stays there) and registers it with the reaper; returns (Popen, waiter) where
    waiter[0] is set once waiter[1] holds its wait status.
    Raises OSError (FileNotFoundError for argv[0] or cwd), ValueError (unknown user)."""
    extra = _user_kwargs(user)
    with _children_lock:
        if cg:
            jail.enter(cg)  # the child is born in it; this thread moves back below
        else:
            jail.note_unjailed()
        try:
            # Popen uses vfork without preexec_fn: far cheaper under gVisor than fork().
            proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                                    start_new_session=True, restore_signals=True, preexec_fn=preexec, **extra)
        finally:
            if cg:
                jail.enter(None)
        waiter = [threading.Event(), None]
        _waiters[proc.pid] = waiter
        _have_children.set()
    return proc, waiter
