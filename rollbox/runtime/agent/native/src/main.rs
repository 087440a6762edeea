//! rollbox's in-sandbox agent: the container's init process (PID 1 inside gVisor), in Rust
//! (serde_json, sha2/hmac, base64 and libc, as Debian 12 packages them), so that images need no Python (a busybox or distroless image boots).
//!
//! It speaks protocol 2 exactly as agent.py does (read that file's docstring for the why):
//! frames of a 4-byte big-endian length, a 32-byte HMAC-SHA256 of the JSON under the sandbox's
//! key, then the UTF-8 JSON object, both ways, over its own stdin/stdout. Requests carry an
//! integer `id` and run concurrently on a pool of threads; replies carry the same `id`.
//! Unsigned frames (written into /proc/1/fd/0 from inside the sandbox) are dropped.
//!
//! Nothing here caches a pid or a time across requests: after `runsc restore` the process
//! simply carries on, and `identity` gives a restored copy its own env and host name.

mod gate;
mod jail;
mod memwatch;
mod ops;
mod proc;
mod procs;
mod procs_ops;
mod retain;
mod sys;
mod wire;
mod zygote;

use std::collections::VecDeque;
use hmac::{Hmac, Mac};
use libc::c_int;
use sha2::Sha256;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use wire::{Obj, Value};

const KEY_FILE: &str = "/.rollbox-key";
/// Put in a fresh sandbox's /tmp by the daemon (runtime/rootfs.py) so that gVisor mounts no
/// tmpfs of its own over an empty /tmp; removed before any command runs.
const TMP_MARKER: &str = "/tmp/.rollbox-tmp-on-disk";
const MAX_FRAME: usize = 1024 * 1024 * 1024;
const MAC_LEN: usize = 32;

/// What every request shares. Made once at start and never freed (it lives as long as PID 1).
pub struct Agent {
    /// HMAC-SHA256 keyed with the sandbox's key; cloned per frame (the key schedule is done once).
    hmac: Hmac<Sha256>,
    out: Mutex<()>,
    /// `quiesce`/`resume` (gate.rs): `out` kept for a checkpoint.
    gate: gate::Gate,
    pub reaper: proc::Reaper,
    /// Background processes started with `proc_start` (gh-16).
    pub procs: procs::Table,
    /// The agent's own environment, ROLLBOX_PRIVILEGED removed: the base of every command's.
    pub base_env: Vec<(Vec<u8>, Vec<u8>)>,
    /// Set by `identity`: added to every later command's environment.
    pub identity: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
    pool: Pool,
    /// The episode-container zygote's link (None: the launcher could not be forked).
    pub zygote: Option<zygote::ZygoteLink>,
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads made at start and reused: creating one costs a clone through gVisor's kernel, and
/// under a fork bomb (RLIMIT_NPROC reached) it fails. Beyond the reserve, extra threads are
/// made when all are busy, if the kernel still allows it; otherwise a job waits for one.
struct Pool {
    state: Mutex<(VecDeque<Job>, usize)>, // (queued jobs, idle threads)
    cv: Condvar,
}

impl Pool {
    fn worker(&'static self) {
        loop {
            let job = {
                let mut st = self.state.lock().unwrap();
                loop {
                    if let Some(job) = st.0.pop_front() {
                        break job;
                    }
                    st.1 += 1;
                    st = self.cv.wait(st).unwrap();
                    st.1 -= 1;
                }
            };
            job();
        }
    }

    fn add_thread(&'static self) -> bool {
        std::thread::Builder::new().stack_size(1 << 20).spawn(move || self.worker()).is_ok()
    }

    fn submit(&'static self, job: Job) {
        let need = {
            let mut st = self.state.lock().unwrap();
            st.0.push_back(job);
            st.1 < st.0.len()
        };
        if need {
            self.add_thread();
        }
        self.cv.notify_one();
    }
}

impl Agent {
    /// Writes one signed frame to stdout. A gone daemon (EPIPE) drops it: it re-asks.
    fn send(&self, msg: &Value) {
        self.write_raw(&self.frame(msg));
    }

    /// One signed frame of `msg`.
    fn frame(&self, msg: &Value) -> Vec<u8> {
        let data = wire::to_vec(msg);
        let mac = sign(&self.hmac, &data);
        let mut frame = Vec::with_capacity(4 + MAC_LEN + data.len());
        frame.extend_from_slice(&((MAC_LEN + data.len()) as u32).to_be_bytes());
        frame.extend_from_slice(&mac);
        frame.extend_from_slice(&data);
        frame
    }

    /// `quiesce` (gate.rs): answered under the output lock, which it then keeps until `resume`.
    fn quiesce(&self, req: &Value, rid: Value) {
        let token = match req.get("token").and_then(|t| t.as_str()) {
            Some(t) => t.to_string(),
            None => return self.send(&error_reply(rid, "invalid_argument", "quiesce: a string `token` is required")),
        };
        let hold = gate::hold_for(wire::get_truthy(req, "hold_s").and_then(wire::as_f64));
        let _out = self.out.lock().unwrap();
        let held = self.gate.hold(&token);
        self.write_locked(&self.frame(&Obj::new()
            .with("id", rid)
            .with("ok", Value::Bool(true))
            .with("held", Value::Bool(held))
            .build()));
        if held {
            self.gate.wait(&token, hold);
        }
    }

    fn handle(&self, req: Value) {
        let t0 = Instant::now();
        let rid = req.get("id").cloned().unwrap_or(Value::Null);
        let op = req.get("op").and_then(wire::as_bytes).map(|b| String::from_utf8_lossy(&b).to_string());
        if op.as_deref() == Some("quiesce") {
            return self.quiesce(&req, rid);
        }
        let result = catch_unwind(AssertUnwindSafe(|| match op.as_deref() {
            Some("exec") => ops::op_exec(self, &req),
            Some("spawn") => ops::op_spawn(self, &req),
            Some("write_file") => ops::op_write_file(&req),
            Some("read_file") => ops::op_read_file(&req),
            Some("list_files") => ops::op_list_files(&req),
            Some("remove") => ops::op_remove(&req),
            Some("identity") => ops::op_identity(self, &req),
            Some("ping") => ops::op_ping(),
            Some("resume") => {
                self.gate.resume(req.get("token").and_then(|t| t.as_str()));
                Ok(Obj::new())
            }
            Some("proc_start") => procs::op_start(self, &req),
            Some("proc_read") => procs_ops::op_read(self, &req),
            Some("proc_write") => procs_ops::op_write(self, &req),
            Some("proc_kill") => procs_ops::op_kill(self, &req),
            Some("proc_resize") => procs_ops::op_resize(self, &req),
            Some("proc_list") => procs_ops::op_list(self),
            Some("proc_status") => procs_ops::op_status(self, &req),
            Some(other) => Err(ops::OpError::new("agent_error", format!("KeyError: '{}'", other))),
            None => Err(ops::OpError::new("agent_error", "KeyError: 'op'")),
        }));
        let reply = match result {
            Ok(Ok(mut obj)) => {
                obj.set("agent_s", Value::from(t0.elapsed().as_secs_f64()));
                obj.set("id", rid);
                obj.set("ok", Value::Bool(true));
                obj.build()
            }
            Ok(Err(e)) => error_reply(rid, e.kind, &e.message),
            Err(panic) => {
                let what = panic.downcast_ref::<&str>().map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
                error_reply(rid, "agent_error", &format!("panic: {}", what))
            }
        };
        self.send(&reply);
    }
}

impl Agent {
    /// A `container_*` request goes to the zygote unchanged; it signs its own replies.
    fn relay_to_zygote(&'static self, raw: &[u8], rid: Value) {
        let res = match &self.zygote {
            Some(z) => z.relay(raw, |z| {
                let agent: &'static Agent = self;
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn(move || z.copy_back(|frame| agent.write_raw(frame)))
                    .map(|_| ())
                    .unwrap_or(());
            }),
            None => Err((zygote::UNSUPPORTED, "the episode-container launcher could not be started".to_string())),
        };
        if let Err((kind, why)) = res {
            self.send(&error_reply(rid, kind, &why));
        }
    }

    /// Writes an already signed frame (the zygote's) to stdout, whole.
    fn write_raw(&self, frame: &[u8]) {
        let _guard = self.out.lock().unwrap();
        self.write_locked(frame);
    }

    /// Writes one whole frame to stdout; the caller holds `out`. A gone daemon (EPIPE) drops it.
    fn write_locked(&self, frame: &[u8]) {
        let mut off = 0;
        while off < frame.len() {
            let n = unsafe { sys::write(1, frame[off..].as_ptr() as *const _, frame.len() - off) };
            if n > 0 {
                off += n as usize;
                continue;
            }
            match sys::errno() {
                sys::EINTR => {}
                sys::EAGAIN => {
                    let mut p = sys::PollFd { fd: 1, events: sys::POLLOUT, revents: 0 };
                    unsafe { sys::poll(&mut p, 1, 1000) };
                }
                _ => return,
            }
        }
    }
}

/// The frame MAC of `data`: HMAC-SHA256 under the sandbox's key.
fn sign(key: &Hmac<Sha256>, data: &[u8]) -> [u8; MAC_LEN] {
    let mut h = key.clone();
    h.update(data);
    h.finalize().into_bytes().into()
}

/// Whether `mac` is `data`'s frame MAC, compared in constant time (hmac's verify_slice, via
/// subtle): a process in the sandbox must not learn the MAC byte by byte from timing.
fn verify(key: &Hmac<Sha256>, data: &[u8], mac: &[u8]) -> bool {
    let mut h = key.clone();
    h.update(data);
    h.verify_slice(mac).is_ok()
}

fn error_reply(rid: Value, kind: &str, message: &str) -> Value {
    Obj::new()
        .with("id", rid)
        .with("ok", Value::Bool(false))
        .with("error", Value::from(kind))
        .with("message", Value::from(message))
        .build()
}

/// A handler, not SIG_IGN: handlers reset on exec, so commands get default dispositions.
extern "C" fn ignore(_sig: c_int) {}

/// Fills `buf` from stdin. A closed daemon end (EOF) is waited out: it comes back.
fn read_exact(buf: &mut [u8]) {
    let mut off = 0;
    while off < buf.len() {
        let n = unsafe { sys::read(0, buf[off..].as_mut_ptr() as *mut _, buf.len() - off) };
        if n > 0 {
            off += n as usize;
        } else if n == 0 {
            std::thread::sleep(Duration::from_millis(100));
        } else {
            match sys::errno() {
                sys::EINTR => {}
                sys::EAGAIN => {
                    // gVisor may hand us a non-blocking descriptor.
                    let mut p = sys::PollFd { fd: 0, events: sys::POLLIN, revents: 0 };
                    unsafe { sys::poll(&mut p, 1, -1) };
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

/// The per-sandbox key: a file in the root that we delete before any user process exists.
fn load_key() -> Vec<u8> {
    match std::fs::read(KEY_FILE) {
        Ok(k) => {
            let _ = std::fs::remove_file(KEY_FILE);
            k
        }
        Err(_) => Vec::new(),
    }
}

fn main() {
    // Run by hand (e.g. `rollbox-agent --version` inside a sandbox), it would wait forever on a
    // stdin that is not the daemon's channel: say what it is and stop instead.
    if let Some(arg) = std::env::args().nth(1) {
        let version = arg == "--version" || arg == "-V";
        let msg = format!("rollbox-agent {} (protocol {}): the in-sandbox agent, started by the rollbox daemon as \
                           a sandbox's PID 1; it takes no arguments\n", env!("CARGO_PKG_VERSION"), ops::PROTOCOL);
        let fd = if version { 1 } else { 2 };
        unsafe { sys::write(fd, msg.as_ptr() as *const _, msg.len()) };
        std::process::exit(if version { 0 } else { 2 });
    }
    unsafe {
        sys::signal(13, sys::SIG_IGN); // SIGPIPE: a gone reader is an error return, not death
        // As PID 1 we should not die of a stray signal from a process in the sandbox.
        for sig in [15, 2, 1, 3, 10, 12, 14] {
            sys::signal(sig, ignore as extern "C" fn(c_int) as usize);
        }
    }
    let privileged = std::env::var_os("ROLLBOX_PRIVILEGED").map(|v| v == "1").unwrap_or(false);
    let key = load_key();
    let _ = std::fs::remove_file(TMP_MARKER);
    // Before CAP_SYS_ADMIN leaves the bounding set and before any thread exists: the launcher
    // of the episode-container zygote keeps the capability (containers need mounts and new
    // namespaces); no command ever gets it.
    let zygote = zygote::ZygoteLink::start(&key);
    // Per-exec cgroups (jail.rs) need CAP_SYS_ADMIN to mount, and no command may run yet.
    // Only as a sandbox's PID 1 under gVisor: run on a host (the unit tests) or on runc (the
    // host kernel: ROLLBOX_RUNTIME=runc) the mounts would be the host's own hierarchies, and
    // its execs' cgroups would land in the host's root.
    let host_kernel = std::env::var_os("ROLLBOX_RUNTIME").map(|v| v == "runc").unwrap_or(false);
    if unsafe { sys::getpid() } == 1 && !host_kernel {
        jail::init();
        if privileged {
            jail::note_unjailed(); // its commands may move processes between cgroups themselves
        }
    }
    unsafe {
        sys::prctl(sys::PR_SET_DUMPABLE, 0, 0, 0, 0); // no /proc/1/mem, no ptrace
        // The agent keeps CAP_SYS_ADMIN (to set a restored copy's host name) but drops it from
        // the bounding set, so no command it starts ever has it.
        if !privileged {
            sys::prctl(sys::PR_CAPBSET_DROP, sys::CAP_SYS_ADMIN, 0, 0, 0);
        }
    }
    let base_env = std::env::vars_os()
        .filter(|(k, _)| k != "ROLLBOX_PRIVILEGED" && k != "ROLLBOX_MEMORY_MIB")
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    let agent: &'static Agent = Box::leak(Box::new(Agent {
        hmac: Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes a key of any length"),
        out: Mutex::new(()),
        gate: gate::Gate::default(),
        reaper: proc::Reaper::new(),
        procs: procs::Table::new(),
        base_env,
        identity: Mutex::new(Vec::new()),
        pool: Pool { state: Mutex::new((VecDeque::new(), 0)), cv: Condvar::new() },
        zygote,
    }));
    drop(key);
    // Before the first thread (they inherit the mask), after the zygote's fork (its own
    // children keep the default): a handler, never run while blocked, so that no kernel
    // discards SIGCHLD as ignored before the reaper takes it.
    unsafe { sys::signal(sys::SIGCHLD, ignore as extern "C" fn(c_int) as usize) };
    sys::block_sigchld();
    let mem_limit = memwatch::limit_from_env(std::env::var_os("ROLLBOX_MEMORY_MIB").as_deref().map(|v| v.as_bytes()));
    let _ = std::thread::Builder::new().stack_size(64 << 10).spawn(move || memwatch::run(mem_limit));
    std::thread::Builder::new().stack_size(64 << 10).spawn(move || agent.reaper.run()).expect("reaper thread");
    for _ in 0..4 {
        agent.pool.add_thread();
    }
    agent.send(&Obj::new()
        .with("id", Value::from(0))
        .with("ok", Value::Bool(true))
        .with("event", Value::from("ready"))
        .with("pid", Value::from(unsafe { sys::getpid() } as i64))
        .with("protocol", Value::from(ops::PROTOCOL))
        .build());
    let mut hdr = [0u8; 4];
    loop {
        read_exact(&mut hdr);
        let n = u32::from_be_bytes(hdr) as usize;
        if n > MAX_FRAME {
            // Garbage written into our stdin from inside the sandbox: the stream cannot be
            // resynchronised. Ending makes the daemon report the sandbox as ended by its workload.
            std::process::exit(3);
        }
        let mut frame = vec![0u8; n];
        read_exact(&mut frame);
        if n < MAC_LEN {
            continue;
        }
        let (mac, body) = frame.split_at(MAC_LEN);
        // A request not signed with this sandbox's key came from inside the sandbox: drop it.
        if !verify(&agent.hmac, body, mac) {
            continue;
        }
        let req = match wire::parse(body) {
            Ok(r) => r,
            Err(_) => continue,
        };
        let op = match req.get("op").and_then(wire::as_bytes) {
            Some(op) => op,
            None => continue,
        };
        if op.starts_with(b"container_") {
            let mut raw = Vec::with_capacity(4 + n);
            raw.extend_from_slice(&hdr);
            raw.extend_from_slice(&frame);
            agent.relay_to_zygote(&raw, req.get("id").cloned().unwrap_or(Value::Null));
            continue;
        }
        drop(frame);
        agent.pool.submit(Box::new(move || agent.handle(req)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &[u8]) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(k).unwrap()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn macs_are_hmac_sha256() {
        // RFC 4231, test case 2.
        let want = unhex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        assert_eq!(sign(&key(b"Jefe"), b"what do ya want for nothing?").to_vec(), want);
        assert!(verify(&key(b"Jefe"), b"what do ya want for nothing?", &want));
        let mut bad = want.clone();
        bad[31] ^= 1;
        assert!(!verify(&key(b"Jefe"), b"what do ya want for nothing?", &bad));
        assert!(!verify(&key(b"Jefe"), b"what do ya want for nothing?", &want[..31]));
        assert!(!verify(&key(b"other"), b"what do ya want for nothing?", &want));
    }

    #[test]
    fn a_daemon_frame_with_a_non_utf8_path_verifies_and_parses() {
        // What channel.py sends for path=os.fsdecode(b"/tmp/caf\xe9\xff") under key
        // b"sandbox-key" (json.dumps with separators=(",", ":"); the MAC from Python's hmac).
        let body = br#"{"id":7,"op":"list_files","path":"/tmp/caf\udce9\udcff"}"#;
        let mac = unhex("40305644002b0a6bf23ea94ee56456fd99454963173ccec36098d20af928163a");
        assert!(verify(&key(b"sandbox-key"), body, &mac));
        let req = wire::parse(body).unwrap();
        assert_eq!(wire::as_bytes(&req["path"]).unwrap(), b"/tmp/caf\xe9\xff");
        // The reply names it the same way, signed over exactly the bytes sent.
        let reply = wire::to_vec(&Obj::new().with("path", wire::bytes(b"/tmp/caf\xe9\xff")).build());
        assert_eq!(reply, br#"{"path":"/tmp/caf\udce9\udcff"}"#.to_vec());
    }
}
