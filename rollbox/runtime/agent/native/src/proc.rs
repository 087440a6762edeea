//! Starting processes, reaping every child (we are PID 1), and killing a whole exec's tree.

use std::collections::HashMap;
use libc::{c_char, c_int};
use std::ffi::CString;
use std::io;
use std::ptr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::sys;

/// The exit status of one pid that an exec waits for, filled in by the reaper.
pub struct Waiter {
    status: Mutex<Option<c_int>>,
    cv: Condvar,
    /// An fd the reaper writes one byte to when the status arrives: a poll loop's wake-up.
    wake: Mutex<Option<c_int>>,
}

impl Waiter {
    pub fn status(&self) -> Option<c_int> {
        *self.status.lock().unwrap()
    }

    /// Has the reaper write a byte to `fd` when the status arrives; false when it already has
    /// (nothing will be written). `fd` must stay open until `clear_wake`.
    pub fn set_wake(&self, fd: c_int) -> bool {
        *self.wake.lock().unwrap() = Some(fd);
        if self.status.lock().unwrap().is_some() {
            self.clear_wake();
            return false;
        }
        true
    }

    /// Stops writing to the fd `set_wake` gave (after this returns, it may be closed).
    pub fn clear_wake(&self) {
        *self.wake.lock().unwrap() = None;
    }

    /// Waits until the pid has been reaped, at most `limit` (None: no limit).
    pub fn wait(&self, limit: Option<Duration>) -> Option<c_int> {
        let g = self.status.lock().unwrap();
        match limit {
            None => *self.cv.wait_while(g, |s| s.is_none()).unwrap(),
            Some(d) => *self.cv.wait_timeout_while(g, d, |s| s.is_none()).unwrap().0,
        }
    }
}

struct ReaperState {
    waiters: HashMap<sys::pid_t, Arc<Waiter>>,
    have_children: bool,
}

/// Reaps every child, adopted orphans included. Spawning happens under its lock and the
/// reaper takes the lock after `waitpid` returns, so a pid that exits before its waiter is
/// registered is still matched; a pid nobody registered is an orphan and is just reaped.
pub struct Reaper {
    state: Mutex<ReaperState>,
    cv: Condvar,
}

impl Reaper {
    pub fn new() -> Self {
        Reaper { state: Mutex::new(ReaperState { waiters: HashMap::new(), have_children: false }), cv: Condvar::new() }
    }

    /// The reaper thread's loop; never returns. Needs SIGCHLD blocked in every thread of the
    /// agent (`block_sigchld`, before the first thread), so that it stays pending for this
    /// thread's `sigtimedwait`.
    pub fn run(&self) -> ! {
        loop {
            let mut status: c_int = 0;
            let pid = unsafe { sys::waitpid(-1, &mut status, 0) };
            if pid > 0 {
                let w = self.state.lock().unwrap().waiters.remove(&pid);
                if let Some(w) = w {
                    *w.status.lock().unwrap() = Some(status);
                    if let Some(fd) = *w.wake.lock().unwrap() {
                        unsafe { sys::write(fd, b"x".as_ptr() as *const _, 1) };
                    }
                    w.cv.notify_all();
                }
            } else if sys::errno() == sys::ECHILD {
                // No child now. Any child's exit raises SIGCHLD, a start's as an orphan's
                // that the kernel hands to PID 1 later (a fork bomb's, once its parents
                // exit). Waiting for starts alone missed those: they piled up as zombies,
                // filled RLIMIT_NPROC and stalled the sandbox for 10-60 s (gh-19). The
                // timeout only bounds a wait should a wake-up ever be lost.
                if !self.state.lock().unwrap().have_children {
                    sys::wait_sigchld(Duration::from_secs(5));
                }
                self.state.lock().unwrap().have_children = false;
            }
        }
    }

    /// Runs `start` (which makes one child) under the lock; registers a waiter for it when
    /// `wait` is true, and wakes the reaper either way.
    pub fn start<F>(&self, wait: bool, start: F) -> io::Result<(sys::pid_t, Option<Arc<Waiter>>)>
    where
        F: FnOnce() -> io::Result<sys::pid_t>,
    {
        let mut st = self.state.lock().unwrap();
        let pid = start()?;
        let w = if wait {
            let w = Arc::new(Waiter { status: Mutex::new(None), cv: Condvar::new(), wake: Mutex::new(None) });
            st.waiters.insert(pid, w.clone());
            Some(w)
        } else {
            None
        };
        st.have_children = true;
        self.cv.notify_all();
        Ok((pid, w))
    }

    pub fn forget(&self, pid: sys::pid_t) {
        self.state.lock().unwrap().waiters.remove(&pid);
    }

    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.state.lock().unwrap().waiters.len()
    }
}

/// Where a new process's fd 0 comes from.
pub enum Stdin {
    DevNull,
    Fd(c_int),
}

/// Everything a new process needs, made before the fork (the child may not allocate).
pub struct Launch {
    pub path: CString,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub cwd: CString,
    pub stdin: Stdin,
    pub stdout: c_int,
    pub stderr: c_int,
    /// (uid, gid) to switch to, supplementary groups cleared; None: stay root.
    pub creds: Option<(u32, u32)>,
}

fn ptrs(v: &[CString]) -> Vec<*const c_char> {
    v.iter().map(|s| s.as_ptr()).chain(std::iter::once(ptr::null())).collect()
}

/// Starts the process in its own session with default signal dispositions and an empty
/// signal mask. Uses posix_spawn (a vfork under glibc, far cheaper under gVisor than fork);
/// a fork when it has to change user. Returns the pid, or the errno of what failed.
pub fn launch(l: &Launch) -> io::Result<sys::pid_t> {
    let argv = ptrs(&l.argv);
    let envp = ptrs(&l.env);
    match l.creds {
        None => spawn(l, &argv, &envp),
        Some(creds) => fork_exec(l, &argv, &envp, Some(creds), false),
    }
}

/// Like `launch`, but fd 0 (a pty slave) becomes the new session's controlling terminal
/// (TIOCSCTTY after setsid): posix_spawn cannot do that, so this always forks.
pub fn launch_tty(l: &Launch) -> io::Result<sys::pid_t> {
    let argv = ptrs(&l.argv);
    let envp = ptrs(&l.env);
    fork_exec(l, &argv, &envp, l.creds, true)
}

fn spawn(l: &Launch, argv: &[*const c_char], envp: &[*const c_char]) -> io::Result<sys::pid_t> {
    unsafe {
        let mut fa: sys::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attr: sys::posix_spawnattr_t = std::mem::zeroed();
        sys::posix_spawn_file_actions_init(&mut fa);
        sys::posix_spawnattr_init(&mut attr);
        let devnull = b"/dev/null\0";
        match l.stdin {
            Stdin::DevNull => {
                sys::posix_spawn_file_actions_addopen(&mut fa, 0, devnull.as_ptr() as *const c_char, sys::O_RDONLY, 0);
            }
            Stdin::Fd(fd) => {
                sys::posix_spawn_file_actions_adddup2(&mut fa, fd, 0);
            }
        }
        sys::posix_spawn_file_actions_adddup2(&mut fa, l.stdout, 1);
        sys::posix_spawn_file_actions_adddup2(&mut fa, l.stderr, 2);
        sys::posix_spawn_file_actions_addchdir_np(&mut fa, l.cwd.as_ptr());
        let mut empty: sys::sigset_t = std::mem::zeroed();
        let mut all: sys::sigset_t = std::mem::zeroed();
        sys::sigemptyset(&mut empty);
        sys::sigfillset(&mut all);
        sys::posix_spawnattr_setsigmask(&mut attr, &empty);
        sys::posix_spawnattr_setsigdefault(&mut attr, &all);
        sys::posix_spawnattr_setflags(&mut attr, (sys::POSIX_SPAWN_SETSID | sys::POSIX_SPAWN_SETSIGMASK | sys::POSIX_SPAWN_SETSIGDEF) as libc::c_short);
        let mut pid: sys::pid_t = 0;
        // libc declares argv/envp as *const *mut c_char (POSIX's char *const[]); nothing is written through them.
        let rc = sys::posix_spawn(&mut pid, l.path.as_ptr(), &fa, &attr, argv.as_ptr() as *const *mut c_char,
                                  envp.as_ptr() as *const *mut c_char);
        sys::posix_spawn_file_actions_destroy(&mut fa);
        sys::posix_spawnattr_destroy(&mut attr);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(pid)
    }
}

fn fork_exec(l: &Launch, argv: &[*const c_char], envp: &[*const c_char], creds: Option<(u32, u32)>, ctty: bool)
              -> io::Result<sys::pid_t> {
    let (rp, wp) = sys::pipe()?;
    let rp = sys::Fd(rp);
    let mut wp = sys::Fd(wp);
    let devnull = b"/dev/null\0";
    let pid = unsafe { sys::fork() };
    if pid < 0 {
        return Err(sys::last_err());
    }
    if pid == 0 {
        // The child: only async-signal-safe calls from here on.
        unsafe {
            let fail = |fd: c_int| -> ! {
                let e = sys::errno();
                sys::write(fd, &e as *const c_int as *const _, 4);
                sys::_exit(127)
            };
            sys::setsid();
            for sig in 1..65 {
                if sig != 9 && sig != 19 && sig != 32 && sig != 33 {
                    sys::signal(sig, sys::SIG_DFL);
                }
            }
            let empty: sys::sigset_t = std::mem::zeroed(); // all-zero: the empty set
            sys::sigprocmask(sys::SIG_SETMASK, &empty, ptr::null_mut());
            let fd0 = match l.stdin {
                Stdin::DevNull => sys::open(devnull.as_ptr() as *const c_char, sys::O_RDONLY),
                Stdin::Fd(fd) => fd,
            };
            if fd0 < 0 || sys::dup2(fd0, 0) < 0 || sys::dup2(l.stdout, 1) < 0 || sys::dup2(l.stderr, 2) < 0 {
                fail(wp.0);
            }
            if ctty && sys::ioctl(0, sys::TIOCSCTTY, 0 as c_int) != 0 {
                fail(wp.0);
            }
            if sys::chdir(l.cwd.as_ptr()) != 0 {
                fail(wp.0);
            }
            if let Some((uid, gid)) = creds {
                if sys::setgroups(0, ptr::null()) != 0 || sys::setgid(gid) != 0 || sys::setuid(uid) != 0 {
                    fail(wp.0);
                }
            }
            sys::execve(l.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            fail(wp.0);
        }
    }
    drop(std::mem::replace(&mut wp, sys::Fd(-1)));
    let mut e: c_int = 0;
    loop {
        let n = unsafe { sys::read(rp.0, &mut e as *mut c_int as *mut _, 4) };
        if n == 4 {
            return Err(io::Error::from_raw_os_error(e));
        }
        if n < 0 && sys::errno() == sys::EINTR {
            continue;
        }
        return Ok(pid); // EOF: the exec happened (the pipe closed on exec)
    }
}

/// Pids whose environment carries `needle` ("MARK=value"): an exec's whole tree, setsid'd
/// and double-forked processes too.
pub fn marked_pids(needle: &[u8]) -> Vec<sys::pid_t> {
    let me = unsafe { sys::getpid() };
    let mut found = Vec::new();
    let dir = match std::fs::read_dir("/proc") { Ok(dir) => dir, _ => return found };
    for e in dir.flatten() {
        let name = e.file_name();
        let pid = match name.to_str().and_then(|s| s.parse::<sys::pid_t>().ok()) { Some(pid) => pid, _ => continue };
        if pid == 1 || pid == me {
            continue;
        }
        let env = match std::fs::read(format!("/proc/{}/environ", pid)) { Ok(env) => env, _ => continue };
        if env.split(|&b| b == 0).any(|entry| entry == needle) {
            found.push(pid);
        }
    }
    found
}

/// SIGKILLs the exec's process group and every process of its tree, until none is left: the
/// members of its cgroup (jail.rs) when it has one, else every process carrying its mark.
/// Returns how many processes the exec had when the kill began, counted before the first
/// signal (a killed process leaves its cgroup and loses its environ at once).
pub fn kill_tree(pid: sys::pid_t, needle: &[u8]) -> usize {
    let jail = crate::jail::for_mark(needle);
    let first = match &jail {
        Some(name) => crate::jail::task_count(name).max(crate::jail::count_members(name)),
        None => marked_pids(needle).len(),
    };
    // Passes until one finds no process it has not signalled yet; it does not wait for the
    // killed to exit: a process with SIGKILL pending forks no more, and a fork bomb's few
    // hundred exits took gVisor 0.7-11 s here under the bomb's own load, all of it on the
    // timed-out exec's reply (gh-19). Its cgroup goes once empty (jail.rs `sweep`).
    let mut signalled: std::collections::HashSet<sys::pid_t> = std::collections::HashSet::new();
    for _ in 0..100 {
        unsafe { sys::kill(-pid, sys::SIGKILL) };
        let pids = match &jail {
            Some(name) => crate::jail::killable(name),
            None => marked_pids(needle),
        };
        let mut fresh = 0;
        for p in pids {
            if signalled.insert(p) {
                unsafe { sys::kill(p, sys::SIGKILL) };
                fresh += 1;
            }
        }
        if fresh == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    first
}

/// Sends `sig` to the tree `kill_tree` would kill. SIGKILL is kill_tree itself; any other
/// signal is sent once (the tree may handle it and live on). Returns how many processes
/// were signalled.
pub fn signal_tree(pid: sys::pid_t, needle: &[u8], sig: c_int) -> usize {
    if sig == sys::SIGKILL {
        return kill_tree(pid, needle);
    }
    let pids = match crate::jail::for_mark(needle) {
        Some(name) => crate::jail::members(&name),
        None => marked_pids(needle),
    };
    unsafe { sys::kill(-pid, sig) };
    for p in &pids {
        unsafe { sys::kill(*p, sig) };
    }
    pids.len()
}

/// The most tasks one exec's cgroup may hold: the sandbox's RLIMIT_NPROC less a reserve, so
/// that a fork bomb leaves the agent room for its threads and the next exec.
pub fn exec_pids_max() -> usize {
    let n = nproc_limit();
    if n == usize::MAX {
        return 0;
    }
    n.saturating_sub((n / 4).max(16)).max(4)
}

/// RLIMIT_NPROC's soft limit (usize::MAX: none). A syscall, not a read of /proc/self/limits:
/// each exec asks several times, and gVisor builds that file anew on every open.
fn nproc_limit() -> usize {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut rl) } != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        return usize::MAX;
    }
    rl.rlim_cur as usize
}

/// An exec whose tree holds this many processes when its timeout kills it ran into
/// RLIMIT_NPROC (a fork bomb): half the soft limit, as agent.py reports it (the limit counts
/// the agent's own threads too, so a bomb never has all of it).
pub fn pids_report_at() -> usize {
    match nproc_limit() {
        usize::MAX => usize::MAX,
        n => (n / 2).max(4),
    }
}

/// Resolves an image's `User` ("name", "uid", "name:group", "uid:gid") in the sandbox's own
/// /etc/passwd and /etc/group. None: root (no switch). Err: an unknown name.
pub fn resolve_user(user: &[u8]) -> Result<Option<(u32, u32)>, String> {
    if user.is_empty() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(user);
    let (name, group) = match text.split_once(':') {
        Some((n, g)) => (n.to_string(), g.to_string()),
        None => (text.to_string(), String::new()),
    };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entry = |pred: &dyn Fn(&[&str]) -> bool| -> Option<(u32, u32)> {
        passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() >= 4).find(|f| pred(f))
            .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
    };
    let is_num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (uid, mut gid) = if is_num(&name) {
        let uid: u32 = name.parse().map_err(|_| format!("user {:?} is out of range", name))?;
        let gid = entry(&|f| f[2] == name || f[2].parse::<u32>().ok() == Some(uid)).map(|e| e.1).unwrap_or(uid);
        (uid, gid)
    } else {
        entry(&|f| f[0] == name).ok_or_else(|| format!("unable to find user {}: no matching entries in passwd file", name))?
    };
    if !group.is_empty() {
        if is_num(&group) {
            gid = group.parse().map_err(|_| format!("group {:?} is out of range", group))?;
        } else {
            let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
            gid = groups.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() >= 3)
                .find(|f| f[0] == group).and_then(|f| f[2].parse().ok())
                .ok_or_else(|| format!("group '{}' is not in the image's /etc/group", group))?;
        }
    }
    if uid == 0 && gid == 0 {
        return Ok(None);
    }
    Ok(Some((uid, gid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_needs_no_switch() {
        assert_eq!(resolve_user(b"").unwrap(), None);
        assert_eq!(resolve_user(b"root").unwrap(), None);
        assert_eq!(resolve_user(b"0:0").unwrap(), None);
        assert_eq!(resolve_user(b"1234:5").unwrap(), Some((1234, 5)));
        assert!(resolve_user(b"no-such-user-rollbox").is_err());
        assert!(resolve_user(b"root:no-such-group-rollbox").is_err());
    }
}
