//! The requests the agent serves: exec, spawn, files, identity, ping (protocol 2, as agent.py).

use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::jail;
use crate::wire::{self, Obj, Value, ValueExt};
use crate::proc::{self, Launch, Stdin};
use crate::sys::{self, Fd};
use crate::Agent;

pub const PROTOCOL: i64 = 2;
pub(crate) const MARK: &str = "ROLLBOX_EXEC_MARK";
/// Output kept per stream when a request does not say (bytes); the rest is read and dropped.
const DEFAULT_MAX_OUTPUT: u64 = 4 * 1024 * 1024;
const DEFAULT_MAX_READ: u64 = 64 * 1024 * 1024;
/// After the main process exits, background children may hold its pipes: stop reading then.
const AFTER_EXIT: Duration = Duration::from_millis(50);
/// How long a tree left behind the pipes must keep its size before the exec returns without
/// it (a background server); a fork bomb grows in that time (ops.rs `op_exec`).
const STABLE: Duration = Duration::from_millis(200);
/// How long a running exec's tree may sit at its pids limit before it counts as a fork bomb.
const LIMIT_HOLD: Duration = Duration::from_millis(300);

/// A failed request: `kind` is the reply's `error` code (the daemon maps it to an error class).
pub struct OpError {
    pub kind: &'static str,
    pub message: String,
}

impl OpError {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        OpError { kind, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }

    /// A malformed request (Python's KeyError/TypeError): a generic agent error.
    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Self::new("agent_error", message)
    }

    /// An OS error on `path`, worded as Python words it.
    pub fn io(e: io::Error, path: &[u8]) -> Self {
        let text = e.to_string();
        let text = match text.rfind(" (os error") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        let p = String::from_utf8_lossy(path);
        let errno = e.raw_os_error().unwrap_or(0);
        let message = if path.is_empty() { format!("[Errno {}] {}", errno, text) } else { format!("[Errno {}] {}: '{}'", errno, text, p) };
        let kind = match errno {
            2 => "not_found",
            21 => "is_a_directory",
            20 => "not_a_directory",
            1 | 13 => "permission_denied",
            _ => return OpError::new("agent_error", format!("OSError: {}", message)),
        };
        OpError::new(kind, message)
    }
}

pub(crate) type OpResult = Result<Obj, OpError>;

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

fn cstr(b: &[u8]) -> Result<CString, OpError> {
    CString::new(b).map_err(|_| OpError::invalid("embedded null byte"))
}

pub(crate) fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

pub(crate) fn required<'a>(req: &'a Value, key: &str) -> Result<&'a Value, OpError> {
    req.get(key).ok_or_else(|| OpError::bad(format!("KeyError: '{}'", key)))
}

pub(crate) fn str_list(req: &Value, key: &str) -> Result<Vec<Vec<u8>>, OpError> {
    match required(req, key)? {
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|v| v.bytes().ok_or_else(|| OpError::bad(format!("TypeError: {} must be a list of strings", key))))
            .collect(),
        Value::Array(_) => Err(OpError::bad(format!("IndexError: {} is empty", key))),
        _ => Err(OpError::bad(format!("TypeError: {} must be a list of strings", key))),
    }
}

/// `req[key]` as a string map: {} when missing or null.
fn str_map(req: &Value, key: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>, OpError> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((wire::to_bytes(k), wire::to_bytes(s))),
                _ => Err(OpError::bad(format!("TypeError: {} values must be strings", key))),
            })
            .collect(),
        Some(_) => Err(OpError::bad(format!("TypeError: {} must be an object", key))),
    }
}

fn opt_bytes(req: &Value, key: &str) -> Result<Option<Vec<u8>>, OpError> {
    match req.get_truthy(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(wire::to_bytes(s))),
        Some(_) => Err(OpError::bad(format!("TypeError: {} must be a string", key))),
    }
}

fn path_arg(req: &Value) -> Result<Vec<u8>, OpError> {
    match required(req, "path")? {
        Value::String(p) if p.starts_with('/') && !p.contains('\0') => Ok(wire::to_bytes(p)),
        v => Err(OpError::invalid(format!("path {} must be absolute, e.g. /work/a.py", String::from_utf8_lossy(&wire::to_vec(v))))),
    }
}

pub(crate) fn env_set(env: &mut Vec<(Vec<u8>, Vec<u8>)>, k: &[u8], v: &[u8]) {
    match env.iter_mut().find(|(ek, _)| ek == k) {
        Some(slot) => slot.1 = v.to_vec(),
        None => env.push((k.to_vec(), v.to_vec())),
    }
}

pub(crate) fn env_get<'a>(env: &'a [(Vec<u8>, Vec<u8>)], k: &[u8]) -> Option<&'a [u8]> {
    env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_slice())
}

/// The agent's environment, then the identity's, then the request's.
pub(crate) fn command_env(a: &Agent, req: &Value) -> Result<Vec<(Vec<u8>, Vec<u8>)>, OpError> {
    let mut env = a.base_env.clone();
    for (k, v) in a.identity.lock().unwrap().iter() {
        env_set(&mut env, k, v);
    }
    for (k, v) in str_map(req, "env")? {
        env_set(&mut env, &k, &v);
    }
    Ok(env)
}

fn env_cstrings(env: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<CString>, OpError> {
    env.iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
            kv.push(b'=');
            kv.extend_from_slice(v);
            cstr(&kv)
        })
        .collect()
}

/// The file `name` names, searched on the command's own PATH (as Python's subprocess does).
fn resolve_program(name: &[u8], path_var: Option<&[u8]>, cwd: &[u8]) -> Option<Vec<u8>> {
    if name.contains(&b'/') {
        return Some(name.to_vec());
    }
    if name.is_empty() {
        return None;
    }
    for dir in path_var.unwrap_or(b"/bin:/usr/bin").split(|&c| c == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let mut cand = dir.to_vec();
        cand.push(b'/');
        cand.extend_from_slice(name);
        let mut check = Vec::new();
        if !cand.starts_with(b"/") {
            check.extend_from_slice(cwd);
            check.push(b'/');
        }
        check.extend_from_slice(&cand);
        if let Ok(m) = fs::metadata(os(&check)) {
            if !m.is_dir() {
                return Some(cand);
            }
        }
    }
    None
}

/// What a new process runs and where: resolved before anything is started.
pub(crate) struct Prepared {
    pub(crate) path: CString,
    pub(crate) argv: Vec<CString>,
    pub(crate) env: Vec<CString>,
    pub(crate) cwd: CString,
    pub(crate) creds: Option<(u32, u32)>,
}

pub(crate) enum Refusal {
    Exit(i64, String),
    Error(OpError),
}

impl From<OpError> for Refusal {
    fn from(e: OpError) -> Self {
        Refusal::Error(e)
    }
}

pub(crate) fn prepare(req: &Value, env: &[(Vec<u8>, Vec<u8>)]) -> Result<Prepared, Refusal> {
    let argv = str_list(req, "argv")?;
    let cwd = match opt_bytes(req, "cwd")? {
        Some(c) => c.to_vec(),
        // No cwd asked for: HOME, or / when the image has no such directory (as Docker does).
        None => env_get(env, b"HOME")
            .filter(|h| !h.is_empty() && fs::metadata(os(h)).map(|m| m.is_dir()).unwrap_or(false))
            .unwrap_or(b"/")
            .to_vec(),
    };
    let user = match req.get("user") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => wire::to_bytes(s),
        Some(v) => wire::to_vec(v),
    };
    let creds = proc::resolve_user(&user).map_err(OpError::invalid)?;
    let argv_c = argv.iter().map(|a| cstr(a)).collect::<Result<Vec<_>, _>>()?;
    let env_c = env_cstrings(env)?;
    let cwd_c = cstr(&cwd)?;
    let cwd_text = String::from_utf8_lossy(&cwd).to_string();
    let name = String::from_utf8_lossy(&argv[0]).to_string();
    match fs::metadata(os(&cwd)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Refusal::Exit(126, format!("rollbox: no such working directory: {}\n", cwd_text)))
        }
        Ok(m) if !m.is_dir() => {
            return Err(Refusal::Exit(126, format!("rollbox: cannot run '{}': [Errno 20] Not a directory: '{}'\n", name, cwd_text)))
        }
        _ => {}
    }
    let path = match resolve_program(&argv[0], env_get(env, b"PATH"), &cwd) {
        Some(path) => path,
        None => return Err(Refusal::Exit(127, format!("rollbox: command not found: {}\n", name))),
    };
    Ok(Prepared { path: cstr(&path)?, argv: argv_c, env: env_c, cwd: cwd_c, creds })
}

pub(crate) fn launch_error(e: io::Error, argv0: &[u8]) -> (i64, String) {
    let name = String::from_utf8_lossy(argv0);
    if e.raw_os_error() == Some(sys::ENOENT) {
        (127, format!("rollbox: command not found: {}\n", name))
    } else {
        (126, format!("rollbox: cannot run '{}': {}\n", name, OpError::io(e, b"").message))
    }
}

fn spawn_failure(code: i64, message: &str, start: Instant) -> Obj {
    Obj::new()
        .with("exit_code", Value::from(code))
        .with("signal", Value::Null)
        .with("stdout", Value::from(""))
        .with("stderr", wire::b64encode(message.as_bytes()))
        .with("stdout_bytes", Value::from(0))
        .with("stderr_bytes", Value::from(message.len() as i64))
        .with("truncated", Value::Bool(false))
        .with("timed_out", Value::Bool(false))
        .with("duration_s", Value::from(start.elapsed().as_secs_f64()))
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{:02x}", x)).collect()
}

pub fn op_exec(a: &Agent, req: &Value) -> OpResult {
    let start = Instant::now();
    let timeout = req.get_truthy("timeout").map(|v| v.num().ok_or_else(|| OpError::bad("TypeError: timeout must be a number"))).transpose()?;
    let cap = match req.get("max_output") {
        None | Some(Value::Null) => DEFAULT_MAX_OUTPUT, // 0 keeps nothing (only the byte counts)
        Some(v) => v.num().ok_or_else(|| OpError::bad("TypeError: max_output must be a number"))?.max(0.0) as u64,
    };
    let stdin_data = match req.get("stdin") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(wire::b64decode(s).map_err(OpError::invalid)?),
        Some(_) => return Err(OpError::bad("TypeError: stdin must be a base64 string")),
    };
    // Random, not the request id: a process must not learn which reply it could try to forge.
    let mut token = [0u8; 12];
    sys::random(&mut token);
    let mark = format!("{}-{}", unsafe { sys::getpid() }, hex(&token));
    let mut env = command_env(a, req)?;
    env_set(&mut env, MARK.as_bytes(), mark.as_bytes());
    let needle = format!("{}={}", MARK, mark).into_bytes();
    let p = match prepare(req, &env) {
        Ok(p) => p,
        Err(Refusal::Exit(code, msg)) => return Ok(spawn_failure(code, &msg, start)),
        Err(Refusal::Error(e)) => return Err(e),
    };

    let io_fail = |e: io::Error| OpError::new("agent_error", format!("OSError: {}", e));
    let (out_r, out_w) = sys::pipe().map_err(io_fail)?;
    let (out_r, out_w) = (Fd(out_r), Fd(out_w));
    let (err_r, err_w) = sys::pipe().map_err(io_fail)?;
    let (err_r, err_w) = (Fd(err_r), Fd(err_w));
    let (in_r, in_w) = match &stdin_data {
        Some(_) => {
            let (r, w) = sys::pipe().map_err(io_fail)?;
            (Some(Fd(r)), Some(Fd(w)))
        }
        None => (None, None),
    };
    let launch = Launch {
        path: p.path,
        argv: p.argv,
        env: p.env,
        cwd: p.cwd,
        stdin: match &in_r {
            Some(fd) => Stdin::Fd(fd.0),
            None => Stdin::DevNull,
        },
        stdout: out_w.0,
        stderr: err_w.0,
        creds: p.creds,
    };
    // The exec's own cgroups: its whole tree, whatever it does to its session or environment.
    let jail = jail::Jail::create(proc::exec_pids_max(), &needle);
    let started = a.reaper.start(true, || match &jail {
        Some(j) => j.spawn_inside(|| proc::launch(&launch)),
        None => {
            jail::note_unjailed();
            proc::launch(&launch)
        }
    });
    drop((out_w, err_w, in_r));
    let (pid, waiter) = match started {
        Ok((pid, Some(w))) => (pid, w),
        Ok((_, None)) => unreachable!(),
        Err(e) => {
            if let Some(j) = jail {
                j.release(&needle);
            }
            let (code, msg) = launch_error(e, launch.argv[0].as_bytes());
            return Ok(spawn_failure(code, &msg, start));
        }
    };

    for fd in [&out_r, &err_r] {
        sys::set_nonblocking(fd.0, true);
    }
    let mut pipes = [Some(out_r), Some(err_r)];
    let mut bufs: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut totals = [0u64; 2];
    let mut feed = match (in_w, stdin_data) {
        (Some(fd), Some(data)) => {
            sys::set_nonblocking(fd.0, true);
            Some((fd, data, 0usize))
        }
        _ => None,
    };
    let deadline = timeout.filter(|t| *t > 0.0).map(|t| start + Duration::from_secs_f64(t.min(1e9)));
    let mut exited_at: Option<Instant> = None;
    let mut grown = 0usize; // the most processes seen behind the pipes after the main process exited
    let mut at_exit: Option<usize> = None; // tasks at the first look after the exit
    let mut grew_at = start; // when `grown` last rose
    let mut forking = false; // the tree grew after the main process exited
    let mut stopped_at: Option<usize> = None; // processes when a bomb's tree was last SIGSTOPped
    let mut next_look = start; // when the running tree's size is next read (with a deadline)
    let mut full_since: Option<Instant> = None; // since when it has been at its pids limit
    let mut seen = 0usize; // the most processes this loop saw in the exec's cgroup
    let mut bomb = false; // a fork bomb (in processes: half its pids limit, or a quarter grown after the exit)
    let mut timed_out = false;
    let mut tree = 0usize;
    let mut chunk = vec![0u8; 65536];

    // Reads what one pipe has: keeps what fits under the cap, counts the rest. False at EOF.
    let take = |fd: i32, buf: &mut Vec<u8>, total: &mut u64, chunk: &mut [u8]| -> bool {
        loop {
            let n = unsafe { sys::read(fd, chunk.as_mut_ptr() as *mut _, chunk.len()) };
            if n > 0 {
                let n = n as usize;
                *total += n as u64;
                let room = (cap as usize).saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
                if n < chunk.len() {
                    return true;
                }
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
    };

    loop {
        let now = Instant::now();
        let done = waiter.status().is_some();
        if done && exited_at.is_none() {
            exited_at = Some(now);
        }
        let open = pipes.iter().any(|p| p.is_some());
        if deadline.is_some() && exited_at.is_none() && now >= next_look {
            // A tree at its pids limit for LIMIT_HOLD spins on failed forks (a fork bomb that
            // never gives up): frozen until its deadline's kill, as below, so the agent's
            // threads are not starved into seeing the deadline seconds late.
            next_look = now + Duration::from_millis(50);
            let n = jail.as_ref().map(|j| jail::task_count(&j.name)).unwrap_or(0);
            let max = proc::exec_pids_max();
            // Processes, not tasks: one program's many threads at the limit is no bomb.
            let procs = if max > 0 && n + 2 >= max { jail.as_ref().map(|j| jail::count_members(&j.name)).unwrap_or(0) } else { 0 };
            seen = seen.max(procs);
            if max > 0 && n + 2 >= max && procs * 2 >= max {
                let since = *full_since.get_or_insert(now);
                if now.duration_since(since) >= LIMIT_HOLD && stopped_at != Some(procs) {
                    bomb = true;
                    proc::signal_tree(pid, &needle, sys::SIGSTOP);
                    stopped_at = Some(procs);
                }
            } else {
                full_since = None;
            }
        }
        if let Some(t) = exited_at {
            if !open {
                break;
            }
            if now.duration_since(t) >= AFTER_EXIT {
                // What still holds the pipes is normally a background server: return once the
                // tree has stayed the same size for STABLE. A tree that forks after its main
                // process exited, or has ever held half its pids limit, is a fork bomb whose
                // shell exited (`:(){ :|:& };:`): this exec's work, ended by its timeout, or
                // (without one, once bomb-sized) killed now. Forks inside gVisor are slow (a
                // bomb added ~25 tasks a second here), so one look 50 ms after the exit, as
                // before, saw no growth and returned; the bomb then churned on at its limit
                // (bash retries failed forks for ~15 s) and stalled the sandbox's next
                // commands for 10-60 s (gh-19). "Ever": a churning bomb's count dips.
                // Processes, not tasks (pids.current counts threads): a background server
                // that starts its thread pool is not forking.
                let n = jail.as_ref().map(|j| jail::count_members(&j.name)).unwrap_or(0);
                let tasks = jail.as_ref().map(|j| jail::task_count(&j.name)).unwrap_or(0);
                let max = proc::exec_pids_max();
                seen = seen.max(n);
                let base = *at_exit.get_or_insert(n);
                if n > grown.max(base) {
                    grown = n;
                    grew_at = now;
                }
                forking = forking || grown > base + 1;
                // At its limit, mostly in processes: forks fail; only a bomb gets there.
                let full = max > 0 && tasks + 2 >= max && n * 2 >= max;
                if full && deadline.is_none() {
                    bomb = true;
                    tree = proc::kill_tree(pid, &needle);
                    break;
                }
                if full || (deadline.is_some() && forking && n * 4 >= max) {
                    bomb = true; // reported pids_limited, though frozen short of the limit
                }
                if bomb && stopped_at != Some(n) {
                    // A quarter of the limit, grown after the exit: frozen until its
                    // deadline's kill (what a forking tree behind the pipes gets anyway). A
                    // bomb churning on to its limit starved the agent's own threads, which
                    // then saw the deadline seconds late.
                    proc::signal_tree(pid, &needle, sys::SIGSTOP);
                    stopped_at = Some(n);
                }
                let still = now.duration_since(grew_at.max(t)) < STABLE;
                if !(bomb || (deadline.is_some() && forking) || still) {
                    break;
                }
            }
        }
        if let Some(d) = deadline {
            if now >= d && (!done || forking || bomb) {
                timed_out = true;
                tree = proc::kill_tree(pid, &needle);
                break;
            }
        }
        if !open && feed.is_none() {
            // Nothing left to read: wait for the exit, or the deadline.
            waiter.wait(deadline.map(|d| d.saturating_duration_since(now)));
            continue;
        }
        let mut wait = Duration::from_millis(50);
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(now));
        }
        if let Some(t) = exited_at {
            // Looks every 25 ms once past AFTER_EXIT (a pids.current read each).
            wait = wait.min((t + AFTER_EXIT).saturating_duration_since(now).max(Duration::from_millis(25)));
        }
        let mut pfds: Vec<sys::PollFd> = Vec::with_capacity(3);
        for p in pipes.iter().flatten() {
            pfds.push(sys::PollFd { fd: p.0, events: sys::POLLIN, revents: 0 });
        }
        if let Some((fd, _, _)) = &feed {
            pfds.push(sys::PollFd { fd: fd.0, events: sys::POLLOUT, revents: 0 });
        }
        let ms = (wait.as_micros() as i64 + 999) / 1000;
        let n = unsafe { sys::poll(pfds.as_mut_ptr(), pfds.len() as _, ms as i32) };
        if n <= 0 {
            continue;
        }
        for pfd in &pfds {
            if pfd.revents == 0 {
                continue;
            }
            if let Some(i) = pipes.iter().position(|p| p.as_ref().map(|f| f.0) == Some(pfd.fd)) {
                if !take(pfd.fd, &mut bufs[i], &mut totals[i], &mut chunk) {
                    pipes[i] = None;
                }
            } else if let Some((fd, data, off)) = &mut feed {
                let mut finished = pfd.revents & (sys::POLLERR | sys::POLLHUP | sys::POLLNVAL) != 0;
                if !finished {
                    let w = unsafe { sys::write(fd.0, data[*off..].as_ptr() as *const _, data.len() - *off) };
                    if w > 0 {
                        *off += w as usize;
                        finished = *off >= data.len();
                    } else if w < 0 && !matches!(sys::errno(), sys::EAGAIN | sys::EINTR) {
                        finished = true; // EPIPE: the command closed its stdin
                    } else if data.is_empty() {
                        finished = true;
                    }
                }
                if finished {
                    feed = None;
                }
            }
        }
    }
    drop(feed);
    // A forking tree that let go of the pipes by itself while the watcher saw it at half its
    // limit is a bomb that collapsed (bash gives its failed forks up): reported, and what it
    // may have left churning (retrying forks) is killed. A fork bomb leaves nothing behind.
    let max = proc::exec_pids_max();
    let peak = jail.as_ref().map(|j| jail::peak(&j.name)).unwrap_or(0);
    if !timed_out && forking && pipes.iter().all(|p| p.is_none()) && max > 0 && peak * 2 >= max {
        bomb = true;
    }
    if timed_out || bomb {
        // Make sure no process of this exec is left (some may have started meanwhile).
        tree = tree.max(proc::kill_tree(pid, &needle));
    }
    let status = waiter.wait(if timed_out || bomb { Some(Duration::from_secs(5)) } else { None });
    if status.is_none() {
        a.reaper.forget(pid);
    }
    // Drain what is buffered.
    for i in 0..2 {
        if let Some(fd) = &pipes[i] {
            take(fd.0, &mut bufs[i], &mut totals[i], &mut chunk);
        }
    }
    drop(pipes);
    let oom_killed = jail.as_ref().map(|j| jail::was_oom_killed(&j.name)).unwrap_or(false);
    // A bomb churns (failed forks exit, retries fork again): the most tasks the watcher saw
    // says more than the count at the kill.
    let pids_limited = bomb || (timed_out && (tree >= proc::pids_report_at() || peak * 4 >= max * 3));
    if let Some(j) = jail {
        j.release(&needle);
    }
    let [out, err] = bufs;
    Ok(Obj::new()
        .with("exit_code", match status {
            Some(s) if !timed_out => Value::from(sys::exit_code_of(s) as i64),
            _ => Value::Null,
        })
        .with("signal", match status.and_then(sys::wait_status_signal) {
            Some(sig) => Value::from(sig as i64),
            None => Value::Null,
        })
        .with("stdout", wire::b64encode(&out))
        .with("stderr", wire::b64encode(&err))
        .with("stdout_bytes", Value::from(totals[0] as i64))
        .with("stderr_bytes", Value::from(totals[1] as i64))
        .with("truncated", Value::Bool(totals[0] > cap || totals[1] > cap))
        .with("timed_out", Value::Bool(timed_out))
        .with("pids_limited", Value::Bool(pids_limited))
        // The memory watcher (memwatch.rs) SIGKILLed this exec's tree: exit 137, as Linux's OOM killer.
        .with("oom_killed", Value::Bool(oom_killed && !timed_out))
        .with("duration_s", Value::from(start.elapsed().as_secs_f64())))
}

/// Starts a long-running process (an image's entrypoint) without waiting for it; its output
/// goes to `log` (default /dev/null). Replies with its pid.
pub fn op_spawn(a: &Agent, req: &Value) -> OpResult {
    let env = command_env(a, req)?;
    let argv0 = str_list(req, "argv")?.remove(0);
    let what = String::from_utf8_lossy(&argv0).to_string();
    let p = match prepare(req, &env) {
        Ok(p) => p,
        Err(Refusal::Exit(_, msg)) => {
            return Err(OpError::invalid(format!("cannot start ['{}']: {}", what, msg.trim_end().trim_start_matches("rollbox: "))))
        }
        Err(Refusal::Error(e)) => return Err(e),
    };
    let log = opt_bytes(req, "log")?.unwrap_or_else(|| b"/dev/null".to_vec());
    let out = fs::OpenOptions::new().append(true).create(true).open(os(&log))
        .map_err(|e| OpError::invalid(format!("cannot start ['{}']: {}", what, OpError::io(e, &log).message)))?;
    use std::os::unix::io::AsRawFd;
    let launch = Launch {
        path: p.path,
        argv: p.argv,
        env: p.env,
        cwd: p.cwd,
        stdin: Stdin::DevNull,
        stdout: out.as_raw_fd(),
        stderr: out.as_raw_fd(),
        creds: p.creds,
    };
    // Cgroups of its own, kept for the sandbox's life (the root ones are the agent's: jail.rs);
    // not a returned exec's, so nothing reaps its processes as a bomb's leftovers.
    static MAINS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let mark = format!("ROLLBOX_MAIN={}", MAINS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)).into_bytes();
    let jail = jail::Jail::create(0, &mark);
    let started = a.reaper.start(false, || match &jail {
        Some(j) => j.spawn_inside(|| proc::launch(&launch)),
        None => {
            jail::note_unjailed();
            proc::launch(&launch)
        }
    });
    let (pid, _) = match started {
        Ok(s) => s,
        Err(e) => {
            if let Some(j) = jail {
                j.release(&mark);
            }
            return Err(OpError::invalid(format!("cannot start ['{}']: {}", what, OpError::io(e, b"").message)));
        }
    };
    Ok(Obj::new().with("pid", Value::from(pid as i64)))
}

fn parent(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&c| c == b'/') {
        Some(0) => b"/",
        Some(i) => &path[..i],
        None => b"",
    }
}

pub fn op_write_file(req: &Value) -> OpResult {
    let path = match required(req, "path")? {
        Value::String(p) => wire::to_bytes(p),
        _ => return Err(OpError::bad("TypeError: path must be a string")),
    };
    if path.contains(&0) {
        return Err(OpError::invalid("embedded null byte"));
    }
    if let Some(token) = opt_bytes(req, "upload")? {
        return write_part(req, &path, &token);
    }
    let dir = parent(&path);
    if !dir.is_empty() {
        fs::create_dir_all(os(dir)).map_err(|e| OpError::io(e, dir))?;
    }
    let data = match required(req, "data")? {
        Value::String(s) => wire::b64decode(s).map_err(OpError::invalid)?,
        _ => return Err(OpError::bad("TypeError: data must be a base64 string")),
    };
    let mode = match req.get_truthy("mode") {
        None => 0o644,
        Some(v) => v.num().ok_or_else(|| OpError::bad("TypeError: mode must be an integer"))? as u32,
    };
    let id = match req.get("id") {
        Some(Value::Number(i)) if i.is_i64() => i.to_string(),
        Some(v) => String::from_utf8_lossy(&wire::to_vec(v)).to_string(),
        None => "0".to_string(),
    };
    let mut tmp = path.clone();
    tmp.extend_from_slice(format!(".rollbox-tmp-{}", id).as_bytes());
    let result = (|| -> Result<(), OpError> {
        let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o666).open(os(&tmp))
            .map_err(|e| OpError::io(e, &tmp))?;
        f.write_all(&data).map_err(|e| OpError::io(e, &tmp))?;
        drop(f);
        fs::set_permissions(os(&tmp), fs::Permissions::from_mode(mode)).map_err(|e| OpError::io(e, &tmp))?;
        fs::rename(os(&tmp), os(&path)).map_err(|e| OpError::io(e, &path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(os(&tmp));
    }
    result?;
    Ok(Obj::new().with("size", Value::from(data.len() as i64)))
}

/// One part of a streamed upload (the daemon's PUT .../files/content): part 0 creates the
/// hidden temporary file, later parts append, the last one sets the mode and renames it over
/// `path` (the file appears whole or not at all); `abort` removes it. As agent.py's _write_part.
fn write_part(req: &Value, path: &[u8], token: &[u8]) -> OpResult {
    if !token.iter().all(|c| c.is_ascii_alphanumeric()) {
        return Err(OpError::invalid("upload token must be alphanumeric"));
    }
    let mut tmp = path.to_vec();
    tmp.extend_from_slice(b".rollbox-upload-");
    tmp.extend_from_slice(token);
    if req.get_truthy("abort").is_some() {
        let _ = fs::remove_file(os(&tmp));
        return Ok(Obj::new().with("size", Value::from(0)));
    }
    let data = match req.get("data") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => wire::b64decode(s).map_err(OpError::invalid)?,
        Some(_) => return Err(OpError::bad("TypeError: data must be a base64 string")),
    };
    let part = match req.get_truthy("part") {
        None => 0,
        Some(v) => v.num().ok_or_else(|| OpError::bad("TypeError: part must be an integer"))? as u64,
    };
    let mode = match req.get_truthy("mode") {
        None => 0o644,
        Some(v) => v.num().ok_or_else(|| OpError::bad("TypeError: mode must be an integer"))? as u32,
    };
    let last = req.get_truthy("last").is_some();
    let result = (|| -> Result<(), OpError> {
        if part == 0 {
            let dir = parent(path);
            if !dir.is_empty() {
                fs::create_dir_all(os(dir)).map_err(|e| OpError::io(e, dir))?;
            }
        }
        let mut f = fs::OpenOptions::new().write(true).create(true).truncate(part == 0).append(part != 0)
            .mode(0o666).open(os(&tmp)).map_err(|e| OpError::io(e, &tmp))?;
        f.write_all(&data).map_err(|e| OpError::io(e, &tmp))?;
        drop(f);
        if last {
            fs::set_permissions(os(&tmp), fs::Permissions::from_mode(mode)).map_err(|e| OpError::io(e, &tmp))?;
            fs::rename(os(&tmp), os(path)).map_err(|e| OpError::io(e, path))?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(os(&tmp));
    }
    result?;
    Ok(Obj::new().with("size", Value::from(data.len() as i64)))
}

pub fn op_read_file(req: &Value) -> OpResult {
    let path = path_arg(req)?;
    let limit = match req.get_truthy("max_bytes") {
        None => DEFAULT_MAX_READ,
        Some(v) => v.num().ok_or_else(|| OpError::bad("TypeError: max_bytes must be an integer"))?.max(0.0) as u64,
    };
    let p = String::from_utf8_lossy(&path).to_string();
    // Regular files only: reading a FIFO, a device or /proc/self/fd/0 (our own channel!)
    // could block forever or never end.
    let f = fs::OpenOptions::new().read(true).custom_flags(sys::O_NONBLOCK).open(os(&path))
        .map_err(|e| OpError::io(e, &path))?;
    let st = f.metadata().map_err(|e| OpError::io(e, &path))?;
    if st.is_dir() {
        return Err(OpError::new("is_a_directory", format!("{} is a directory", p)));
    }
    if !st.is_file() {
        return Err(OpError::invalid(format!("{} is not a regular file", p)));
    }
    if let Some(off) = req.get_truthy("offset").or_else(|| match req.get("offset") {
        Some(v @ Value::Number(_)) if v.as_i64() == Some(0) => Some(v),
        _ => None,
    }) {
        // A streamed download: one range, no size limit.
        let off = off.num().ok_or_else(|| OpError::bad("TypeError: offset must be an integer"))?.max(0.0) as u64;
        let len = match req.get_truthy("length") {
            None => 4 << 20,
            Some(v) => v.num().ok_or_else(|| OpError::bad("TypeError: length must be an integer"))?.max(0.0) as usize,
        };
        use std::os::unix::fs::FileExt;
        sys::set_nonblocking(f.as_raw_fd(), false);
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = f.read_at(&mut buf[got..], off + got as u64).map_err(|e| OpError::io(e, &path))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        buf.truncate(got);
        return Ok(Obj::new().with("data", wire::b64encode(&buf)).with("size", Value::from(st.len() as i64)));
    }
    if st.len() > limit {
        return Err(OpError::invalid(format!("file {} is {} bytes, over the {}-byte read limit", p, st.len(), limit)));
    }
    use std::os::unix::io::AsRawFd;
    sys::set_nonblocking(f.as_raw_fd(), false);
    let mut data = Vec::with_capacity(st.len() as usize);
    f.take(limit + 1).read_to_end(&mut data).map_err(|e| OpError::io(e, &path))?;
    Ok(Obj::new().with("data", wire::b64encode(&data)))
}

pub fn op_list_files(req: &Value) -> OpResult {
    let path = path_arg(req)?;
    let dir = fs::read_dir(os(&path)).map_err(|e| OpError::io(e, &path))?;
    let mut entries: Vec<(Vec<u8>, Value)> = Vec::new();
    for e in dir {
        let e = e.map_err(|e| OpError::io(e, &path))?;
        let name = e.file_name().as_bytes().to_vec();
        let mut full = path.clone();
        if !full.ends_with(b"/") {
            full.push(b'/');
        }
        full.extend_from_slice(&name);
        let st = match fs::symlink_metadata(os(&full)) { Ok(st) => st, _ => continue }; // gone meanwhile
        let mtime = st.mtime() as f64 + st.mtime_nsec() as f64 / 1e9;
        let entry = Obj::new()
            .with("name", wire::bytes(&name))
            .with("path", wire::bytes(&full))
            .with("is_dir", Value::Bool(st.is_dir()))
            .with("size", Value::from(st.size() as i64))
            .with("mode", Value::from(st.mode() as i64))
            .with("mtime", Value::from(mtime))
            .build();
        entries.push((name, entry));
    }
    entries.sort_by(|x, y| x.0.cmp(&y.0));
    Ok(Obj::new().with("entries", Value::Array(entries.into_iter().map(|(_, v)| v).collect())))
}

/// True when `path` (absolute) names the root directory, however it is spelled ("//", "/a/..").
fn is_root(path: &[u8]) -> bool {
    let mut depth: Vec<&[u8]> = Vec::new();
    for part in path.split(|&c| c == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                depth.pop();
            }
            p => depth.push(p),
        }
    }
    depth.is_empty()
}

pub fn op_remove(req: &Value) -> OpResult {
    let path = path_arg(req)?;
    if is_root(&path) {
        return Err(OpError::invalid("refusing to remove /"));
    }
    let link = fs::symlink_metadata(os(&path)).map(|m| m.file_type().is_symlink()).unwrap_or(false);
    let is_dir = !link && fs::metadata(os(&path)).map(|m| m.is_dir()).unwrap_or(false);
    if is_dir {
        fs::remove_dir_all(os(&path)).map_err(|e| OpError::io(e, &path))?;
    } else {
        fs::remove_file(os(&path)).map_err(|e| OpError::io(e, &path))?;
    }
    Ok(Obj::new())
}

/// Per-copy identity after a restore/fork: env for later execs, fresh entropy, hostname.
pub fn op_identity(a: &Agent, req: &Value) -> OpResult {
    let env = str_map(req, "env")?;
    *a.identity.lock().unwrap() = env;
    let restored = opt_bytes(req, "entropy")?.is_some();
    if let Some(seed) = req.get_truthy("entropy").and_then(Value::as_str) {
        // Mixing fresh host entropy in; gVisor's getrandom already reads host entropy.
        if let Ok(bytes) = wire::b64decode(seed) {
            if let Ok(mut f) = fs::OpenOptions::new().write(true).open("/dev/urandom") {
                let _ = f.write_all(&bytes);
            }
        }
    }
    if let Some(host) = opt_bytes(req, "hostname")? {
        unsafe { sys::sethostname(host.as_ptr() as *const _, host.len()) };
        // The copy's /etc/hostname still names its source.
        if fs::metadata("/etc/hostname").map(|m| m.is_file()).unwrap_or(false) {
            let mut line = host.to_vec();
            line.push(b'\n');
            let _ = fs::write("/etc/hostname", line);
        }
    }
    if restored {
        run_restore_hook(a);
    }
    Ok(Obj::new())
}

/// The opt-in reseed hook: a restored copy's processes keep the random state they had at the
/// snapshot (by design: episodes are reproducible). An image that wants divergence ships an
/// executable RESTORE_HOOK; every restored copy runs it once, detached, with the copy's
/// identity and a fresh ROLLBOX_SEED (32 hex digits) in its environment (e.g. to signal its
/// servers to re-seed). Its output is discarded; the PID-1 reaper reaps it.
const RESTORE_HOOK: &str = "/etc/rollbox/restore-hook";

fn run_restore_hook(a: &Agent) {
    if !fs::metadata(RESTORE_HOOK).map(|m| m.is_file()).unwrap_or(false) {
        return;
    }
    let mut seed = [0u8; 16];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut seed);
    }
    let mut cmd = std::process::Command::new(RESTORE_HOOK);
    cmd.env_clear();
    for (k, v) in a.base_env.iter().chain(a.identity.lock().unwrap().iter()) {
        cmd.env(os(k), os(v));
    }
    cmd.env("ROLLBOX_SEED", hex(&seed)).current_dir("/")
        .stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    // In cgroups of its own like any command (the root ones are the agent's: jail.rs).
    let mark = b"ROLLBOX_RESTORE_HOOK=1";
    match jail::Jail::create(0, mark) {
        Some(j) => {
            let _ = j.spawn_inside(|| cmd.spawn());
            j.release(mark);
        }
        None => {
            jail::note_unjailed();
            let _ = cmd.spawn();
        }
    }
}

pub fn op_ping() -> OpResult {
    Ok(Obj::new()
        .with("pid", Value::from(unsafe { sys::getpid() } as i64))
        .with("protocol", Value::from(PROTOCOL))
        .with("time", Value::from(now_unix())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_in_any_spelling() {
        for p in [&b"/"[..], b"//", b"/.", b"/a/..", b"/a/b/../..", b"/..", b"///./"] {
            assert!(is_root(p), "{:?}", p);
        }
        for p in [&b"/a"[..], b"/a/b/..", b"//tmp"] {
            assert!(!is_root(p), "{:?}", p);
        }
    }

    #[test]
    fn parent_dirs() {
        assert_eq!(parent(b"/a/b"), b"/a");
        assert_eq!(parent(b"/a"), b"/");
        assert_eq!(parent(b"a"), b"");
    }

    #[test]
    fn programs_resolve_on_the_given_path() {
        assert_eq!(resolve_program(b"sh", Some(b"/nonexistent:/bin"), b"/"), Some(b"/bin/sh".to_vec()));
        assert_eq!(resolve_program(b"./x", None, b"/"), Some(b"./x".to_vec()));
        assert_eq!(resolve_program(b"rollbox-no-such-cmd", Some(b"/bin:/usr/bin"), b"/"), None);
        assert_eq!(resolve_program(b"", None, b"/"), None);
    }
}
