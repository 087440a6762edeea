//! The few libc functions std does not wrap, declared by hand (no crates: the build is offline).
//! x86-64 Linux with glibc, linked statically.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::io;

pub type pid_t = c_int;

/// glibc's sigset_t: 1024 bits.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SigSet(pub [u64; 16]);

/// Opaque storage for posix_spawn_file_actions_t (80 bytes) and posix_spawnattr_t (336 bytes).
#[repr(C, align(8))]
pub struct Opaque(pub [u8; 512]);

#[repr(C)]
pub struct PollFd {
    pub fd: c_int,
    pub events: i16,
    pub revents: i16,
}

extern "C" {
    pub fn poll(fds: *mut PollFd, nfds: c_ulong, timeout: c_int) -> c_int;
    pub fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t;
    pub fn kill(pid: pid_t, sig: c_int) -> c_int;
    pub fn getpid() -> pid_t;
    pub fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int;
    pub fn sethostname(name: *const c_char, len: usize) -> c_int;
    pub fn signal(sig: c_int, handler: usize) -> usize;
    pub fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    pub fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    pub fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    pub fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    pub fn close(fd: c_int) -> c_int;
    pub fn fork() -> pid_t;
    pub fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    pub fn _exit(code: c_int) -> !;
    pub fn setsid() -> pid_t;
    pub fn setgroups(n: usize, groups: *const c_uint) -> c_int;
    pub fn setgid(gid: c_uint) -> c_int;
    pub fn setuid(uid: c_uint) -> c_int;
    pub fn dup2(old: c_int, new: c_int) -> c_int;
    pub fn chdir(path: *const c_char) -> c_int;
    pub fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    pub fn sigprocmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
    pub fn sigemptyset(set: *mut SigSet) -> c_int;
    pub fn sigfillset(set: *mut SigSet) -> c_int;
    pub fn getrandom(buf: *mut c_void, len: usize, flags: c_uint) -> isize;
    pub fn __errno_location() -> *mut c_int;
    pub fn ioctl(fd: c_int, req: c_ulong, ...) -> c_int;
    pub fn posix_openpt(flags: c_int) -> c_int;
    pub fn grantpt(fd: c_int) -> c_int;
    pub fn unlockpt(fd: c_int) -> c_int;
    pub fn ptsname_r(fd: c_int, buf: *mut c_char, len: usize) -> c_int;
    pub fn mount(src: *const c_char, target: *const c_char, fstype: *const c_char, flags: c_ulong, data: *const c_void) -> c_int;
    pub fn umount2(target: *const c_char, flags: c_int) -> c_int;
    pub fn gettid() -> pid_t;

    pub fn posix_spawn(pid: *mut pid_t, path: *const c_char, fa: *const Opaque, attr: *const Opaque,
                       argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    pub fn posix_spawn_file_actions_init(fa: *mut Opaque) -> c_int;
    pub fn posix_spawn_file_actions_destroy(fa: *mut Opaque) -> c_int;
    pub fn posix_spawn_file_actions_adddup2(fa: *mut Opaque, fd: c_int, newfd: c_int) -> c_int;
    pub fn posix_spawn_file_actions_addopen(fa: *mut Opaque, fd: c_int, path: *const c_char, oflag: c_int,
                                            mode: c_uint) -> c_int;
    pub fn posix_spawn_file_actions_addchdir_np(fa: *mut Opaque, path: *const c_char) -> c_int;
    pub fn posix_spawnattr_init(attr: *mut Opaque) -> c_int;
    pub fn posix_spawnattr_destroy(attr: *mut Opaque) -> c_int;
    pub fn posix_spawnattr_setflags(attr: *mut Opaque, flags: i16) -> c_int;
    pub fn posix_spawnattr_setsigmask(attr: *mut Opaque, set: *const SigSet) -> c_int;
    pub fn posix_spawnattr_setsigdefault(attr: *mut Opaque, set: *const SigSet) -> c_int;
}

pub const O_RDONLY: c_int = 0;
pub const O_RDWR: c_int = 2;
pub const O_NOCTTY: c_int = 0o400;
pub const TIOCSCTTY: c_ulong = 0x540E;
pub const TIOCSWINSZ: c_ulong = 0x5414;
pub const O_NONBLOCK: c_int = 0o4000;
pub const O_CLOEXEC: c_int = 0o2000000;
pub const F_GETFL: c_int = 3;
pub const F_SETFL: c_int = 4;
pub const POLLIN: i16 = 1;
pub const POLLOUT: i16 = 4;
pub const POLLERR: i16 = 8;
pub const POLLHUP: i16 = 16;
pub const POLLNVAL: i16 = 32;
pub const SIGKILL: c_int = 9;
pub const SIG_DFL: usize = 0;
pub const SIG_IGN: usize = 1;
pub const SIG_SETMASK: c_int = 2;
pub const ECHILD: c_int = 10;
pub const EINTR: c_int = 4;
pub const EAGAIN: c_int = 11;
pub const ENOENT: c_int = 2;
pub const POSIX_SPAWN_SETSIGDEF: i16 = 0x04;
pub const POSIX_SPAWN_SETSIGMASK: i16 = 0x08;
pub const POSIX_SPAWN_SETSID: i16 = 0x80;
pub const PR_SET_DUMPABLE: c_int = 4;
pub const PR_CAPBSET_DROP: c_int = 24;
pub const CAP_SYS_ADMIN: c_ulong = 21;
pub const MNT_DETACH: c_int = 2;

pub fn errno() -> c_int {
    unsafe { *__errno_location() }
}

pub fn last_err() -> io::Error {
    io::Error::last_os_error()
}

pub fn set_nonblocking(fd: c_int, on: bool) {
    unsafe {
        let fl = fcntl(fd, F_GETFL);
        if fl >= 0 {
            fcntl(fd, F_SETFL, if on { fl | O_NONBLOCK } else { fl & !O_NONBLOCK });
        }
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(c_int, c_int)> {
    let mut fds = [0 as c_int; 2];
    if unsafe { pipe2(fds.as_mut_ptr(), O_CLOEXEC) } != 0 {
        return Err(last_err());
    }
    Ok((fds[0], fds[1]))
}

/// struct winsize, for TIOCSWINSZ.
#[repr(C)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
    pub xpixel: u16,
    pub ypixel: u16,
}

/// Sets a terminal's size (rows, cols); false when `fd` is not a terminal.
pub fn set_winsize(fd: c_int, cols: u16, rows: u16) -> bool {
    let ws = WinSize { rows, cols, xpixel: 0, ypixel: 0 };
    unsafe { ioctl(fd, TIOCSWINSZ, &ws as *const WinSize) == 0 }
}

/// A new pseudo-terminal, both ends close-on-exec and not our controlling terminal:
/// (master, slave).
pub fn openpty() -> io::Result<(Fd, Fd)> {
    unsafe {
        let m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if m < 0 {
            return Err(last_err());
        }
        let master = Fd(m);
        if grantpt(m) != 0 || unlockpt(m) != 0 {
            return Err(last_err());
        }
        let mut name = [0 as c_char; 128];
        let rc = ptsname_r(m, name.as_mut_ptr(), name.len());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let s = open(name.as_ptr(), O_RDWR | O_NOCTTY | O_CLOEXEC);
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
        let n = unsafe { getrandom(buf[done..].as_mut_ptr() as *mut c_void, buf.len() - done, 0) };
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
    if status & 0x7f == 0 {
        Some((status >> 8) & 0xff)
    } else {
        None
    }
}

pub fn wait_status_signal(status: c_int) -> Option<c_int> {
    let sig = status & 0x7f;
    if sig != 0 && sig != 0x7f {
        Some(sig)
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
