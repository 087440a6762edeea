//! The sandbox's OOM killer: gVisor's memory limit is the host cgroup's, which covers gVisor's
//! own kernel too, so the host kernel ending it ends the whole sandbox. This thread watches
//! the sandbox's memory (the root memory cgroup inside gVisor, every process's pages) every
//! POLL and, once it reaches the limit the user asked for, SIGKILLs the exec whose cgroup
//! holds the most, as Linux's OOM killer would kill the biggest process. The daemon gives the
//! host cgroup headroom above that limit (runtime/bundle.py), so the watcher acts first; the
//! host limit stays the last line of defence.

use std::time::Duration;

use crate::jail;

const POLL: Duration = Duration::from_millis(10);
/// After a kill, time for the killed processes' memory to be freed before looking again.
const SETTLE: Duration = Duration::from_millis(100);

/// The watcher's loop; returns at once without a limit or a memory hierarchy.
pub fn run(limit_bytes: u64) {
    if limit_bytes == 0 || jail::memory_usage("").is_none() {
        return;
    }
    loop {
        std::thread::sleep(POLL);
        let Some(total) = jail::memory_usage("") else { continue };
        if total < limit_bytes {
            continue;
        }
        let biggest = jail::live().into_iter()
            .filter_map(|name| jail::memory_usage(&name).map(|used| (used, name)))
            .max();
        if let Some((used, name)) = biggest {
            if used > 0 {
                jail::mark_oom(&name);
                jail::kill_members(&name);
                std::thread::sleep(SETTLE);
            }
        }
    }
}

/// The limit the daemon passes in ROLLBOX_MEMORY_MIB, in bytes (0: none).
pub fn limit_from_env(value: Option<&[u8]>) -> u64 {
    value.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0) << 20
}
