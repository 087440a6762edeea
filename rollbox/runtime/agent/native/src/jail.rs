//! One cgroup per exec inside gVisor's kernel: the set of processes an exec started, which
//! none of them can leave by `setsid`, `env -i` or double forks (an environment marker could
//! be cleared), a pids limit per exec (a fork bomb stops at it and the agent keeps room for
//! its own threads), and each exec's memory use for the OOM watcher (`memwatch.rs`).
//!
//! Measured with runsc 20240729 (systrap): gVisor's cgroupfs mounts one v1 hierarchy per
//! controller (pids, memory, ...) for a caller holding CAP_SYS_ADMIN; child cgroups work,
//! pids.max is enforced ("Cannot fork"), memory.usage_in_bytes is per cgroup and hierarchical
//! (memory.limit_in_bytes is accepted but not enforced). The hierarchies are mounted at start
//! on a scratch directory, opened, and detached at once, so no command finds them in its
//! mount table; the agent reaches them through its own descriptors (/proc/self/fd/N/...).
//! A new process enters its exec's cgroups before its first instruction: the spawning thread
//! moves itself in (`tasks`), spawns (the child inherits the thread's cgroups) and moves back.
//! gVisor lets a root process open /proc/1/fd/N of the non-dumpable agent (no ptrace check,
//! measured: commands lack CAP_SYS_PTRACE and still open them), so a command can move itself
//! into a hierarchy's root through the agent's descriptors. The memory watcher's every look
//! (memwatch.rs) kills such escapees (`kill_escaped`): in the root cgroups only the agent and
//! the container zygote live (episode containers' processes are in PID namespaces of their
//! own). A cgroup the agent did not make (a command's `mkdir` there, to hide in) is foreign:
//! every few looks its processes are killed and it is removed. A child cgroup a command makes
//! inside its own exec's belongs to that exec (counted, killed and removed with it). A command
//! moving itself into another running exec's cgroup instead is not caught: it is killed with
//! that exec's timeout, but outlives it as one of its background processes when that exec
//! returns normally (break-it trial). A returned exec's cgroups are removed by the keeper
//! thread after its reply (gVisor's cgroupfs costs ~1 ms per cgroup removed). Making the next
//! exec's cgroups ahead there too measured slower: the checks that a command had not moved
//! into them, re-limited or removed them cost more than making them.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use once_cell::sync::OnceCell as OnceLock;

use crate::sys;

struct Hierarchies {
    pids: File,
    memory: Option<File>,
}

static HIER: OnceLock<Option<Hierarchies>> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(1);
/// Exec marks (`MARK=value`) to their cgroup's name: how `kill_tree(pid, needle)` finds it.
static BY_MARK: OnceLock<Mutex<HashMap<Vec<u8>, String>>> = OnceLock::new();
/// Cgroups whose exec returned while something of it still ran (`sh -c 'server &'`): removed
/// once empty.
static STALE: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
/// Cgroups whose processes the memory watcher killed.
static OOM: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
/// The most tasks the watcher saw in each running exec's cgroup (a fork bomb's sign).
static PEAK: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
/// Processes that live in the root cgroups by design (the zygote), besides the agent.
static EXEMPT: OnceLock<Mutex<Vec<sys::pid_t>>> = OnceLock::new();
/// Set once something was started outside any exec cgroup (a refused cgroup, a privileged
/// sandbox whose commands may move processes themselves): nothing then tells such a process
/// from an escaped one, so `kill_escaped` stops.
static UNJAILED: AtomicBool = AtomicBool::new(false);
/// The cgroups the agent made (named before they exist, so no look finds one unnamed).
static MADE: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
/// PID namespaces other than the agent's, by their link, to whether their processes descend
/// from the zygote (episode containers: spared) or not (a command's own: escaped).
static NS_VERDICTS: OnceLock<Mutex<HashMap<std::path::PathBuf, bool>>> = OnceLock::new();

fn made() -> &'static Mutex<HashSet<String>> {
    MADE.get_or_init(|| Mutex::new(HashSet::new()))
}

fn exempted() -> &'static Mutex<Vec<sys::pid_t>> {
    EXEMPT.get_or_init(|| Mutex::new(Vec::new()))
}

/// `pid` lives in the root cgroups by design (not an escapee).
pub fn exempt(pid: sys::pid_t) {
    exempted().lock().unwrap().push(pid);
}

/// Something was started outside the exec cgroups: escapees can no longer be told apart.
pub fn note_unjailed() {
    UNJAILED.store(true, Ordering::Relaxed);
}

fn parent_of(pid: sys::pid_t) -> Option<sys::pid_t> {
    let stat = fs::read_to_string(format!("/proc/{}/stat", pid)).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so from the last ')'.
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// SIGKILLs the processes of the agent's PID namespace found in a hierarchy's root cgroup
/// that are neither the agent nor exempt (nor descended from an exempt one): commands that
/// left their exec's cgroups through the agent's descriptors. Returns how many. `all`: the
/// memory hierarchy's root too (the caller asks every few looks: each read is syscalls an idle
/// ptrace sandbox pays for; leaving the pids cgroup is what escapes a timeout).
pub fn kill_escaped(all: bool) -> usize {
    static MY_NS: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    let h = match hier() { Some(h) if !UNJAILED.load(Ordering::Relaxed) => h, _ => return 0 };
    let me = unsafe { sys::getpid() };
    let my_ns = MY_NS.get_or_init(|| fs::read_link("/proc/self/ns/pid").ok());
    let mut killed = 0;
    for d in dirs(h).take(if all { 2 } else { 1 }) {
        if all {
            killed += kill_foreign(d, me);
        }
        let pids: Vec<sys::pid_t> = read_pids(d, "cgroup.procs").into_iter().filter(|&p| p != me).collect();
        if pids.is_empty() {
            continue;
        }
        let exempt = exempted().lock().unwrap().clone();
        // Some(whether `pid` descends from an exempt process); None when a process of the
        // chain ended meanwhile (no verdict then: nothing is killed or remembered).
        let descends = |pid: sys::pid_t| -> Option<bool> {
            let mut p = pid;
            for _ in 0..64 {
                p = parent_of(p)?;
                if exempt.contains(&p) {
                    return Some(true);
                }
                if p <= 1 {
                    return Some(false);
                }
            }
            Some(false)
        };
        for pid in pids {
            if exempt.contains(&pid) {
                continue; // the zygote
            }
            let ns = fs::read_link(format!("/proc/{}/ns/pid", pid)).ok();
            if &ns != my_ns {
                // A PID namespace of its own: an episode container's (the zygote made it) is
                // spared, one a command made (`unshare -Urpf`) is not. One walk per namespace.
                let mut verdicts = NS_VERDICTS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap();
                if verdicts.len() > 4096 {
                    verdicts.clear();
                }
                let key = match ns { Some(ns) => ns, None => continue }; // it ended
                let spared = match verdicts.get(&key) {
                    Some(&v) => v,
                    None => match descends(pid) {
                        Some(v) => {
                            verdicts.insert(key, v);
                            v
                        }
                        None => continue,
                    },
                };
                if spared {
                    continue;
                }
            } else if descends(pid) != Some(false) {
                continue;
            }
            unsafe { sys::kill(pid, sys::SIGKILL) };
            killed += 1;
        }
    }
    killed
}

/// Kills the processes of every cgroup under hierarchy `d`'s root that the agent did not make
/// (and their child cgroups'), then removes them. Returns how many processes were signalled.
fn kill_foreign(d: &File, me: sys::pid_t) -> usize {
    let rd = match fs::read_dir(path(d, "")) { Ok(rd) => rd, _ => return 0 };
    let foreign: Vec<String> = {
        let made = made().lock().unwrap();
        rd.flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| !made.contains(n))
            .collect()
    };
    let exempt = exempted().lock().unwrap().clone();
    let mut killed = 0;
    for name in foreign {
        for _ in 0..3 {
            let mut n = 0;
            for rel in subtree(d, &name) {
                for p in read_pids(d, &format!("{}/cgroup.procs", rel)) {
                    if p != me && !exempt.contains(&p) {
                        unsafe { sys::kill(p, sys::SIGKILL) };
                        n += 1;
                    }
                }
            }
            killed += n;
            if n == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5)); // let the killed leave it
        }
        for rel in subtree(d, &name) {
            let _ = fs::remove_dir(path(d, &rel));
        }
    }
    killed
}

/// Cgroup `rel` of hierarchy `f` and the cgroups under it, each child before its parent (the
/// order rmdir needs). No cap: a process hidden behind thousands of cgroups a command made
/// must still be found (a cap let one outlive its timeout; break-it trial); the walk costs
/// only the sandbox that made them.
fn subtree(f: &File, rel: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![rel.to_string()];
    while let Some(r) = todo.pop() {
        if let Ok(rd) = fs::read_dir(path(f, &r)) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    if let Some(n) = e.file_name().to_str() {
                        todo.push(format!("{}/{}", r, n));
                    }
                }
            }
        }
        out.push(r);
    }
    out.reverse(); // pre-order reversed: every child before its parent
    out
}

/// Cgroups an exec's reply path walks at most: a command can make cgroups without bound
/// (7,000 in a loop delayed its own timed-out exec's reply by 10 s and more: gVisor's
/// cgroupfs costs ~1 ms per cgroup walked or removed); beyond this its processes are found
/// through /proc (bounded by the pids limit) and its cgroups removed by a thread of their own.
const WALK_MAX: usize = 256;

/// `subtree`, or None once it would hold more than `max` cgroups.
fn subtree_upto(f: &File, rel: &str, max: usize) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut todo = vec![rel.to_string()];
    while let Some(r) = todo.pop() {
        if let Ok(rd) = fs::read_dir(path(f, &r)) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    if let Some(n) = e.file_name().to_str() {
                        todo.push(format!("{}/{}", r, n));
                    }
                }
            }
        }
        out.push(r);
        if out.len() + todo.len() > max {
            return None;
        }
    }
    out.reverse();
    Some(out)
}

/// The processes whose pids cgroup is `name` or one under it, from /proc/PID/cgroup: one read
/// per process of the sandbox, however many cgroups there are.
fn members_by_proc(name: &str) -> Vec<sys::pid_t> {
    let top = format!("/{}", name);
    let under = format!("/{}/", name);
    let rd = match fs::read_dir("/proc") { Ok(rd) => rd, _ => return Vec::new() };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let pid: sys::pid_t = match e.file_name().to_str().and_then(|n| n.parse().ok()) { Some(p) => p, None => continue };
        let text = match fs::read_to_string(format!("/proc/{}/cgroup", pid)) { Ok(t) => t, _ => continue };
        // "ID:CONTROLLERS:PATH" per hierarchy.
        let inside = text.lines().any(|line| {
            let mut f = line.splitn(3, ':');
            let (_, ctl, p) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
            ctl.split(',').any(|c| c == "pids") && (p == top || p.starts_with(&under))
        });
        if inside {
            out.push(pid);
        }
    }
    out
}

/// Work off the reply path, done in order by one thread (the keeper), so a kill runs before
/// the removal after it.
#[derive(Clone, PartialEq)]
enum Job {
    /// SIGKILL what the cgroups of this tree list until none is left (a large tree).
    Kill(String),
    /// Remove this tree (a returned exec's: gVisor's cgroupfs costs ~1 ms per cgroup removed,
    /// which each reply used to wait for); kept as stale while something runs there.
    Remove(String),
}

fn deferred() -> &'static (Mutex<std::collections::VecDeque<Job>>, std::sync::Condvar) {
    static D: OnceLock<(Mutex<std::collections::VecDeque<Job>>, std::sync::Condvar)> = OnceLock::new();
    D.get_or_init(|| (Mutex::new(std::collections::VecDeque::new()), std::sync::Condvar::new()))
}

/// Hands `job` to the keeper thread (started on first use). False when no thread can be made
/// (a fork bomb holds every process): the caller then does it itself.
fn defer(job: Job) -> bool {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if !STARTED.swap(true, Ordering::SeqCst) {
        let ok = std::thread::Builder::new().stack_size(256 << 10).spawn(|| loop {
            let job = {
                let (q, cv) = deferred();
                let mut q = q.lock().unwrap();
                loop {
                    if let Some(job) = q.pop_front() {
                        break job;
                    }
                    q = cv.wait(q).unwrap();
                }
            };
            match job {
                Job::Kill(name) => kill_walked(&name),
                Job::Remove(name) => {
                    if !remove_all(&name) {
                        stale().lock().unwrap().push(name); // something still runs there: swept later
                    }
                }
            }
        }).is_ok();
        if !ok {
            STARTED.store(false, Ordering::SeqCst);
            return false;
        }
    }
    let (q, cv) = deferred();
    let mut q = q.lock().unwrap();
    if !q.contains(&job) {
        q.push_back(job); // not twice: a sweep hands a stale one on at every exec
        cv.notify_one();
    }
    true
}

/// SIGKILLs what the cgroups of `name`'s whole tree list until none is left (a walk of a
/// large tree takes ~0.1 ms per cgroup in gVisor).
fn kill_walked(name: &str) {
    let h = match hier() { Some(h) => h, _ => return };
    for _ in 0..100 {
        let pids = procs_of(&h.pids, &subtree(&h.pids, name));
        if pids.is_empty() {
            return;
        }
        for p in &pids {
            unsafe { sys::kill(*p, sys::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Jails made so far, and a wake-up for the watcher that waits while none is live.
fn made_count() -> &'static (Mutex<u64>, std::sync::Condvar) {
    static W: OnceLock<(Mutex<u64>, std::sync::Condvar)> = OnceLock::new();
    W.get_or_init(|| (Mutex::new(0), std::sync::Condvar::new()))
}

/// For the watcher: when no exec or background process has cgroups (no command runs, so none
/// can escape, bomb or grow), waits up to `quiet` or until the next jail is made, and says
/// true; false at once otherwise. Each look wakes the sandbox (an idle systrap sandbox paid
/// ~1 % of a core more for looks every 0.1 s).
pub fn wait_while_quiet(quiet: std::time::Duration) -> bool {
    let (m, cv) = made_count();
    let seen = *m.lock().unwrap();
    if !live().is_empty() {
        return false;
    }
    let g = m.lock().unwrap();
    if *g == seen {
        let _ = cv.wait_timeout(g, quiet).unwrap();
    }
    true
}

fn peaks() -> &'static Mutex<HashMap<String, usize>> {
    PEAK.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Records the running execs' task counts (called by the watcher on each look).
pub fn note_peaks() {
    let names: Vec<String> = by_mark().lock().unwrap().values().cloned().collect();
    for name in names {
        let n = task_count(&name);
        let mut p = peaks().lock().unwrap();
        let slot = p.entry(name).or_insert(0);
        *slot = (*slot).max(n);
    }
}

/// The most tasks seen in cgroup `name` while its exec ran.
pub fn peak(name: &str) -> usize {
    peaks().lock().unwrap().get(name).copied().unwrap_or(0)
}

fn by_mark() -> &'static Mutex<HashMap<Vec<u8>, String>> {
    BY_MARK.get_or_init(|| Mutex::new(HashMap::new()))
}

fn stale() -> &'static Mutex<Vec<String>> {
    STALE.get_or_init(|| Mutex::new(Vec::new()))
}

fn oom_set() -> &'static Mutex<HashSet<String>> {
    OOM.get_or_init(|| Mutex::new(HashSet::new()))
}

fn mount_detached(controller: &str) -> Option<File> {
    let dir = format!("/dev/.rollbox-cg-{}", controller);
    let _ = fs::create_dir(&dir);
    let target = CString::new(dir.clone()).ok()?;
    let opts = CString::new(controller).ok()?;
    let rc = unsafe {
        sys::mount(b"cgroup\0".as_ptr() as *const _, target.as_ptr(), b"cgroup\0".as_ptr() as *const _, 0,
                   opts.as_ptr() as *const _)
    };
    let file = if rc == 0 { File::open(&dir).ok() } else { None };
    if rc == 0 {
        unsafe { sys::umount2(target.as_ptr(), sys::MNT_DETACH) };
    }
    let _ = fs::remove_dir(&dir);
    file
}

/// Mounts the hierarchies; call once at start, while holding CAP_SYS_ADMIN and before any
/// command runs. Without a pids hierarchy (an older gVisor, a mount refused) execs fall back
/// to the environment marker.
pub fn init() -> bool {
    HIER.get_or_init(|| {
        let pids = mount_detached("pids")?;
        Some(Hierarchies { pids, memory: mount_detached("memory") })
    })
    .is_some()
}

/// True when execs get cgroups (init found the hierarchies).
pub fn active() -> bool {
    hier().is_some()
}

fn hier() -> Option<&'static Hierarchies> {
    HIER.get().and_then(|h| h.as_ref())
}

fn path(f: &File, rel: &str) -> String {
    if rel.is_empty() {
        format!("/proc/self/fd/{}", f.as_raw_fd())
    } else {
        format!("/proc/self/fd/{}/{}", f.as_raw_fd(), rel)
    }
}

fn dirs(h: &Hierarchies) -> impl Iterator<Item = &File> {
    std::iter::once(&h.pids).chain(h.memory.iter())
}

fn read_pids(f: &File, rel: &str) -> Vec<sys::pid_t> {
    fs::read_to_string(path(f, rel)).unwrap_or_default().split_whitespace().filter_map(|s| s.parse().ok()).collect()
}

/// One exec's (or background process's) cgroups, by name.
pub struct Jail {
    pub name: String,
}

impl Jail {
    /// Makes the cgroups, with at most `pids_max` tasks (0: no own limit). None without
    /// hierarchies or when the kernel refuses (the caller then relies on the marker).
    pub fn create(pids_max: usize, mark: &[u8]) -> Option<Jail> {
        let h = hier()?;
        sweep();
        // A random part in the name: a command cannot make the next exec's cgroup ahead of
        // the agent (which would leave that exec unjailed and stop `kill_escaped` for good).
        let mut name = String::new();
        for _ in 0..4 {
            let mut r = [0u8; 8];
            sys::random(&mut r);
            let n = format!("x{}-{:016x}", NEXT.fetch_add(1, Ordering::Relaxed), u64::from_ne_bytes(r));
            made().lock().unwrap().insert(n.clone());
            if fs::create_dir(path(&h.pids, &n)).is_ok() {
                name = n;
                break;
            }
            made().lock().unwrap().remove(&n);
        }
        if name.is_empty() {
            return None;
        }
        if let Some(m) = &h.memory {
            let _ = fs::create_dir(path(m, &name));
        }
        if pids_max > 0 {
            let _ = fs::write(path(&h.pids, &format!("{}/pids.max", name)), pids_max.to_string());
        }
        by_mark().lock().unwrap().insert(mark.to_vec(), name.clone());
        let (m, cv) = made_count();
        *m.lock().unwrap() += 1;
        cv.notify_all();
        Some(Jail { name })
    }

    /// Runs `spawn` with the calling thread inside this cgroup, so what it starts is born
    /// there; the thread moves back to the root after. Spawns are serialised by the reaper's
    /// lock, so no other start shares the window.
    pub fn spawn_inside<T>(&self, spawn: impl FnOnce() -> T) -> T {
        let h = match hier() { Some(h) => h, _ => return spawn() };
        let tid = unsafe { sys::gettid() }.to_string();
        for d in dirs(h) {
            let _ = fs::write(path(d, &format!("{}/tasks", self.name)), &tid);
        }
        let out = spawn();
        for d in dirs(h) {
            let _ = fs::write(path(d, "tasks"), &tid);
        }
        out
    }

    /// Ends the exec's bookkeeping: the cgroups go after the reply (the keeper thread; now when
    /// no thread can be made), once empty if something of the exec still runs.
    pub fn release(self, mark: &[u8]) {
        by_mark().lock().unwrap().remove(mark);
        oom_set().lock().unwrap().remove(&self.name);
        peaks().lock().unwrap().remove(&self.name);
        if !defer(Job::Remove(self.name.clone())) && !remove(&self.name) {
            stale().lock().unwrap().push(self.name);
        }
    }
}

/// Removes cgroup `name` and what a command made under it; true when it is gone (or, too
/// large to walk here, handed to the keeper thread).
fn remove(name: &str) -> bool {
    let h = match hier() { Some(h) => h, _ => return true };
    if subtree_upto(&h.pids, name, WALK_MAX).is_none() && defer(Job::Remove(name.to_string())) {
        return true;
    }
    remove_all(name)
}

fn remove_all(name: &str) -> bool {
    let h = match hier() { Some(h) => h, _ => return true };
    for rel in subtree(&h.pids, name) {
        let _ = fs::remove_dir(path(&h.pids, &rel)); // child cgroups a command made first
    }
    let gone = fs::metadata(path(&h.pids, name)).is_err();
    if gone {
        if let Some(m) = &h.memory {
            for rel in subtree(m, name) {
                let _ = fs::remove_dir(path(m, &rel));
            }
        }
        made().lock().unwrap().remove(name);
    }
    gone
}

/// Removes the cgroups of returned execs whose last process has ended.
fn sweep() {
    let mut st = stale().lock().unwrap();
    st.retain(|name| !remove(name));
}

/// The cgroup registered for an exec mark, if any.
pub fn for_mark(mark: &[u8]) -> Option<String> {
    by_mark().lock().unwrap().get(mark).cloned()
}

/// The pids in cgroup `name` and in the child cgroups its commands made (threads' process
/// ids, once each).
pub fn members(name: &str) -> Vec<sys::pid_t> {
    let h = match hier() { Some(h) => h, _ => return Vec::new() };
    match subtree_upto(&h.pids, name, WALK_MAX) {
        Some(rels) => procs_of(&h.pids, &rels),
        None => {
            let mut all = members_by_proc(name);
            all.extend(procs_of(&h.pids, &subtree(&h.pids, name)));
            all.sort_unstable();
            all.dedup();
            all
        }
    }
}

/// About how many processes cgroup `name`'s tree holds, without walking a large one (a
/// process whose main thread exited is missed then: for reports only).
pub fn count_members(name: &str) -> usize {
    let h = match hier() { Some(h) => h, _ => return 0 };
    match subtree_upto(&h.pids, name, WALK_MAX) {
        Some(rels) => procs_of(&h.pids, &rels).len(),
        None => members_by_proc(name).len(),
    }
}

fn procs_of(f: &File, rels: &[String]) -> Vec<sys::pid_t> {
    rels.iter().flat_map(|rel| read_pids(f, &format!("{}/cgroup.procs", rel))).collect()
}

/// Tasks counted in cgroup `name` (pids.current).
pub fn task_count(name: &str) -> usize {
    hier().and_then(|h| fs::read_to_string(path(&h.pids, &format!("{}/pids.current", name))).ok())
        .and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// SIGKILLs every member of cgroup `name`; the number signalled (the caller tries again
/// until none is left). A tree too large to walk on the reply path (a command can make
/// cgroups without bound: 8,000 took 0.75 s per walk) is looked up in /proc instead; once
/// /proc shows none of its processes, the keeper thread walks the cgroups' own lists and
/// kills what they still hold: gVisor lists a process whose main thread exited in no /proc
/// directory, only in its cgroup.procs (break-it trial).
pub fn kill_members(name: &str) -> usize {
    let pids = killable(name);
    for p in &pids {
        unsafe { sys::kill(*p, sys::SIGKILL) };
    }
    pids.len()
}

/// The members of cgroup `name` that `kill_members` signals, found the same way (a large tree
/// through /proc, its hidden processes by the keeper thread).
pub fn killable(name: &str) -> Vec<sys::pid_t> {
    let h = match hier() { Some(h) => h, _ => return Vec::new() };
    match subtree_upto(&h.pids, name, WALK_MAX) {
        Some(rels) => procs_of(&h.pids, &rels),
        None => {
            let seen = members_by_proc(name);
            if seen.is_empty() && !defer(Job::Kill(name.to_string())) {
                kill_walked(name);
            }
            seen
        }
    }
}

/// Bytes charged to cgroup `name` ("" for the whole sandbox); None without a memory hierarchy.
pub fn memory_usage(name: &str) -> Option<u64> {
    let m = hier()?.memory.as_ref()?;
    let rel = if name.is_empty() { "memory.usage_in_bytes".to_string() } else { format!("{}/memory.usage_in_bytes", name) };
    fs::read_to_string(path(m, &rel)).ok()?.trim().parse().ok()
}

/// The live cgroups (execs and background processes), by name.
pub fn live() -> Vec<String> {
    let mut names: Vec<String> = by_mark().lock().unwrap().values().cloned().collect();
    names.extend(stale().lock().unwrap().iter().cloned());
    names
}

/// Cgroups of returned execs (what they left running), by name.
pub fn returned() -> Vec<String> {
    stale().lock().unwrap().clone()
}

pub fn mark_oom(name: &str) {
    oom_set().lock().unwrap().insert(name.to_string());
}

/// True when the memory watcher killed this cgroup's processes.
pub fn was_oom_killed(name: &str) -> bool {
    oom_set().lock().unwrap().contains(name)
}
