"""Namespaces, mounts and capabilities for episode containers (zygote.py), through libc.

Every number here is Linux's ABI (linux/sched.h, linux/mount.h, linux/capability.h,
asm/unistd_64.h for x86-64); gVisor implements these calls in its own kernel (measured
2026-12-01: clone with new PID/mount/IPC/UTS/net namespaces, overlay with lowerdir=/,
pivot_root, and setns for mount/UTS/IPC/net work; setns of a PID namespace is EINVAL).
"""

import ctypes
import fcntl
import os
import resource
import socket
import struct

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
CONTAINER_FLAGS = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
SYS_CLONE, SYS_PIVOT_ROOT, SYS_CAPSET = 56, 155, 126
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 24, 38, 1, 4
# Docker's default capability set (bundle.DEFAULT_CAPS), by number.
DEFAULT_CAPS = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31)
LAST_CAP = 40
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# Where the zygote (in a mount namespace of its own) mounts each container's filesystem.
BASE = "/mnt"

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def check(rc, what):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return rc


def mount(src, target, fstype, flags=0, data=None):
    check(libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                     flags, data.encode() if data else None), "mount %s on %s" % (fstype or src, target))


def umount(target):
    libc.umount2(target.encode(), MNT_DETACH)


def clone_container():
    """fork() into new PID, mount, IPC, UTS and network namespaces: 0 in the child."""
    import signal
    pid = libc.syscall(SYS_CLONE, CONTAINER_FLAGS | signal.SIGCHLD, 0, 0, 0, 0)
    return check(pid, "clone")


MS_REMOUNT = 32
DEV_TEMPLATE = BASE + "/.dev"


def private_mounts():
    """The zygote's own mount namespace, with a small tmpfs at BASE for container roots and a
    /dev template every container binds read-only (one mount instead of eight per container)."""
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("rollbox-containers", BASE, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700")
    os.mkdir(DEV_TEMPLATE)
    mount("rollbox-dev", DEV_TEMPLATE, "tmpfs", MS_NOSUID, "size=16k,mode=0755")
    for name in DEVICES:
        target = DEV_TEMPLATE + "/" + name
        open(target, "w").close()
        mount("/dev/" + name, target, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, DEV_TEMPLATE + "/" + name)
    for d in ("shm", "pts"):
        os.mkdir(DEV_TEMPLATE + "/" + d)


def make_filesystem(cid, root_mib):
    """The container's root, in the zygote's mount namespace (so it outlives the container's
    inits): an overlay whose lower is the pooled sandbox's root as a directory tree (its
    submounts - /proc, /dev, the agent's /.rollbox, volumes - are not part of it) and whose
    upper is a tmpfs of `root_mib` MiB (writes past it: ENOSPC). Returns the root path."""
    top = "%s/%s" % (BASE, cid)
    os.mkdir(top)
    mount("rollbox-ctr", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=0700" % root_mib)
    for d in ("u", "w", "m"):
        os.mkdir(top + "/" + d)
    mount("overlay", top + "/m", "overlay", 0, "lowerdir=/,upperdir=%s/u,workdir=%s/w" % (top, top))
    return top + "/m"


def write_file_in_root(root, req, mounts=()):
    """agent.op_write_file for a container whose root is `root` (a path in the zygote's
    mount namespace), walking the path one component at a time with O_NOFOLLOW so that no
    symlink a container left can lead the write out of its root. Returns the size written,
    or None when the request is not a plain write of an absolute path without `.`/`..`
    components or a symlink stands in the way (the container's init resolves those). Raises
    OSError as the init would (the caller then lets the init report it). `mounts`: paths
    the container has other filesystems on (/dev, /proc, its volumes): writes there are the
    init's, which sees them (here they would land in the overlay underneath)."""
    path = req.get("path")
    data = req.get("data")
    if req.get("upload") is not None or not isinstance(path, str) or not isinstance(data, str) \
            or not path.startswith("/") or "\0" in path or path.endswith("/"):
        return None
    parts = [p for p in path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        return None
    norm = "/" + "/".join(parts)
    if any(norm == m or norm.startswith(m.rstrip("/") + "/") for m in mounts):
        return None
    import base64
    import errno
    payload = base64.b64decode(data)
    fd = os.open(root, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(name, 0o777, dir_fd=fd)  # os.makedirs' mode, under our umask
                nxt = os.open(name, O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    return None  # a symlink (or a file) on the way: the init's view decides
                raise
            os.close(fd)
            fd = nxt
        # A fresh name, created exclusively: nothing a container planted (a FIFO that would
        # block this single-threaded zygote, a symlink) can be opened in its place.
        tmp = "%s.rollbox-tmp-%s" % (parts[-1], os.urandom(8).hex())
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                      0o644, dir_fd=fd)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(out, view):]
            os.fchmod(out, int(req.get("mode") or 0o644))
        except BaseException:
            os.close(out)
            os.unlink(tmp, dir_fd=fd)
            raise
        os.close(out)
        try:
            os.rename(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            os.unlink(tmp, dir_fd=fd)
            raise
        return len(payload)
    finally:
        os.close(fd)


O_PATH = getattr(os, "O_PATH", 0o10000000)


def remove_filesystem(cid):
    top = "%s/%s" % (BASE, cid)
    umount(top + "/m")
    umount(top)
    try:
        os.rmdir(top)
    except OSError:
        pass


# Processes (gVisor counts every task of the sandbox, threads included) a container may have
# running when it forks: under the sandbox's own RLIMIT_NPROC (512, bundle.py), so a fork
# bomb in one container stops there and leaves the zygote room to serve its neighbours.
CONTAINER_NPROC = 48
# A command killed at its timeout with at least this many processes in its container filled
# the limit above (a fork bomb): reported `pids_limited`.
CONTAINER_PIDS_REPORT_AT = max(16, CONTAINER_NPROC // 2)


_LO_UP = struct.pack("16sH14s", b"lo", 0x1 | 0x40, b"\0" * 14)


def enter_root(new, shm_mib, hostname, as_mib=None, nproc=CONTAINER_NPROC, binds=(), confine=None, cgroup=None):
    """In a freshly cloned init: its own /proc, /dev and /dev/shm, pivot_root into `new`, the
    host name, loopback up, then Docker's default capabilities only, and (as_mib) an address
    space limit so that one container's allocation fails inside it (Python: MemoryError)
    instead of running the whole pooled sandbox out of memory (gVisor's limit is per sandbox).
    `confine`: the zygote's Confinement (None: drop every non-default capability, no filter);
    `cgroup`: the container's pids cgroup directory (Confinement.make_cgroup), or None."""
    confine = confine or Confinement()
    if cgroup is not None:  # first, so that every process of the container is counted there
        with open(cgroup + "/cgroup.procs", "w") as f:
            f.write("0")
    # No MS_REC|MS_PRIVATE remount here (~2 ms of a fork's page faults under gVisor): the
    # zygote made its namespace private (private_mounts) before any container root, and a
    # namespace cloned from it copies private mounts as private. pivot_root below refuses
    # (EINVAL) a shared root, so a regression would fail every container, not leak mounts.
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if confine.host_kernel:
        mask_proc(new + "/proc")
    # The template, read-only (so nothing written to /dev reaches the next container; the
    # device nodes are mounts of their own and stay writable), then a fresh /dev/shm.
    mount(DEV_TEMPLATE, new + "/dev", None, MS_BIND | MS_REC)
    mount(None, new + "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    mount("rollbox-shm", new + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=1777" % shm_mib)
    for path in binds:  # the pooled sandbox's volumes, shared read-write
        os.makedirs(new + path, exist_ok=True)
        mount(path, new + path, None, MS_BIND | MS_REC)
    # gVisor's overlay shows the lower's submounts too: hide the agent's directory.
    if os.path.isdir(new + "/.rollbox"):
        mount("rollbox-hidden", new + "/.rollbox", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k")
    # pivot_root, not chroot: the old root is unmounted, so there is nothing to escape back to.
    old = new + "/.rollbox-old-root"
    os.mkdir(old)
    check(libc.syscall(SYS_PIVOT_ROOT, new.encode(), old.encode()), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.rollbox-old-root", MNT_DETACH), "umount old root")
    os.rmdir("/.rollbox-old-root")
    if hostname:
        socket.sethostname(hostname)
    if confine.host_kernel:
        # Loopback up in the new network namespace (SIOCSIFFLAGS IFF_UP|IFF_RUNNING): Linux
        # makes it down. gVisor's kernel makes it up (measured in runsc 20240729: flags 0x49),
        # and the socket this takes would start the namespace's network stack (~3 ms of CPU
        # per container there) for programs that never use one.
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                fcntl.ioctl(s, 0x8914, _LO_UP)
        except OSError:
            pass
    os.umask(0o022)
    drop_capabilities(confine.bounding)  # no CAP_SYS_RESOURCE after this: the limit cannot be raised again
    if not confine.host_kernel:
        # On the host kernel RLIMIT_NPROC counts a uid's processes host-wide (and not root's
        # at all): the pooled runc sandbox's pids cgroup bounds a container's forks there.
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if as_mib:
        resource.setrlimit(resource.RLIMIT_AS, (as_mib << 20, as_mib << 20))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if confine.seccomp is not None:
        confine.seccomp.install()


# /proc paths that Docker (and the runc tier's spec, runtime/runc.py) hide or make read-only:
# on the host kernel a container's fresh /proc would otherwise show them, and /proc/sysrq-
# trigger is writable by any root process. Under gVisor they are its own, harmless files.
MASKED_PROC = ("acpi", "asound", "kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "scsi")
READONLY_PROC = ("bus", "fs", "irq", "sys", "sysrq-trigger")


def mask_proc(proc):
    """Masks and write-protects a fresh /proc as runc masks the sandbox's (Docker's lists)."""
    for name in MASKED_PROC:
        path = proc + "/" + name
        if os.path.isdir(path):
            mount("rollbox-masked", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
        elif os.path.exists(path):
            mount(DEV_TEMPLATE + "/null", path, None, MS_BIND)
    for name in READONLY_PROC:
        path = proc + "/" + name
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


class Confinement:
    """What every container of this zygote's sandbox gets beyond its namespaces.

    bounding: the non-default capabilities still in the zygote's bounding set, which each init
        drops (narrow_bounding_set's answer; None: every one).
    host_kernel: the pooled sandbox is a runc one (environment ROLLBOX_RUNTIME=runc): its
        containers run on the host kernel, so their /proc is masked as Docker's and they get
        the runc tier's seccomp denylist (`seccomp`), which the pooled sandbox relaxed for the
        zygote's mounts and namespaces.
    seccomp: a seccomp.Filter each init installs last, or None."""

    def __init__(self, bounding=None, host_kernel=False, seccomp=None, pids_cgroup=None):
        self.bounding = bounding
        self.host_kernel = host_kernel
        self.seccomp = seccomp
        self.pids_cgroup = pids_cgroup  # host_pids_cgroup()'s directory, or None

    def make_cgroup(self, cid):
        """The container's own pids cgroup (at most CONTAINER_TASKS_HOST tasks), on the host
        kernel only: there the pooled sandbox's limit is one pids cgroup for all, and a fork
        bomb in one container would leave its neighbours no fork. Returns its directory or
        None (under gVisor, RLIMIT_NPROC bounds each container)."""
        if self.pids_cgroup is None:
            return None
        d = self.pids_cgroup + "/" + cid
        try:
            os.mkdir(d)
            with open(d + "/pids.max", "w") as f:
                f.write(str(CONTAINER_TASKS_HOST))
        except OSError:
            return None
        return d

    def remove_cgroup(self, cid, wait_s=1.0):
        """Removes the container's cgroup once its killed tasks are gone. False if it stays
        (a task still in it: a leftover the caller reports)."""
        if self.pids_cgroup is None:
            return True
        import time
        d = self.pids_cgroup + "/" + cid
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(d)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)


# Tasks (threads included) one container may have on the host kernel: a share of the pooled
# runc sandbox's limit (`pids`, 512 by default), so a bomb in one leaves room for the rest.
CONTAINER_TASKS_HOST = 128
HOST_PIDS_DIR = BASE + "/.cgroup-pids"


def host_pids_cgroup():
    """Mounts the pids hierarchy (cgroup v1, as on this host; PLATFORM.md) in the zygote's
    mount namespace: runc gave the pooled sandbox a cgroup namespace, so its root is the
    sandbox's own cgroup. Returns the directory, or None when the kernel refuses (no
    per-container limit then: the sandbox's own still holds)."""
    try:
        os.mkdir(HOST_PIDS_DIR, 0o700)
        mount("cgroup", HOST_PIDS_DIR, "cgroup", MS_NOSUID | MS_NODEV | MS_NOEXEC, "pids")
    except OSError:
        return None
    return HOST_PIDS_DIR


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


def narrow_bounding_set(keep=(CAP_NET_ADMIN, CAP_SYS_ADMIN)):
    """Drops from this process's bounding set every capability outside Docker's default set
    but `keep` (what the zygote needs to make containers), once, so that each container's
    init has only `keep` left to drop (one prctl per capability is a trap into gVisor's
    kernel, in a fresh fork). Returns `keep`: the `bounding` to pass to enter_root."""
    for cap in range(LAST_CAP + 1):
        if cap not in DEFAULT_CAPS and cap not in keep:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for caps this kernel lacks: fine
    return tuple(keep)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _default_caps():
    mask = 0
    for cap in DEFAULT_CAPS:
        mask |= 1 << cap
    hdr = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    data = (_CapData * 2)(_CapData(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0), _CapData(mask >> 32, mask >> 32, 0))
    return hdr, data


# Built once in the zygote: a fork that made them would pay for the allocations page by page.
_CAPSET_ARGS = _default_caps()


def drop_capabilities(bounding=None):
    """Docker's default set only, bounding set included: no mount, unshare, pivot_root, ptrace.
    `bounding`: the non-default capabilities still in the bounding set (narrow_bounding_set's
    answer); None: every one is dropped."""
    for cap in range(LAST_CAP + 1) if bounding is None else bounding:
        if cap not in DEFAULT_CAPS:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for caps this kernel lacks: fine
    hdr, data = _CAPSET_ARGS
    check(libc.syscall(SYS_CAPSET, ctypes.byref(hdr), ctypes.byref(data)), "capset")


def pid_namespace(pid):
    """`pid`'s PID namespace, as its /proc link names it ("pid:[N]"; None when it is gone).
    Not stat()'s inode: under gVisor every /proc/PID/ns/pid file has an inode of its own."""
    try:
        return os.readlink("/proc/%d/ns/pid" % pid)
    except OSError:
        return None
