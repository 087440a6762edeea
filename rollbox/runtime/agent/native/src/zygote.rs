//! The sandbox init's end of the episode-container zygote (agent/zygote.py), as agent.py's
//! `ZygoteLink`: at start, while the agent still holds CAP_SYS_ADMIN, it forks a launcher
//! that waits on a pipe; the first `container_*` request makes it exec `python3 zygote.py`
//! (which clones one container per episode and needs that capability), with the sandbox key
//! on fd 3. Requests are relayed as their raw signed frames and the zygote's frames copied
//! back to the daemon, so the zygote verifies and signs with the same key as the agent.

use libc::c_int;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;

use crate::sys;

pub struct ZygoteLink {
    to_w: c_int,
    from_r: c_int,
    /// (started, why container requests fail now: (error kind, message), None while usable).
    dead: Mutex<(bool, Option<(&'static str, String)>)>,
    /// Whether the zygote ever answered: a write failing before that means it could not start.
    served: std::sync::atomic::AtomicBool,
}

/// The zygote could never serve (no launcher, no python3 in the image): the pool must not retry.
pub const UNSUPPORTED: &str = "container_unavailable";
/// It served and then ended (e.g. killed): the pooled sandbox is replaced, the episode retried.
pub const FAILED: &str = "container_error";

fn find_python() -> Option<CString> {
    let path = std::env::var_os("PATH").map(|p| p.as_bytes().to_vec()).unwrap_or_else(|| b"/usr/bin:/bin".to_vec());
    for dir in path.split(|&c| c == b':') {
        for name in [&b"python3"[..]] {
            let mut cand = dir.to_vec();
            cand.push(b'/');
            cand.extend_from_slice(name);
            if std::fs::metadata(std::ffi::OsStr::from_bytes(&cand)).map(|m| m.is_file()).unwrap_or(false) {
                return CString::new(cand).ok();
            }
        }
    }
    None
}

impl ZygoteLink {
    /// Forks the launcher. Call before any thread exists and before CAP_SYS_ADMIN is dropped.
    pub fn start(key: &[u8]) -> Option<ZygoteLink> {
        let here = std::env::current_exe().ok()?.parent()?.join("zygote.py");
        let script = CString::new(here.as_os_str().as_bytes()).ok()?;
        let python = find_python();
        let env: Vec<CString> = std::env::vars_os()
            .filter(|(k, _)| k != "ROLLBOX_PRIVILEGED" && k != "ROLLBOX_MEMORY_MIB")
            .filter_map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).ok()
            })
            .collect();
        let (to_r, to_w) = sys::pipe().ok()?;
        let (from_r, from_w) = sys::pipe().ok()?;
        let pid = unsafe { sys::fork() };
        if pid < 0 {
            unsafe {
                for fd in [to_r, to_w, from_r, from_w] {
                    sys::close(fd);
                }
            }
            return None;
        }
        if pid == 0 {
            unsafe {
                sys::close(to_w);
                sys::close(from_r);
                let mut go = [0u8; 1];
                let n = sys::read(to_r, go.as_mut_ptr() as *mut _, 1);
                if n != 1 || go[0] != b'S' {
                    sys::_exit(0);
                }
                let python = match python { Some(python) => python, _ => sys::_exit(127) };
                let mut kp = [0 as c_int; 2];
                if sys::pipe2(kp.as_mut_ptr(), 0) != 0 {
                    sys::_exit(127);
                }
                sys::write(kp[1], key.as_ptr() as *const _, key.len());
                sys::close(kp[1]);
                sys::dup2(to_r, 0);
                sys::dup2(from_w, 1);
                sys::dup2(kp[0], 3);
                for fd in 4..1024 {
                    sys::close(fd);
                }
                let u = CString::new("-u").unwrap();
                let argv = [python.as_ptr(), u.as_ptr(), script.as_ptr(), std::ptr::null()];
                let mut envp: Vec<*const libc::c_char> = env.iter().map(|c| c.as_ptr()).collect();
                envp.push(std::ptr::null());
                sys::execve(python.as_ptr(), argv.as_ptr(), envp.as_ptr());
                sys::_exit(127);
            }
        }
        unsafe {
            sys::close(to_r);
            sys::close(from_w);
        }
        crate::jail::exempt(pid); // in the root cgroups by design (forked before any exists)
        Some(ZygoteLink { to_w, from_r, dead: Mutex::new((false, None)), served: Default::default() })
    }

    /// Sends one raw request frame to the zygote, starting it first if need be. Err: why the
    /// request cannot be served (the caller replies with a `container_unavailable` error).
    pub fn relay(&'static self, frame: &[u8], on_start: impl FnOnce(&'static ZygoteLink))
                 -> Result<(), (&'static str, String)> {
        let mut st = self.dead.lock().unwrap();
        if st.1.is_none() && !st.0 {
            st.0 = true;
            if write_all(self.to_w, b"S").is_err() {
                st.1 = Some((UNSUPPORTED, "the episode-container launcher is gone (a snapshot made before \
                            container support?)".into()));
            } else {
                on_start(self);
            }
        }
        if let Some(why) = &st.1 {
            return Err(why.clone());
        }
        if let Err(e) = write_all(self.to_w, frame) {
            st.1 = Some(if self.served.load(std::sync::atomic::Ordering::Relaxed) {
                (FAILED, format!("the episode-container zygote is gone: {}", e))
            } else {
                (UNSUPPORTED, format!("the episode-container zygote could not start ({}): episode containers \
                                       need python3 >= 3.9 in the image and room under the sandbox's pids limit", e))
            });
            return Err(st.1.clone().unwrap());
        }
        Ok(())
    }

    /// Reads the zygote's frames until it ends, handing each whole frame to `out`.
    pub fn copy_back(&self, out: impl Fn(&[u8])) {
        let mut served = false;
        loop {
            let mut hdr = [0u8; 4];
            if !read_all(self.from_r, &mut hdr) {
                break;
            }
            let n = u32::from_be_bytes(hdr) as usize;
            let mut frame = vec![0u8; 4 + n];
            frame[..4].copy_from_slice(&hdr);
            if !read_all(self.from_r, &mut frame[4..]) {
                break;
            }
            out(&frame);
            served = true;
            self.served.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.dead.lock().unwrap().1 = Some(if served {
            (FAILED, "the episode-container zygote ended".into())
        } else {
            (UNSUPPORTED, "the episode-container zygote could not start (container isolation needs python3 >= 3.9 \
                           in the image)".into())
        });
    }
}

fn write_all(fd: c_int, mut buf: &[u8]) -> Result<(), String> {
    while !buf.is_empty() {
        let n = unsafe { sys::write(fd, buf.as_ptr() as *const _, buf.len()) };
        if n > 0 {
            buf = &buf[n as usize..];
        } else if sys::errno() != sys::EINTR {
            return Err(format!("errno {}", sys::errno()));
        }
    }
    Ok(())
}

fn read_all(fd: c_int, buf: &mut [u8]) -> bool {
    let mut off = 0;
    while off < buf.len() {
        let n = unsafe { sys::read(fd, buf[off..].as_mut_ptr() as *mut _, buf.len() - off) };
        if n > 0 {
            off += n as usize;
        } else if n == 0 || sys::errno() != sys::EINTR {
            return false;
        }
    }
    true
}
