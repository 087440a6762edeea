//! Thin safe wrappers over the libc crate for what std does not wrap. x86-64 Linux with glibc,
//! linked statically. The libc items the agent calls are re-exported so call sites say `sys::`.

use libc::{c_char, c_int, c_long, c_void};
use std::io;

pub use libc::{
    _exit, chdir, close, dup2, execve, fork, getpid, gettid, ioctl, kill, mount, open, pid_t, poll, posix_spawn,
    posix_spawn_file_actions_adddup2, posix_spawn_file_actions_addopen, posix_spawn_file_actions_destroy,
    posix_spawn_file_actions_init, posix_spawn_file_actions_t, posix_spawnattr_destroy, posix_spawnattr_init,
    posix_spawnattr_setflags, posix_spawnattr_setsigdefault, posix_spawnattr_setsigmask, posix_spawnattr_t, prctl,
    read, sethostname, setgid, setgroups, setsid, setuid, sigemptyset, sigfillset, signal, sigprocmask, sigset_t,
    umount2, waitpid, write, EAGAIN, ECHILD, EINTR, ENOENT, MNT_DETACH, O_RDONLY, POLLERR, POLLHUP,
    POLLIN, POLLNVAL, POLLOUT, POSIX_SPAWN_SETSID, POSIX_SPAWN_SETSIGDEF, POSIX_SPAWN_SETSIGMASK, PR_CAPBSET_DROP,
    PR_SET_DUMPABLE, SIGCHLD, SIGKILL, SIGSTOP, SIG_DFL, SIG_IGN, SIG_SETMASK, TIOCSCTTY, O_NONBLOCK, pipe2,
};

/// linux/capability.h (the libc crate has no capability constants).
pub const CAP_SYS_ADMIN: libc::c_ulong = 21;

pub type PollFd = libc::pollfd;

extern "C" {
    /// glibc >= 2.29; the libc crate (0.2.139) does not declare it.
    pub fn posix_spawn_file_actions_addchdir_np(fa: *mut posix_spawn_file_actions_t, path: *const c_char) -> c_int;
}

pub fn errno() -> c_int {
    unsafe { *libc::__errno_location() }
}

pub fn last_err() -> io::Error {
    io::Error::last_os_error()
}

pub fn set_nonblocking(fd: c_int, on: bool) {
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, if on { fl | libc::O_NONBLOCK } else { fl & !libc::O_NONBLOCK });
        }
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(c_int, c_int)> {
    let mut fds = [0 as c_int; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(last_err());
    }
    Ok((fds[0], fds[1]))
}

/// Sets a terminal's size (rows, cols); false when `fd` is not a terminal.
pub fn set_winsize(fd: c_int, cols: u16, rows: u16) -> bool {
    let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    unsafe { ioctl(fd, libc::TIOCSWINSZ, &ws as *const libc::winsize) == 0 }
}

/// A new pseudo-terminal, both ends close-on-exec and not our controlling terminal:
/// (master, slave).
pub fn openpty() -> io::Result<(Fd, Fd)> {
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(last_err());
        }
        let master = Fd(m);
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            return Err(last_err());
        }
        let mut name = [0 as c_char; 128];
        let rc = libc::ptsname_r(m, name.as_mut_ptr(), name.len());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let s = open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if s < 0 {
            return Err(last_err());
        }
        Ok((master, Fd(s)))
    }
}

/// An fd closed when dropped.
pub struct Fd(pub c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            unsafe { close(self.0) };
        }
    }
}

/// Fills `buf` from the kernel's random source.
pub fn random(buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr() as *mut c_void, buf.len() - done, 0) };
        if n > 0 {
            done += n as usize;
        } else if errno() != EINTR {
            // No getrandom: /dev/urandom, which every sandbox has.
            use std::io::Read;
            if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
                let _ = f.read_exact(&mut buf[done..]);
            }
            return;
        }
    }
}

pub fn wait_status_exit_code(status: c_int) -> Option<c_int> {
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    }
}

pub fn wait_status_signal(status: c_int) -> Option<c_int> {
    if libc::WIFSIGNALED(status) {
        Some(libc::WTERMSIG(status))
    } else {
        None
    }
}

/// Python's `exit_code_of`: the exit status, 128 + n for a death by signal n, else -1.
pub fn exit_code_of(status: c_int) -> c_long {
    if let Some(c) = wait_status_exit_code(status) {
        c as c_long
    } else if let Some(s) = wait_status_signal(status) {
        128 + s as c_long
    } else {
        -1
    }
}

/// Blocks SIGCHLD in the calling thread, and so in every thread it starts after: the reaper
/// takes it with `wait_sigchld`. Children get an empty mask (`proc::launch`).
pub fn block_sigchld() {
    unsafe {
        let mut set: sigset_t = std::mem::zeroed();
        sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits until SIGCHLD is pending (taking it) or `timeout` passes.
pub fn wait_sigchld(timeout: std::time::Duration) {
    unsafe {
        let mut set: sigset_t = std::mem::zeroed();
        sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
        libc::sigtimedwait(&set, std::ptr::null_mut(), &ts);
    }
}
