"""The `exec` request (a command run to its end: stdin, output kept up to a cap per stream, a
timeout that kills its whole tree, OOM and fork-bomb reporting) and `spawn` (a long-running
process started without waiting for it).

This file runs under the image's own `python3` next to agent.py and imports nothing outside
the standard library, nor agent.py itself (it runs as __main__; a second import would make a
second copy of its state): agent.py hands op_exec its worker pool's submit.
"""

import base64
import itertools
import os
import select
import signal
import subprocess
import time

try:
    import children  # beside this file (runtime/agentdir.py installs them)
    import jail
except ImportError:  # imported as rollbox.runtime.agent.* (unit tests)
    from . import children  # type: ignore[no-redef]
    from . import jail  # type: ignore[no-redef]

_children_lock, _identity, _home_or_root, _user_kwargs = (children._children_lock, children._identity,
                                                          children._home_or_root, children._user_kwargs)
make_env, spawn, kill_tree, exit_code_of = children.make_env, children.spawn, children.kill_tree, children.exit_code_of
EXEC_PIDS_MAX, PIDS_REPORT_AT = children.EXEC_PIDS_MAX, children.PIDS_REPORT_AT
# How long a tree left behind the pipes keeps its size before the exec returns without it, and
# how long a running tree may sit at its pids limit before it counts as a fork bomb (ops.rs).
STABLE_S, LIMIT_HOLD_S = 0.2, 0.3

# Output kept per stream when a request does not say (bytes); the rest is read and dropped.
DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024


_mains = itertools.count(1)  # main processes started (their cgroups' marks)


def op_spawn(req):
    """Starts a long-running process (an image's entrypoint) without waiting for it; its
    output goes to `log` (default /dev/null). Returns its pid."""
    env = dict(os.environ)
    env.update(_identity["env"])
    env.update(req.get("env") or {})
    cwd = req.get("cwd") or _home_or_root(env)
    # Cgroups of its own, kept for the sandbox's life (the root ones are the agent's: jail.py).
    mark = "ROLLBOX_MAIN=%d" % next(_mains)
    cg = jail.create(0, mark)
    try:
        extra = _user_kwargs(req.get("user"))
        with open(req.get("log") or "/dev/null", "ab") as out:
            with _children_lock:
                if cg:
                    jail.enter(cg)
                else:
                    jail.note_unjailed()
                try:
                    proc = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=cwd,
                                            env=env, start_new_session=True, restore_signals=True, **extra)
                finally:
                    if cg:
                        jail.enter(None)
    except OSError as e:
        if cg:
            jail.release(cg, mark)
        raise ValueError("cannot start %r: %s" % (req["argv"][:1], e))
    return {"pid": proc.pid}


def op_exec(req, submit):
    """Runs `argv` to its end; `submit(fn)` runs fn on a worker thread (stdin is fed by one)."""
    argv = req["argv"]
    timeout = req.get("timeout")
    cap = DEFAULT_MAX_OUTPUT if req.get("max_output") is None else int(req["max_output"])  # 0: keep nothing
    env, mark = make_env(req)
    cwd = req.get("cwd") or _home_or_root(env)
    stdin_data = base64.b64decode(req["stdin"]) if req.get("stdin") is not None else None

    start = time.monotonic()
    # The exec's own cgroups: its whole tree, whatever it does to its session or environment.
    cg = jail.create(EXEC_PIDS_MAX, mark)
    try:
        proc, waiter = spawn(argv, env, cwd, req.get("user"), subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                             subprocess.PIPE, subprocess.PIPE, cg=cg)
        pid = proc.pid
    except FileNotFoundError as e:
        if cg:
            jail.release(cg, mark)
        if cwd is not None and e.filename == cwd:
            return _spawn_failure(126, "rollbox: no such working directory: %s\n" % cwd, start)
        return _spawn_failure(127, "rollbox: command not found: %s\n" % argv[0], start)
    except OSError as e:
        if cg:
            jail.release(cg, mark)
        return _spawn_failure(126, "rollbox: cannot run %r: %s\n" % (argv[0], e), start)
    except BaseException:
        if cg:
            jail.release(cg, mark)
        raise
    out_r = proc.stdout.fileno()
    err_r = proc.stderr.fileno()

    if stdin_data is not None:
        # Written by a thread so a child that never reads cannot block us; closed after.
        def feed():
            try:
                proc.stdin.write(stdin_data)
            except OSError:
                pass
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass

        submit(feed)

    bufs = {out_r: bytearray(), err_r: bytearray()}
    totals = {out_r: 0, err_r: 0}
    open_fds = [out_r, err_r]
    timed_out = False
    tree = 0
    exited_at = None
    grown = 0  # the most processes seen behind the pipes after the main process exited
    seen = 0  # the most processes this loop saw in the exec's cgroup
    bomb = False  # a fork bomb (half its pids limit held, or a quarter grown after the exit)
    base = None  # tasks at the first look after the exit
    grew_at = start  # when `grown` last rose
    forking = False  # the tree grew after the main process exited
    stopped_at = None  # tasks when a bomb's tree was last SIGSTOPped
    next_look = start  # when the running tree's size is next read (with a deadline)
    full_since = None  # since when it has been at its pids limit
    deadline = start + timeout if timeout else None

    def take(fd):
        """Reads one chunk: counts it, keeps what fits under the cap; False at EOF."""
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        totals[fd] += len(chunk)
        room = cap - len(bufs[fd])
        if room > 0:
            bufs[fd] += chunk[:room]
        return True

    while open_fds:
        now = time.monotonic()
        if waiter[0].is_set() and exited_at is None:
            exited_at = now
        if deadline is not None and exited_at is None and now >= next_look:
            # A tree at its pids limit for LIMIT_HOLD_S spins on failed forks (a bomb that never
            # gives up): frozen until its deadline's kill, so that the agent is not starved
            # into seeing the deadline seconds late (ops.rs).
            next_look = now + 0.05
            n = jail.task_count(cg) if cg else 0
            at_limit = EXEC_PIDS_MAX > 0 and n + 2 >= EXEC_PIDS_MAX
            # Processes, not tasks: one program's many threads at the limit is no bomb.
            procs = jail.count_members(cg) if cg and at_limit else 0
            seen = max(seen, procs)
            if at_limit and procs * 2 >= EXEC_PIDS_MAX:
                full_since = now if full_since is None else full_since
                if now - full_since >= LIMIT_HOLD_S and stopped_at != procs:
                    bomb = True
                    kill_tree(pid, mark, signal.SIGSTOP)
                    stopped_at = procs
            else:
                full_since = None
        # After the main process exits, background children may hold the pipes: return once
        # the tree has kept its size for STABLE_S (a background server). A tree that forks
        # after the exit, or has ever held half its pids limit, is a fork bomb whose shell
        # exited (`:(){ :|:& };:`): this exec's work, frozen once bomb-sized and ended by its
        # timeout, or (without one) killed now. Forks in gVisor are slow, so one look 50 ms
        # after the exit saw no growth (ops.rs, gh-19); "ever": a churning bomb's count dips.
        if exited_at is not None and now - exited_at > 0.05:
            # Processes, not tasks (pids.current counts threads): a background server that
            # starts its thread pool is not forking.
            n = jail.count_members(cg) if cg else 0
            tasks = jail.task_count(cg) if cg else 0
            seen = max(seen, n)
            base = n if base is None else base
            if n > max(grown, base):
                grown, grew_at = n, now
            forking = forking or grown > base + 1
            # At its limit, mostly in processes: forks fail; only a bomb gets there.
            full = EXEC_PIDS_MAX > 0 and tasks + 2 >= EXEC_PIDS_MAX and n * 2 >= EXEC_PIDS_MAX
            if full and deadline is None:
                bomb = True
                tree = kill_tree(pid, mark)
                break
            if full or (deadline is not None and forking and n * 4 >= EXEC_PIDS_MAX):
                bomb = True  # reported pids_limited, though frozen short of the limit
            if bomb and stopped_at != n:
                kill_tree(pid, mark, signal.SIGSTOP)
                stopped_at = n
            if not (bomb or (deadline is not None and forking) or now - max(grew_at, exited_at) < STABLE_S):
                break
        if deadline is not None and now >= deadline and (not waiter[0].is_set() or forking or bomb):
            timed_out = True
            tree = kill_tree(pid, mark)
            break
        wait = 0.025 if exited_at is not None else 0.05
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - now))
        ready, _, _ = select.select(open_fds, [], [], wait)
        for fd in ready:
            if not take(fd):
                open_fds.remove(fd)
    # A forking tree that let go of the pipes by itself while the watcher saw it at half its
    # limit is a bomb that collapsed: reported, and what it left is killed (ops.rs).
    if (not timed_out and forking and not open_fds and cg and EXEC_PIDS_MAX > 0
            and jail.peak(cg) * 2 >= EXEC_PIDS_MAX):
        bomb = True
    if timed_out or bomb:
        # Drain what is buffered, then make sure no process of this exec is left.
        tree = max(tree, kill_tree(pid, mark))
    waiter[0].wait(timeout=5 if timed_out or bomb else None)
    status = waiter[1]
    for fd in (out_r, err_r):
        try:
            while select.select([fd], [], [], 0)[0] and take(fd):
                pass
        except OSError:
            pass
    proc.stdout.close()
    proc.stderr.close()
    # Tell Popen the status is known so its own cleanup never waits on a pid we reaped.
    proc.returncode = exit_code_of(status) if status is not None else -9
    oom_killed = bool(cg) and jail.was_oom_killed(cg) and not timed_out
    # A bomb churns (failed forks exit, retries fork again): the most tasks the watcher saw
    # says more than the count at the kill.
    pids_limited = bomb or (timed_out and (tree >= PIDS_REPORT_AT or (bool(cg) and jail.peak(cg) * 4 >= EXEC_PIDS_MAX * 3)))
    if cg:
        jail.release(cg, mark)
    return {
        "exit_code": None if timed_out or status is None else exit_code_of(status),
        "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        "stdout": base64.b64encode(bytes(bufs[out_r])).decode(),
        "stderr": base64.b64encode(bytes(bufs[err_r])).decode(),
        "stdout_bytes": totals[out_r],
        "stderr_bytes": totals[err_r],
        "truncated": totals[out_r] > cap or totals[err_r] > cap,
        "timed_out": timed_out,
        # A fork bomb: the exec's tree had (nearly) every process the sandbox may have.
        "pids_limited": pids_limited,
        # The memory watcher (jail.watch) SIGKILLed this exec's tree: exit 137, as Linux's OOM killer.
        "oom_killed": oom_killed,
        "duration_s": time.monotonic() - start,
    }


def _spawn_failure(code, message, start):
    return {
        "exit_code": code, "signal": None, "stdout": "",
        "stderr": base64.b64encode(message.encode()).decode(),
        "stdout_bytes": 0, "stderr_bytes": len(message), "truncated": False,
        "timed_out": False, "duration_s": time.monotonic() - start,
    }
