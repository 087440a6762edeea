"""One cgroup per exec inside gVisor's kernel, and the sandbox's OOM watcher: agent.py's copy of
native/src/jail.rs and memwatch.rs (read jail.rs for the measurements and the why).

Each exec's processes live in their own pids and memory cgroups, which `setsid`, `env -i` and
double forks cannot leave (one that moves itself to a root cgroup through the agent's
descriptors, or into a cgroup of its own it made there, is killed by the watcher:
`kill_escaped`; a child cgroup made inside its own exec's belongs to that exec); the hierarchies are mounted at start, opened and detached, so no
command finds them in its mount table. The watcher SIGKILLs the exec whose cgroup holds the
most memory once the sandbox's processes reach the user's limit (ROLLBOX_MEMORY_MIB); the host
cgroup's limit, above it, is the last line of defence. Standard library only.
"""

import ctypes
import itertools
import os
import signal
import threading
import time

POLL_S = 0.01
SETTLE_S = 0.1

_libc = ctypes.CDLL(None, use_errno=True)
_fds: dict = {}  # controller -> descriptor of its detached hierarchy  # type: ignore[type-arg]
_next = itertools.count(1)
_lock = threading.Lock()
_by_mark: dict = {}  # exec mark -> cgroup name  # type: ignore[type-arg]
_stale: list = []  # cgroups of returned execs that still had processes  # type: ignore[type-arg]
_oom: set = set()  # cgroups the watcher killed  # type: ignore[type-arg]
_peak: dict = {}  # running exec's cgroup -> most tasks the watcher saw (a bomb's sign)  # type: ignore[type-arg]
_exempt: set = set()  # pids in the root cgroups by design (the zygote)  # type: ignore[type-arg]
_made: set = set()  # cgroups the agent made, named before they exist  # type: ignore[type-arg]
_unjailed = [False]  # something started outside the exec cgroups: escapees not told apart


def exempt(pid):
    """`pid` lives in the root cgroups by design (not an escapee)."""
    _exempt.add(pid)


def note_unjailed():
    """Something was started outside the exec cgroups (or a privileged sandbox's commands may
    move processes themselves): `kill_escaped` stops, as jail.rs says."""
    _unjailed[0] = True


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 1:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


_my_ns = []  # type: ignore[var-annotated]  # this process's PID namespace link, read once


_ns_verdicts = {}  # type: ignore[var-annotated]  # foreign PID namespace link -> descends from the zygote


def _descends(pid):
    """Whether `pid` descends from an exempt process; None when one of the chain ended."""
    p = pid
    for _ in range(64):
        p = _parent(p)
        if p is None:
            return None
        if p in _exempt:
            return True
        if p <= 1:
            return False
    return False


def kill_escaped(all_roots=True):
    """SIGKILLs the processes of the agent's PID namespace in a hierarchy's root cgroup that are
    neither the agent nor exempt (nor descended from an exempt one): commands that moved
    themselves out of their exec's cgroups through the agent's descriptors (jail.rs).
    all_roots: the memory hierarchy's root too, not only the pids one (jail.rs says why)."""
    if _unjailed[0] or "pids" not in _fds:
        return 0
    me = os.getpid()
    if not _my_ns:
        try:
            _my_ns.append(os.readlink("/proc/self/ns/pid"))
        except OSError:
            return 0
    my_ns = _my_ns[0]
    killed = 0
    for c in ["pids", "memory"] if all_roots else ["pids"]:
        if c not in _fds:
            continue
        if all_roots:
            killed += _kill_foreign(c, me)
        for pid in _read_pids(_path(c, "cgroup.procs")):
            if pid == me or pid in _exempt:
                continue
            try:
                ns = os.readlink("/proc/%d/ns/pid" % pid)
            except OSError:
                continue  # it ended
            if ns != my_ns:
                # A PID namespace of its own: an episode container's (the zygote made it) is
                # spared, one a command made (`unshare -Urpf`) is not. One walk per namespace.
                if len(_ns_verdicts) > 4096:
                    _ns_verdicts.clear()
                if ns not in _ns_verdicts:
                    v = _descends(pid)
                    if v is None:
                        continue
                    _ns_verdicts[ns] = v
                if _ns_verdicts[ns]:
                    continue
            elif _descends(pid) is not False:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def note_peaks():
    with _lock:
        names = list(_by_mark.values())
    for n in names:
        c = task_count(n)
        with _lock:
            _peak[n] = max(_peak.get(n, 0), c)


def peak(name):
    with _lock:
        return _peak.get(name, 0)


def _mount_detached(controller):
    d = "/dev/.rollbox-cg-" + controller
    try:
        os.mkdir(d)
    except OSError:
        pass
    fd = None
    if _libc.mount(b"cgroup", d.encode(), b"cgroup", 0, controller.encode()) == 0:
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            fd = None
        _libc.umount2(d.encode(), 2)  # MNT_DETACH
    try:
        os.rmdir(d)
    except OSError:
        pass
    return fd


def init():
    """Mounts the hierarchies (needs CAP_SYS_ADMIN; before any command runs). False: none (an
    older gVisor), and execs fall back to the environment marker."""
    pids = _mount_detached("pids")
    if pids is None:
        return False
    _fds["pids"] = pids
    mem = _mount_detached("memory")
    if mem is not None:
        _fds["memory"] = mem
    return True


def _path(controller, rel=""):
    base = "/proc/self/fd/%d" % _fds[controller]
    return base + "/" + rel if rel else base


def _write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass


def create(pids_max, mark):
    """A new exec's cgroups (at most `pids_max` tasks; 0: no own limit); None without them."""
    if "pids" not in _fds:
        return None
    sweep()
    # A random part (jail.rs says why), and a few tries should a name be taken anyway.
    for _ in range(4):
        name = "x%d-%s" % (next(_next), os.urandom(8).hex())
        with _lock:
            _made.add(name)
        try:
            os.mkdir(_path("pids", name))
            break
        except OSError:
            with _lock:
                _made.discard(name)
    else:
        return None
    if "memory" in _fds:
        try:
            os.mkdir(_path("memory", name))
        except OSError:
            pass
    if pids_max > 0:
        _write(_path("pids", name + "/pids.max"), str(pids_max))
    with _lock:
        _by_mark[mark] = name
    _made_event.set()  # wakes a quiet watcher
    return name


def enter(name):
    """Moves the calling thread into cgroup `name` (None: back to the root): what it spawns
    then is born there. Spawns are serialised by the agent's children lock."""
    tid = str(threading.get_native_id())
    for c in _fds:
        _write(_path(c, (name + "/tasks") if name else "tasks"), tid)


def _subtree(c, rel):
    """Cgroup `rel` of hierarchy `c` and the cgroups under it, each child before its parent
    (the order rmdir needs). No cap (jail.rs says why)."""
    out, todo = [], [rel]
    while todo:
        r = todo.pop()
        try:
            with os.scandir(_path(c, r)) as it:
                todo.extend(r + "/" + e.name for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            pass
        out.append(r)
    out.reverse()
    return out


# Cgroups an exec's reply path walks at most (jail.rs's WALK_MAX says why): beyond this an
# exec's processes are found through /proc and its cgroups removed by a thread of their own.
WALK_MAX = 256


def _subtree_upto(c, rel, limit):
    """`_subtree`, or None once it would hold more than `limit` cgroups."""
    out, todo = [], [rel]
    while todo:
        r = todo.pop()
        try:
            with os.scandir(_path(c, r)) as it:
                todo.extend(r + "/" + e.name for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            pass
        out.append(r)
        if len(out) + len(todo) > limit:
            return None
    out.reverse()
    return out


def _members_by_proc(name):
    """Processes whose pids cgroup is `name` or one under it, from /proc/PID/cgroup."""
    top, under = "/" + name, "/" + name + "/"
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cgroup" % entry) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:  # "ID:CONTROLLERS:PATH"
            parts = line.split(":", 2)
            if len(parts) == 3 and "pids" in parts[1].split(",") and (parts[2] == top or parts[2].startswith(under)):
                out.append(int(entry))
                break
    return out


_deferred: list = []  # (cgroup name, kill first?) for the remover thread  # type: ignore[type-arg]
_deferred_cv = threading.Condition()
_remover: list = []  # the remover thread, once started  # type: ignore[type-arg]


def _remover_loop():
    while True:
        with _deferred_cv:
            while not _deferred:
                _deferred_cv.wait()
            name, kill = _deferred.pop(0)
        if kill:
            _kill_walked(name)
        elif not _remove_all(name):
            with _lock:
                _stale.append(name)  # something still runs there: swept later


def _defer(name, kill):
    """Hands a large tree to the remover thread (jail.rs's `defer`); False when no thread can
    be made."""
    with _deferred_cv:
        if not _remover:
            try:
                t = threading.Thread(target=_remover_loop, name="cgroup-remover", daemon=True)
                t.start()
            except RuntimeError:
                return False
            _remover.append(t)
        if (name, kill) not in _deferred:  # not twice: a sweep hands a stale one on at every exec
            _deferred.append((name, kill))
            _deferred_cv.notify()
    return True


def _kill_walked(name):
    """SIGKILLs what the cgroups of `name`'s whole tree list until none is left."""
    for _ in range(100):
        pids = _procs_of(_subtree("pids", name))
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _rmdirs(c, rel):
    for r in _subtree(c, rel):
        try:
            os.rmdir(_path(c, r))
        except OSError:
            pass


def _remove(name):
    """Removes cgroup `name` and what a command made under it; True when it is gone (or, too
    large to walk here, handed to the remover thread)."""
    if "pids" not in _fds:
        return True
    if _subtree_upto("pids", name, WALK_MAX) is None and _defer(name, False):
        return True
    return _remove_all(name)


def _remove_all(name):
    if "pids" not in _fds:
        return True
    _rmdirs("pids", name)  # child cgroups a command made first
    if os.path.exists(_path("pids", name)):
        return False
    if "memory" in _fds:
        _rmdirs("memory", name)
    with _lock:
        _made.discard(name)
    return True


def _kill_foreign(c, me):
    """Kills the processes of every cgroup under hierarchy `c`'s root that the agent did not
    make (a command's hiding place), and their child cgroups', then removes them."""
    try:
        with os.scandir(_path(c, "")) as it:
            names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    with _lock:
        foreign = [n for n in names if n not in _made]
    killed = 0
    for name in foreign:
        for _ in range(3):
            n = 0
            for r in _subtree(c, name):
                for pid in _read_pids(_path(c, r + "/cgroup.procs")):
                    if pid != me and pid not in _exempt:
                        try:
                            os.kill(pid, signal.SIGKILL)
                            n += 1
                        except OSError:
                            pass
            killed += n
            if not n:
                break
            time.sleep(0.005)  # let the killed leave it
        _rmdirs(c, name)
    return killed


def sweep():
    """Removes the cgroups of returned execs whose last process has ended. `_remove` takes
    `_lock` itself (not reentrant), so the removals run outside it."""
    with _lock:
        names = list(_stale)
    gone = {n for n in names if _remove(n)}
    with _lock:
        _stale[:] = [n for n in _stale if n not in gone]


def release(name, mark):
    """The exec returned: its cgroups go now if empty, else once they are."""
    with _lock:
        _by_mark.pop(mark, None)
        _oom.discard(name)
        _peak.pop(name, None)
    if not _remove(name):
        with _lock:
            _stale.append(name)


def for_mark(mark):
    with _lock:
        return _by_mark.get(mark)


def _read_pids(path):
    try:
        with open(path) as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def members(name):
    """The pids in cgroup `name` and in the child cgroups its commands made."""
    rels = _subtree_upto("pids", name, WALK_MAX)
    if rels is not None:
        return _procs_of(rels)
    return sorted(set(_members_by_proc(name)) | set(_procs_of(_subtree("pids", name))))


def count_members(name):
    """About how many processes cgroup `name`'s tree holds, without walking a large one (for
    reports only: jail.rs says what it misses)."""
    rels = _subtree_upto("pids", name, WALK_MAX)
    return len(_procs_of(rels)) if rels is not None else len(_members_by_proc(name))


def _procs_of(rels):
    return [p for r in rels for p in _read_pids(_path("pids", r + "/cgroup.procs"))]


def task_count(name):
    try:
        with open(_path("pids", name + "/pids.current")) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def killable(name):
    """The members of cgroup `name` to SIGKILL, found without walking a large tree on the
    caller's path: such a tree is looked up in /proc, and once /proc shows none of its
    processes the remover thread walks the cgroups' own lists and kills what they hold
    (jail.rs's kill_members says why)."""
    rels = _subtree_upto("pids", name, WALK_MAX)
    if rels is not None:
        return _procs_of(rels)
    pids = _members_by_proc(name)
    if not pids and not _defer(name, True):
        _kill_walked(name)
    return pids


def kill_members(name):
    """SIGKILLs every member of cgroup `name` (`killable`); how many (the caller tries again
    until none is left)."""
    pids = killable(name)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def memory_usage(name=""):
    if "memory" not in _fds:
        return None
    try:
        with open(_path("memory", (name + "/" if name else "") + "memory.usage_in_bytes")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def was_oom_killed(name):
    with _lock:
        return name in _oom


BOMB_FOR_S = 1.0  # seconds a returned exec's leftovers may hold half their pids limit (memwatch.rs)
BOMB_CLEAR_LOOKS = 3  # looks in a row under the mark that clear a suspect


def _reap_bombs(pids_max, full):
    """Kills what a returned exec left running once it held half its pids limit on BOMB_POLLS more
    looks than not: a fork bomb left in the background (`:(){ :|:& };:` returns at once)."""
    with _lock:
        names = list(_stale)
    for n in list(full):
        if n not in names:
            del full[n]
    now = time.monotonic()
    for name in names:
        # Wall time, not a count of looks: under the bomb this thread is starved (memwatch.rs).
        if task_count(name) * 2 < pids_max:
            if name in full:
                since, misses = full[name]
                if misses + 1 >= BOMB_CLEAR_LOOKS:
                    del full[name]
                else:
                    full[name] = (since, misses + 1)
            continue
        since = full.get(name, (now, 0))[0]
        full[name] = (since, 0)
        if now - since >= BOMB_FOR_S:
            while kill_members(name):
                time.sleep(0.005)
            full.pop(name, None)


# With no command running (no exec or background process has cgroups), the longest wait
# between looks (memwatch.rs QUIET says why); a new exec wakes the watcher at once.
QUIET_S = 1.0
_made_event = threading.Event()


def _wait_while_quiet():
    with _lock:
        quiet = not _by_mark and not _stale
    if not quiet:
        return False
    _made_event.wait(QUIET_S)
    _made_event.clear()
    return True


def watch(limit_bytes, pids_max):
    """The watcher's loop (a thread); returns at once without cgroups (limit_bytes 0: no
    memory watch)."""
    if "pids" not in _fds:
        return
    full = {}  # type: ignore[var-annotated]
    poll = POLL_S
    looks = 0
    while True:
        if not _wait_while_quiet():
            time.sleep(poll)
        looks += 1
        kill_escaped(looks % 10 == 0)
        if pids_max:
            note_peaks()
            _reap_bombs(pids_max, full)
        total = memory_usage() if limit_bytes else None
        if total is None:
            continue
        # Below half the limit a burst cannot reach it before the next look: look less often.
        poll = 0.1 if total < limit_bytes // 2 else POLL_S  # memwatch.rs POLL_IDLE says why
        if total < limit_bytes:
            continue
        with _lock:
            names = list(_by_mark.values()) + list(_stale)
        sized = [(memory_usage(n) or 0, n) for n in names]
        if sized:
            used, name = max(sized)
            # Memory no exec holds (an episode container's, a file in /dev/shm) is not
            # freed by killing a small exec: the host's limit is the last line then.
            if used > 0 and used * 8 >= total:
                with _lock:
                    _oom.add(name)
                kill_members(name)
                time.sleep(SETTLE_S)
