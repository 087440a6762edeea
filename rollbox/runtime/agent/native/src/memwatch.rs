//! The sandbox's OOM killer (and the reaper of fork bombs left behind by returned execs): gVisor's memory limit is the host cgroup's, which covers gVisor's
//! own kernel too, so the host kernel ending it ends the whole sandbox. This thread watches
//! the sandbox's memory (the root memory cgroup inside gVisor, every process's pages) every
//! POLL and, once it reaches the limit the user asked for, SIGKILLs the exec whose cgroup
//! holds the most, as Linux's OOM killer would kill the biggest process. The daemon gives the
//! host cgroup headroom above that limit (runtime/bundle.py), so the watcher acts first; the
//! host limit stays the last line of defence.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::{jail, proc};

const POLL: Duration = Duration::from_millis(10);
/// Below half the limit a burst cannot reach it before the next look: look less often.
/// (100 ms: an idle ptrace sandbox paid 0.11 CPU s per 5 s at 50 ms; from half the limit to the
/// host's, memory/2 + max(256 MiB, memory/2), takes a burst longer than that.)
const POLL_IDLE: Duration = Duration::from_millis(100);
/// How long a returned exec's leftovers may hold half their pids limit before they are
/// killed: a fork bomb left in the background (`:(){ :|:& };:` returns at once) would hold
/// every process the sandbox may have for good. Wall time, not a count of looks: under the
/// bomb this thread is starved, and 50 looks took over 90 s (break-it trial).
const BOMB_FOR: Duration = Duration::from_millis(1000);
/// Looks in a row under the mark that clear a suspect (a bomb churns: failed forks exit).
const BOMB_CLEAR_LOOKS: u32 = 3;
/// With no command running (no exec or background process has cgroups), the longest wait
/// between looks: a new exec wakes the watcher at once; this bounds how long a process that
/// escaped its cgroups just before its exec returned can live.
const QUIET: Duration = Duration::from_millis(1000);
/// After a kill, time for the killed processes' memory to be freed before looking again.
const SETTLE: Duration = Duration::from_millis(100);

/// The watcher's loop; returns at once without cgroups (limit_bytes 0: no memory watch).
pub fn run(limit_bytes: u64) {
    if !jail::active() {
        return; // no cgroups: nothing to watch
    }
    let limit_bytes = if limit_bytes == 0 { u64::MAX } else { limit_bytes };
    let pids_max = proc::exec_pids_max();
    let mut full: HashMap<String, (Instant, u32)> = HashMap::new();
    let mut poll = POLL;
    let mut looks: u64 = 0;
    loop {
        if !jail::wait_while_quiet(QUIET) {
            std::thread::sleep(poll);
        }
        looks += 1;
        jail::kill_escaped(looks % 10 == 0);
        if pids_max > 0 {
            jail::note_peaks();
            reap_bombs(pids_max, &mut full);
        }
        let total = match jail::memory_usage("").filter(|_| limit_bytes < u64::MAX) { Some(total) => total, _ => continue };
        poll = if total < limit_bytes / 2 { POLL_IDLE } else { POLL };
        if total < limit_bytes {
            continue;
        }
        let biggest = jail::live().into_iter()
            .filter_map(|name| jail::memory_usage(&name).map(|used| (used, name)))
            .max();
        if let Some((used, name)) = biggest {
            // Memory no exec holds (an episode container's, a file in /dev/shm) is not freed
            // by killing a small exec: the host's limit is the last line then.
            if used > 0 && used.saturating_mul(8) >= total {
                jail::mark_oom(&name);
                jail::kill_members(&name);
                std::thread::sleep(SETTLE);
            }
        }
    }
}

/// Kills what a returned exec left running once it has held half its pids limit on BOMB_POLLS
/// more looks than not (a running exec's bomb is its timeout's to kill, and reported there).
fn reap_bombs(pids_max: usize, full: &mut HashMap<String, (Instant, u32)>) {
    let names = jail::returned();
    full.retain(|n, _| names.contains(n));
    let now = Instant::now();
    for name in names {
        if jail::task_count(&name) * 2 < pids_max {
            if let Some(e) = full.get_mut(&name) {
                e.1 += 1;
                if e.1 >= BOMB_CLEAR_LOOKS {
                    full.remove(&name);
                }
            }
            continue;
        }
        let e = full.entry(name.clone()).or_insert((now, 0));
        e.1 = 0;
        if now.duration_since(e.0) >= BOMB_FOR {
            while jail::kill_members(&name) > 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            full.remove(&name);
        }
    }
}

/// The limit the daemon passes in ROLLBOX_MEMORY_MIB, in bytes (0: none).
pub fn limit_from_env(value: Option<&[u8]>) -> u64 {
    value.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0) << 20
}
