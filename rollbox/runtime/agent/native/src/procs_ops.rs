//! The `proc_*` ops other than `proc_start` (procs.rs): reads (long polls on the process's
//! Condvar), stdin writes, signals, terminal resizes, the list and one entry of it.

use libc::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::wire::{self, Obj, Value, ValueExt};
use crate::ops::{OpError, OpResult};
use crate::procs::{num, win, Proc, State};
use crate::proc;
use crate::retain::Stream;
use crate::sys;
use crate::Agent;

const DEFAULT_READ: usize = 1 << 20;
const MAX_WAIT_S: f64 = 10.0;
/// A write to a stdin nobody reads gives up after this long, replying with what it wrote.
const WRITE_WAIT: Duration = Duration::from_secs(5);

fn stream_reply(s: &Stream, offset: u64, max: usize, finished: bool) -> Value {
    let r = s.read(offset, max);
    let end = r.offset + r.data.len() as u64;
    Obj::new()
        .with("data", wire::b64encode(&r.data))
        .with("offset", Value::from(r.offset as i64))
        .with("total", Value::from(s.total() as i64))
        .with("truncated", Value::Bool(r.truncated))
        .with("eof", Value::Bool(finished && end >= s.total()))
        .build()
}

/// The exit fields every reply about a process carries.
fn exit_fields(b: Obj, st: &State) -> Obj {
    let code = match st.status {
        Some(s) if !st.timed_out => Value::from(sys::exit_code_of(s) as i64),
        _ => Value::Null,
    };
    let signal = match st.status.and_then(sys::wait_status_signal) {
        Some(sig) => Value::from(sig as i64),
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
    let b = Obj::new()
        .with("pid", Value::from(p.pid as i64))
        .with("stdout", stream_reply(&st.out, off_out, max, st.finished))
        .with("stderr", stream_reply(&st.err, off_err, max, st.finished))
        .with("pids_limited", Value::Bool(st.pids_limited))
        // Until every byte is buffered, so a client reading `while running` misses nothing.
        .with("running", Value::Bool(!st.finished));
    Ok(exit_fields(b, &st))
}

/// Writes what the pipe takes within WRITE_WAIT (a process that does not read must not hold
/// a request past the daemon's patience); `written` says how much, the caller sends the rest
/// again. `close` applies once everything was written.
pub fn op_write(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    let data = match req.get("data") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => wire::b64decode(s).map_err(OpError::invalid)?,
        Some(_) => return Err(OpError::bad("TypeError: data must be a base64 string")),
    };
    let close = req.get_truthy("close").is_some();
    let mut input = p.input.lock().unwrap();
    let fd = match input.as_ref().map(|i| i.fd()) {
        Some(fd) => fd,
        None => return Err(OpError::new("stdin_closed", format!(
            "the stdin of process {} is closed (by an earlier write with close=True, or the process ended)", p.pid))),
    };
    let give_up = Instant::now() + WRITE_WAIT;
    let mut off = 0;
    while off < data.len() {
        let n = unsafe { sys::write(fd, data[off..].as_ptr() as *const _, data.len() - off) };
        if n > 0 {
            off += n as usize;
            continue;
        }
        match if n == 0 { sys::EAGAIN } else { sys::errno() } {
            sys::EINTR => {}
            sys::EAGAIN => {
                let left = give_up.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let mut pfd = sys::PollFd { fd, events: sys::POLLOUT, revents: 0 };
                unsafe { sys::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
            }
            e => {
                // EPIPE: the process closed its stdin (or ended).
                *input = None;
                return Err(OpError::new("stdin_closed", format!("process {} closed its stdin (errno {})", p.pid, e)));
            }
        }
    }
    if close && off == data.len() {
        if p.master.is_some() {
            // A pty has no stdin of its own to close: ^D ends the terminal reader's input.
            unsafe { sys::write(fd, b"\x04".as_ptr() as *const _, 1) };
        }
        *input = None;
    }
    Ok(Obj::new().with("pid", Value::from(p.pid as i64)).with("written", Value::from(off as i64)))
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
    Ok(Obj::new().with("pid", Value::from(p.pid as i64)).with("killed", Value::from(killed as i64)))
}

pub fn op_resize(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    let (cols, rows) = (win(req, "cols", 80.0)?, win(req, "rows", 24.0)?);
    let m = match &p.master {
        Some(m) => m,
        None => return Err(OpError::new("not_a_pty", format!("process {} has no terminal to resize: start it with pty=True", p.pid))),
    };
    sys::set_winsize(m.0, cols, rows);
    Ok(Obj::new().with("pid", Value::from(p.pid as i64)))
}

fn entry(p: &Proc) -> Value {
    let st = p.state.lock().unwrap();
    let b = Obj::new()
        .with("pid", Value::from(p.pid as i64))
        .with("argv", Value::Array(p.argv.iter().map(|a| wire::bytes(a)).collect()))
        .with("cwd", wire::bytes(&p.cwd))
        .with("user", p.user.clone())
        .with("pty", Value::Bool(p.master.is_some()))
        // The main process not yet reaped.
        .with("running", Value::Bool(st.status.is_none() && !st.finished))
        .with("started_at", Value::from(p.started_at))
        .with("ended_at", st.ended_at.map(Value::from).unwrap_or(Value::Null))
        .with("stdout_total", Value::from(st.out.total() as i64))
        .with("stderr_total", Value::from(st.err.total() as i64));
    exit_fields(b, &st).build()
}

pub fn op_list(a: &Agent) -> OpResult {
    let mut procs: Vec<Arc<Proc>> = a.procs.pruned().values().cloned().collect();
    procs.sort_by(|x, y| x.started_at.partial_cmp(&y.started_at).unwrap_or(std::cmp::Ordering::Equal));
    Ok(Obj::new().with("processes", Value::Array(procs.iter().map(|p| entry(p)).collect())))
}

pub fn op_status(a: &Agent, req: &Value) -> OpResult {
    let p = a.procs.get(req)?;
    match entry(&p) {
        Value::Object(fields) => Ok(Obj(fields)),
        _ => unreachable!("entry() makes an object"),
    }
}
