//! Background processes (gh-16): the table of processes started with `proc_start`, each with
//! a reader thread that drains its output into bounded retention buffers (the other
//! `proc_*` ops: procs_ops.rs). The table lives in the agent, so it survives the daemon and the client
//! restarting and is carried through a memory snapshot (threads and pipes are restored).
//! Protocol: /work/notes/proc-spec.md (the same fields, replies and error kinds as agent.py).

use std::collections::HashMap;
use libc::c_int;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::wire::{self, Obj, Value, ValueExt};
use crate::ops::{self, OpError, OpResult, Refusal};
use crate::proc::{self, Launch, Stdin, Waiter};
use crate::retain::{self, Stream};
use crate::sys::{self, Fd};
use crate::Agent;

const DEFAULT_RETAINED: usize = 1 << 20;
/// Ended processes listed: the most recent this many, for at most FORGET_AFTER_S.
const KEEP_ENDED: usize = 64;
const FORGET_AFTER_S: f64 = 600.0;
/// A reader wakes this often to notice an exit while a descendant still holds the pipes.
const POLL_MS: u64 = 200;
/// After the main process exits, background children may hold its pipes: stop reading then
/// (as exec does); they get EPIPE from then on.
const AFTER_EXIT: Duration = Duration::from_millis(50);

/// What the reader thread and the ops share, under one lock.
pub(crate) struct State {
    pub(crate) out: Stream,
    pub(crate) err: Stream,
    pub(crate) status: Option<c_int>,
    pub(crate) ended_at: Option<f64>,
    /// The process was reaped and the reader is done (pipes at EOF, or closed 50 ms after
    /// the exit): every byte is in the buffers.
    pub(crate) finished: bool,
    pub(crate) timed_out: bool,
    pub(crate) pids_limited: bool,
}

/// Where `proc_write` writes: the stdin pipe, or the pty master.
pub(crate) enum Input {
    Pipe(Fd),
    Pty(Arc<Fd>),
}

impl Input {
    pub(crate) fn fd(&self) -> c_int {
        match self {
            Input::Pipe(f) => f.0,
            Input::Pty(f) => f.0,
        }
    }
}

pub(crate) struct Proc {
    pub(crate) pid: sys::pid_t,
    pub(crate) argv: Vec<Vec<u8>>,
    pub(crate) cwd: Vec<u8>,
    pub(crate) user: Value,
    pub(crate) started_at: f64,
    /// "MARK=value" in every process of its tree: what kill_tree looks for.
    pub(crate) needle: Vec<u8>,
    pub(crate) master: Option<Arc<Fd>>,
    pub(crate) input: Mutex<Option<Input>>,
    pub(crate) state: Mutex<State>,
    pub(crate) cv: Condvar,
    /// Its own cgroups (jail.rs), as an exec's: kill and the OOM watcher find its whole tree.
    pub(crate) jail: Mutex<Option<crate::jail::Jail>>,
}

/// The API-started processes, by pid.
pub struct Table {
    procs: Mutex<HashMap<sys::pid_t, Arc<Proc>>>,
}

impl Table {
    pub fn new() -> Self {
        Table { procs: Mutex::new(HashMap::new()) }
    }

    /// The table with ended entries past their keep limits dropped, what is left of their
    /// trees killed first: a process gone from the list is gone from the sandbox.
    pub(crate) fn pruned(&self) -> MutexGuard<'_, HashMap<sys::pid_t, Arc<Proc>>> {
        let mut procs = self.procs.lock().unwrap();
        let now = ops::now_unix();
        let mut ended: Vec<(f64, sys::pid_t)> = procs.values()
            .filter_map(|p| {
                let st = p.state.lock().unwrap();
                (st.finished || st.status.is_some()).then(|| (st.ended_at.unwrap_or(0.0), p.pid))
            })
            .collect();
        ended.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
        for (i, (at, pid)) in ended.into_iter().enumerate() {
            if i >= KEEP_ENDED || now - at > FORGET_AFTER_S {
                if let Some(p) = procs.remove(&pid) {
                    // Reaped: its pid (so its group id) may be reused; only a live mark is ours.
                    let jailed = crate::jail::for_mark(&p.needle)
                        .map(|n| !crate::jail::members(&n).is_empty()).unwrap_or(false);
                    if jailed || !proc::marked_pids(&p.needle).is_empty() {
                        proc::kill_tree(p.pid, &p.needle);
                    }
                    if let Some(j) = p.jail.lock().unwrap().take() {
                        j.release(&p.needle);
                    }
                }
            }
        }
        procs
    }

    pub(crate) fn get(&self, req: &Value) -> Result<Arc<Proc>, OpError> {
        let pid = req.get("pid").and_then(|v| v.num()).ok_or_else(|| OpError::new("process_not_found",
            format!("pid {} is not a process id", String::from_utf8_lossy(&wire::to_vec(req.get("pid").unwrap_or(&Value::Null))))))?;
        self.pruned().get(&(pid as sys::pid_t)).cloned().ok_or_else(|| OpError::new("process_not_found",
            format!("no process with pid {} in this sandbox: it was not started with process.exec, or it ended \
                     more than {} s (or {} ended processes) ago", pid as i64, FORGET_AFTER_S as i64, KEEP_ENDED)))
    }
}

/// Everything the reader thread needs, handed over once the process is started.
struct Started {
    proc: Arc<Proc>,
    waiter: Arc<Waiter>,
    /// The read ends (stdout, stderr); a pty has only the master, as stdout.
    fds: [Option<c_int>; 2],
    _own: Vec<Fd>,
    deadline: Option<Instant>,
}

pub(crate) fn num(req: &Value, key: &str, default: f64) -> Result<f64, OpError> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.num().ok_or_else(|| OpError::bad(format!("TypeError: {} must be a number", key))),
    }
}

pub(crate) fn win(req: &Value, key: &str, default: f64) -> Result<u16, OpError> {
    let v = if req.get_truthy(key).is_some() { num(req, key, default)? } else { default };
    if !(1.0..=65535.0).contains(&v) {
        return Err(OpError::invalid(format!("{} must be between 1 and 65535, not {}", key, v)));
    }
    Ok(v as u16)
}

pub fn op_start(a: &Agent, req: &Value) -> OpResult {
    let pty = req.get_truthy("pty").is_some();
    let (cols, rows) = if pty { (win(req, "cols", 80.0)?, win(req, "rows", 24.0)?) } else { (80, 24) };
    let timeout = num(req, "timeout", 0.0)?;
    let head_cap = num(req, "max_retained", DEFAULT_RETAINED as f64)?.max(0.0) as usize;
    let mut token = [0u8; 12];
    sys::random(&mut token);
    let mark = format!("{}-p{}", unsafe { sys::getpid() }, ops::hex(&token));
    let mut env = ops::command_env(a, req)?;
    ops::env_set(&mut env, ops::MARK.as_bytes(), mark.as_bytes());
    let argv = ops::str_list(req, "argv")
        .map_err(|_| OpError::invalid("proc_start needs a non-empty list of string arguments"))?;
    let what = String::from_utf8_lossy(&argv[0]).to_string();
    let p = match ops::prepare(req, &env) {
        Ok(p) => p,
        Err(Refusal::Exit(_, msg)) => {
            return Err(OpError::invalid(format!("cannot start ['{}']: {}", what, msg.trim_end().trim_start_matches("rollbox: "))))
        }
        Err(Refusal::Error(e)) => return Err(e),
    };
    // The thread first: under RLIMIT_NPROC it is what fails, and then nothing was started.
    let (tx, rx) = mpsc::channel::<Started>();
    std::thread::Builder::new().stack_size(256 << 10).spawn(move || {
        if let Ok(s) = rx.recv() {
            pump(s)
        }
    }).map_err(|e| OpError::new("resource_exhausted", format!(
        "cannot start ['{}']: the agent could not create its output reader thread ({}): the sandbox is at its \
         process limit; end some processes (or raise pids=) and retry", what, e)))?;
    let io_fail = |e: std::io::Error| OpError::new("agent_error", format!("OSError: {}", e));
    let mut keep: Vec<Fd> = Vec::new();
    let (fds, input, master, launch_fds) = if pty {
        let (m, s) = sys::openpty().map_err(io_fail)?;
        sys::set_winsize(m.0, cols, rows);
        let m = Arc::new(m);
        ([Some(m.0), None], Input::Pty(m.clone()), Some(m), (s, None, None))
    } else {
        // Each end owned at once, so a failed later pipe (EMFILE) closes the earlier ones.
        let pair = || sys::pipe().map(|(r, w)| (Fd(r), Fd(w))).map_err(io_fail);
        let (or, ow) = pair()?;
        let (er, ew) = pair()?;
        let (ir, iw) = pair()?;
        let fds = [Some(or.0), Some(er.0)];
        keep.push(or);
        keep.push(er);
        (fds, Input::Pipe(iw), None, (ir, Some(ow), Some(ew)))
    };
    let (child_in, child_out, child_err) = launch_fds;
    let out_fd = child_out.as_ref().map(|f| f.0).unwrap_or(child_in.0);
    let err_fd = child_err.as_ref().map(|f| f.0).unwrap_or(child_in.0);
    let cwd = p.cwd.as_bytes().to_vec();
    let launch = Launch { path: p.path, argv: p.argv, env: p.env, cwd: p.cwd, stdin: Stdin::Fd(child_in.0),
                          stdout: out_fd, stderr: err_fd, creds: p.creds };
    let needle = format!("{}={}", ops::MARK, mark).into_bytes();
    let jail = crate::jail::Jail::create(proc::exec_pids_max(), &needle);
    let run = || if pty { proc::launch_tty(&launch) } else { proc::launch(&launch) };
    let started = a.reaper.start(true, || match &jail {
        Some(j) => j.spawn_inside(run),
        None => {
            crate::jail::note_unjailed();
            run()
        }
    });
    drop((child_in, child_out, child_err));
    let (pid, waiter) = match started {
        Ok((pid, Some(w))) => (pid, w),
        Ok((_, None)) => unreachable!(),
        Err(e) => {
            if let Some(j) = jail {
                j.release(&needle);
            }
            if e.raw_os_error() == Some(sys::EAGAIN) {
                // The reader thread took the last task the limit allowed: the same condition.
                return Err(OpError::new("resource_exhausted", format!(
                    "cannot start ['{}']: the sandbox is at its process limit ({}); end some processes (or raise \
                     pids=) and retry", what, e)));
            }
            let (_, msg) = ops::launch_error(e, launch.argv[0].as_bytes());
            return Err(OpError::invalid(format!("cannot start ['{}']: {}", what, msg.trim_end().trim_start_matches("rollbox: "))));
        }
    };
    for fd in fds.iter().flatten() {
        sys::set_nonblocking(*fd, true);
    }
    sys::set_nonblocking(input.fd(), true);
    let started_at = ops::now_unix();
    let user = match req.get("user") {
        None => Value::Null,
        Some(v) => v.clone(),
    };
    let tail = retain::TAIL;
    let entry = Arc::new(Proc {
        pid, argv, cwd, user, started_at, needle, master, jail: Mutex::new(jail),
        input: Mutex::new(Some(input)),
        state: Mutex::new(State { out: Stream::new(head_cap, tail), err: Stream::new(head_cap, tail), status: None,
                                  ended_at: None, finished: false, timed_out: false, pids_limited: false }),
        cv: Condvar::new(),
    });
    a.procs.pruned().insert(pid, entry.clone());
    let deadline = (timeout > 0.0).then(|| Instant::now() + Duration::from_secs_f64(timeout.min(1e9)));
    let _ = tx.send(Started { proc: entry, waiter, fds, _own: keep, deadline });
    Ok(Obj::new().with("pid", Value::from(pid as i64)).with("started_at", Value::from(started_at)))
}

/// Reads what `fd` has into `stream`. False at EOF (a pty master says EIO once no slave is open).
fn drain(p: &Proc, fd: c_int, which: usize, chunk: &mut [u8]) -> bool {
    loop {
        let n = unsafe { sys::read(fd, chunk.as_mut_ptr() as *mut _, chunk.len()) };
        if n > 0 {
            let mut st = p.state.lock().unwrap();
            let stream = if which == 0 { &mut st.out } else { &mut st.err };
            stream.push(&chunk[..n as usize]);
            drop(st);
            p.cv.notify_all();
            continue;
        }
        if n == 0 {
            return false;
        }
        return match sys::errno() {
            sys::EINTR => continue,
            sys::EAGAIN => true,
            _ => false,
        };
    }
}

/// The reader thread: drains the output until EOF, records the exit and enforces the timeout.
fn pump(s: Started) {
    let p = s.proc;
    let mut fds = s.fds;
    let mut chunk = vec![0u8; 64 << 10];
    let mut exited_at: Option<Instant> = None;
    // The reaper writes to this pipe at the exit, so an idle process costs no wake-ups (a
    // descendant may hold the output pipes open past the exit). Without it: poll every POLL_MS.
    let wake = sys::pipe().ok().map(|(r, w)| (Fd(r), Fd(w)));
    let waking = match &wake {
        Some((r, w)) => {
            sys::set_nonblocking(r.0, true);
            sys::set_nonblocking(w.0, true);
            s.waiter.set_wake(w.0)
        }
        None => false,
    };
    loop {
        let status = s.waiter.status();
        if status.is_some() && exited_at.is_none() {
            exited_at = Some(Instant::now());
        }
        if exited_at.map_or(false, |t| t.elapsed() >= AFTER_EXIT) {
            // What is buffered still counts; then the read ends close.
            for (i, fd) in fds.iter_mut().enumerate() {
                if let Some(f) = *fd {
                    drain(&p, f, i, &mut chunk);
                }
                *fd = None;
            }
        }
        let open = fds.iter().any(|f| f.is_some());
        {
            let mut st = p.state.lock().unwrap();
            if status.is_some() && st.status.is_none() {
                st.status = status;
                st.ended_at = Some(ops::now_unix());
                p.cv.notify_all();
            }
            if let Some(d) = s.deadline {
                if !st.timed_out && Instant::now() >= d {
                    st.timed_out = true;
                    drop(st);
                    let tree = proc::kill_tree(p.pid, &p.needle);
                    p.state.lock().unwrap().pids_limited = tree >= proc::pids_report_at();
                    continue;
                }
            }
            if !open && st.status.is_some() {
                break;
            }
        }
        let timed_out = p.state.lock().unwrap().timed_out;
        // None: until an fd is ready (the reaper's wake-up included).
        let mut wait = if waking && exited_at.is_none() { None } else { Some(Duration::from_millis(POLL_MS)) };
        let mut cap = |d: Duration| wait = Some(wait.map_or(d, |w| w.min(d)));
        if let Some(d) = s.deadline.filter(|_| !timed_out) {
            cap(d.saturating_duration_since(Instant::now()));
        }
        if let Some(t) = exited_at {
            cap(AFTER_EXIT.saturating_sub(t.elapsed()));
        }
        if !open {
            // Output closed; the exit (or the deadline) is what is left to wait for.
            if s.waiter.wait(if timed_out { Some(Duration::from_secs(5)) } else { wait }).is_none() && timed_out {
                break; // killed but never reaped: give up on its status
            }
            continue;
        }
        let mut pfds: Vec<sys::PollFd> = fds.iter().flatten().map(|&fd| sys::PollFd { fd, events: sys::POLLIN, revents: 0 }).collect();
        if let (true, Some((r, _))) = (waking, &wake) {
            pfds.push(sys::PollFd { fd: r.0, events: sys::POLLIN, revents: 0 });
        }
        let ms = wait.map_or(-1, |w| ((w.as_micros() + 999) / 1000) as i32);
        if unsafe { sys::poll(pfds.as_mut_ptr(), pfds.len() as _, ms) } <= 0 {
            continue;
        }
        for pfd in &pfds {
            if pfd.revents != 0 {
                let i = match fds.iter().position(|f| *f == Some(pfd.fd)) {
                    Some(i) => i,
                    None => {
                        let mut b = [0u8; 16];
                        unsafe { sys::read(pfd.fd, b.as_mut_ptr() as *mut _, b.len()) }; // the wake-up
                        continue;
                    }
                };
                if !drain(&p, pfd.fd, i, &mut chunk) {
                    fds[i] = None;
                }
            }
        }
    }
    s.waiter.clear_wake();
    drop(wake);
    *p.input.lock().unwrap() = None;
    let mut st = p.state.lock().unwrap();
    st.finished = true;
    st.out.compact();
    st.err.compact();
    if st.ended_at.is_none() {
        st.ended_at = Some(ops::now_unix());
    }
    drop(st);
    p.cv.notify_all();
}

