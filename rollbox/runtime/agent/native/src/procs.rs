//! Background processes (gh-16): the table of processes started with `proc_start`, each with
//! a reader thread that drains its output into bounded retention buffers, and the `proc_*`
//! ops over it. The table lives in the agent, so it survives the daemon and the client
//! restarting and is carried through a memory snapshot (threads and pipes are restored).
//! Protocol: /work/notes/proc-spec.md (the same fields, replies and error kinds as agent.py).

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::b64;
use crate::json::{ObjBuilder, Value};
use crate::ops::{self, OpError, OpResult, Refusal};
use crate::proc::{self, Launch, Stdin, Waiter};
use crate::retain::{self, Stream};
use crate::sys::{self, Fd};
use crate::Agent;

const DEFAULT_RETAINED: usize = 1 << 20;
const DEFAULT_READ: usize = 1 << 20;
const MAX_WAIT_S: f64 = 10.0;
/// Ended processes listed: the most recent this many, for at most FORGET_AFTER_S.
const KEEP_ENDED: usize = 64;
const FORGET_AFTER_S: f64 = 600.0;
/// A reader wakes this often to notice an exit while a descendant still holds the pipes.
const POLL_MS: u64 = 200;
/// After the main process exits, background children may hold its pipes: stop reading then
/// (as exec does); they get EPIPE from then on.
const AFTER_EXIT: Duration = Duration::from_millis(50);
/// A write to a stdin nobody reads gives up after this long, replying with what it wrote.
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// What the reader thread and the ops share, under one lock.
struct State {
    out: Stream,
    err: Stream,
    status: Option<c_int>,
    ended_at: Option<f64>,
    /// The process was reaped and the reader is done (pipes at EOF, or closed 50 ms after
    /// the exit): every byte is in the buffers.
    finished: bool,
    timed_out: bool,
    pids_limited: bool,
}

/// Where `proc_write` writes: the stdin pipe, or the pty master.
enum Input {
    Pipe(Fd),
    Pty(Arc<Fd>),
}

impl Input {
    fn fd(&self) -> c_int {
        match self {
            Input::Pipe(f) => f.0,
            Input::Pty(f) => f.0,
        }
    }
}

struct Proc {
    pid: sys::pid_t,
    argv: Vec<Vec<u8>>,
    cwd: Vec<u8>,
    user: Value,
    started_at: f64,
    /// "MARK=value" in every process of its tree: what kill_tree looks for.
    needle: Vec<u8>,
    master: Option<Arc<Fd>>,
    input: Mutex<Option<Input>>,
    state: Mutex<State>,
    cv: Condvar,
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
    fn pruned(&self) -> MutexGuard<'_, HashMap<sys::pid_t, Arc<Proc>>> {
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
                    if !proc::marked_pids(&p.needle).is_empty() {
                        proc::kill_tree(p.pid, &p.needle);
                    }
                }
            }
        }
        procs
    }

    fn get(&self, req: &Value) -> Result<Arc<Proc>, OpError> {
        let pid = req.get("pid").and_then(|v| v.as_f64()).ok_or_else(|| OpError::new("process_not_found",
            format!("pid {} is not a process id", String::from_utf8_lossy(&crate::json::to_vec(req.get("pid").unwrap_or(&Value::Null))))))?;
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

fn num(req: &Value, key: &str, default: f64) -> Result<f64, OpError> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| OpError::bad(format!("TypeError: {} must be a number", key))),
    }
}

fn win(req: &Value, key: &str, default: f64) -> Result<u16, OpError> {
    let v = num(req, key, default)?;
    if !(1.0..=65535.0).contains(&v) {
        return Err(OpError::invalid(format!("{} must be between 1 and 65535, not {}", key, v)));
    }
    Ok(v as u16)
}

pub fn op_start(a: &Agent, req: &Value) -> OpResult {
    let pty = req.get_truthy("pty").is_some();
    let (cols, rows) = (win(req, "cols", 80.0)?, win(req, "rows", 24.0)?);
    let timeout = num(req, "timeout", 0.0)?;
    let head_cap = num(req, "max_retained", DEFAULT_RETAINED as f64)?.max(0.0) as usize;
    let mut token = [0u8; 12];
    sys::random(&mut token);
    let mark = format!("{}-p{}", unsafe { sys::getpid() }, ops::hex(&token));
    let mut env = ops::command_env(a, req)?;
    ops::env_set(&mut env, ops::MARK.as_bytes(), mark.as_bytes());
    let argv = ops::str_list(req, "argv")?;
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
        let (or, ow) = sys::pipe().map_err(io_fail)?;
        let (er, ew) = sys::pipe().map_err(io_fail)?;
        let (ir, iw) = sys::pipe().map_err(io_fail)?;
        let fds = [Some(or), Some(er)];
        keep.push(Fd(or));
        keep.push(Fd(er));
        (fds, Input::Pipe(Fd(iw)), None, (Fd(ir), Some(Fd(ow)), Some(Fd(ew))))
    };
    let (child_in, child_out, child_err) = launch_fds;
    let out_fd = child_out.as_ref().map(|f| f.0).unwrap_or(child_in.0);
    let err_fd = child_err.as_ref().map(|f| f.0).unwrap_or(child_in.0);
    let cwd = p.cwd.as_bytes().to_vec();
    let launch = Launch { path: p.path, argv: p.argv, env: p.env, cwd: p.cwd, stdin: Stdin::Fd(child_in.0),
                          stdout: out_fd, stderr: err_fd, creds: p.creds };
    let started = a.reaper.start(true, || if pty { proc::launch_tty(&launch) } else { proc::launch(&launch) });
    drop((child_in, child_out, child_err));
    let (pid, waiter) = match started {
        Ok((pid, Some(w))) => (pid, w),
        Ok((_, None)) => unreachable!(),
        Err(e) => {
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
        pid, argv, cwd, user, started_at, needle: format!("{}={}", ops::MARK, mark).into_bytes(), master,
        input: Mutex::new(Some(input)),
        state: Mutex::new(State { out: Stream::new(head_cap, tail), err: Stream::new(head_cap, tail), status: None,
                                  ended_at: None, finished: false, timed_out: false, pids_limited: false }),
        cv: Condvar::new(),
    });
    a.procs.pruned().insert(pid, entry.clone());
    let deadline = (timeout > 0.0).then(|| Instant::now() + Duration::from_secs_f64(timeout.min(1e9)));
    let _ = tx.send(Started { proc: entry, waiter, fds, _own: keep, deadline });
    Ok(ObjBuilder::new().with("pid", Value::Int(pid as i64)).with("started_at", Value::Float(started_at)))
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
        let mut wait = match s.deadline {
            Some(d) if !timed_out => Duration::from_millis(POLL_MS).min(d.saturating_duration_since(Instant::now())),
            _ => Duration::from_millis(POLL_MS),
        };
        if let Some(t) = exited_at {
            wait = wait.min(AFTER_EXIT.saturating_sub(t.elapsed()));
        }
        if !open {
            // Output closed; the exit (or the deadline) is what is left to wait for.
            if s.waiter.wait(Some(if timed_out { Duration::from_secs(5) } else { wait })).is_none() && timed_out {
                break; // killed but never reaped: give up on its status
            }
            continue;
        }
        let mut pfds: Vec<sys::PollFd> = fds.iter().flatten().map(|&fd| sys::PollFd { fd, events: sys::POLLIN, revents: 0 }).collect();
        let ms = (wait.as_micros() as i64 + 999) / 1000;
        if unsafe { sys::poll(pfds.as_mut_ptr(), pfds.len() as _, ms as i32) } <= 0 {
            continue;
        }
        for pfd in &pfds {
            if pfd.revents != 0 {
                let i = fds.iter().position(|f| *f == Some(pfd.fd)).unwrap();
                if !drain(&p, pfd.fd, i, &mut chunk) {
                    fds[i] = None;
                }
            }
        }
    }
    *p.input.lock().unwrap() = None;
    let mut st = p.state.lock().unwrap();
    st.finished = true;
    if st.ended_at.is_none() {
        st.ended_at = Some(ops::now_unix());
    }
    drop(st);
    p.cv.notify_all();
}

fn stream_reply(s: &Stream, offset: u64, max: usize, finished: bool) -> Value {
    let r = s.read(offset, max);
    let end = r.offset + r.data.len() as u64;
    ObjBuilder::new()
        .with("data", Value::Str(b64::encode(&r.data)))
        .with("offset", Value::Int(r.offset as i64))
        .with("total", Value::Int(s.total() as i64))
        .with("truncated", Value::Bool(r.truncated))
        .with("eof", Value::Bool(finished && end >= s.total()))
        .build()
}

/// The exit fields every reply about a process carries.
fn exit_fields(b: ObjBuilder, st: &State) -> ObjBuilder {
    let code = match st.status {
        Some(s) if !st.timed_out => Value::Int(sys::exit_code_of(s) as i64),
        _ => Value::Null,
    };
    let signal = match st.status.and_then(sys::wait_status_signal) {
        Some(sig) => Value::Int(sig as i64),
        None => Value::Null,
    };
    b.with("exit_code", code).with("signal", signal).with("timed_out", Value::Bool(st.timed_out))
}

pub fn op_read(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    let offset = |name: &str| -> Result<u64, OpError> {
        match req.get("offsets") {
            None | Some(Value::Null) => Ok(0),
            Some(o) => Ok(num(o, name, 0.0)?.max(0.0) as u64),
        }
    };
    let (off_out, off_err) = (offset("stdout")?, offset("stderr")?);
    let wait = num(req, "wait", 0.0)?.clamp(0.0, MAX_WAIT_S);
    let max = num(req, "max_bytes", DEFAULT_READ as f64)?.max(0.0) as usize;
    let until = Instant::now() + Duration::from_secs_f64(wait);
    let mut st = p.state.lock().unwrap();
    while !(st.finished || st.out.total() > off_out || st.err.total() > off_err) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        st = p.cv.wait_timeout(st, left).unwrap().0;
    }
    let b = ObjBuilder::new()
        .with("pid", Value::Int(p.pid as i64))
        .with("stdout", stream_reply(&st.out, off_out, max, st.finished))
        .with("stderr", stream_reply(&st.err, off_err, max, st.finished))
        .with("pids_limited", Value::Bool(st.pids_limited))
        // Until every byte is buffered, so a client reading `while running` misses nothing.
        .with("running", Value::Bool(!st.finished));
    Ok(exit_fields(b, &st))
}

pub fn op_write(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    let data = match req.get("data") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Str(s)) => b64::decode(s).map_err(OpError::invalid)?,
        Some(_) => return Err(OpError::bad("TypeError: data must be a base64 string")),
    };
    let close = req.get_truthy("close").is_some();
    let closed = || OpError::new("stdin_closed", format!(
        "the stdin of process {} is closed (by an earlier write with close=True, or the process ended)", p.pid));
    let mut input = p.input.lock().unwrap();
    let Some(fd) = input.as_ref().map(|i| i.fd()) else { return Err(closed()) };
    let mut data = data;
    if close && p.master.is_some() {
        data.push(4); // a pty has no stdin of its own to close: ^D says end-of-input
    }
    let give_up = Instant::now() + WRITE_WAIT;
    let mut off = 0;
    while off < data.len() {
        let n = unsafe { sys::write(fd, data[off..].as_ptr() as *const _, data.len() - off) };
        if n > 0 {
            off += n as usize;
            continue;
        }
        match sys::errno() {
            sys::EINTR => {}
            sys::EAGAIN => {
                let left = give_up.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let mut pfd = sys::PollFd { fd, events: sys::POLLOUT, revents: 0 };
                unsafe { sys::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
            }
            _ => {
                // EPIPE: the process closed its stdin (or ended).
                *input = None;
                return Err(OpError::new("stdin_closed", format!("process {} closed its stdin", p.pid)));
            }
        }
    }
    if close {
        *input = None;
    }
    let written = if close && p.master.is_some() { off.min(data.len() - 1) } else { off };
    Ok(ObjBuilder::new().with("pid", Value::Int(p.pid as i64)).with("written", Value::Int(written as i64)))
}

pub fn op_kill(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    let sig = match req.get_truthy("signal") {
        None => sys::SIGKILL as f64,
        Some(_) => num(req, "signal", 9.0)?,
    };
    if !(1.0..=64.0).contains(&sig) {
        return Err(OpError::invalid(format!("signal must be between 1 and 64, not {}", sig)));
    }
    let reaped = p.state.lock().unwrap().status.is_some();
    // Once reaped, the pid (and so the group id) may be reused: signal only marked processes.
    let killed = if reaped && proc::marked_pids(&p.needle).is_empty() {
        0
    } else {
        proc::signal_tree(p.pid, &p.needle, sig as c_int)
    };
    Ok(ObjBuilder::new().with("pid", Value::Int(p.pid as i64)).with("killed", Value::Int(killed as i64)))
}

pub fn op_resize(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    let (cols, rows) = (win(req, "cols", 80.0)?, win(req, "rows", 24.0)?);
    let Some(m) = &p.master else {
        return Err(OpError::new("not_a_pty", format!("process {} has no terminal to resize: start it with pty=True", p.pid)));
    };
    sys::set_winsize(m.0, cols, rows);
    Ok(ObjBuilder::new().with("pid", Value::Int(p.pid as i64)))
}

fn entry(p: &Proc) -> Value {
    let st = p.state.lock().unwrap();
    let b = ObjBuilder::new()
        .with("pid", Value::Int(p.pid as i64))
        .with("argv", Value::Arr(p.argv.iter().map(|a| Value::Str(a.clone())).collect()))
        .with("cwd", Value::Str(p.cwd.clone()))
        .with("user", p.user.clone())
        .with("pty", Value::Bool(p.master.is_some()))
        // The main process not yet reaped.
        .with("running", Value::Bool(st.status.is_none() && !st.finished))
        .with("started_at", Value::Float(p.started_at))
        .with("ended_at", st.ended_at.map(Value::Float).unwrap_or(Value::Null))
        .with("stdout_total", Value::Int(st.out.total() as i64))
        .with("stderr_total", Value::Int(st.err.total() as i64));
    exit_fields(b, &st).build()
}

pub fn op_list(a: &Agent) -> OpResult {
    let mut procs: Vec<Arc<Proc>> = a.procs.pruned().values().cloned().collect();
    procs.sort_by(|x, y| x.started_at.partial_cmp(&y.started_at).unwrap_or(std::cmp::Ordering::Equal));
    Ok(ObjBuilder::new().with("processes", Value::Arr(procs.iter().map(|p| entry(p)).collect())))
}

pub fn op_status(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    let Value::Obj(fields) = entry(&p) else { unreachable!() };
    let mut b = ObjBuilder::new();
    for (k, v) in fields {
        b.set(&String::from_utf8_lossy(&k), v);
    }
    Ok(b)
}
