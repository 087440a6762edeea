"""A seccomp filter for episode containers on the runc tier, installed by each container's
init (nsutil.enter_root) before any command of the episode runs.

Why: a pooled runc sandbox must let its zygote mount, unshare and pivot_root to make
containers, so its own seccomp profile (runtime/runc.py) allows those calls; every container
then narrows itself back to the runc tier's Docker-default-style denylist with this filter.
Filters stack (the kernel applies the strictest answer of all), and one installed under
no_new_privs can never be removed, by the container or anything it starts.

The program is classic BPF over `struct seccomp_data` (linux/seccomp.h: nr at offset 0, arch
at 4, args at 16); the syscall numbers are x86-64's (asm/unistd_64.h). Any other ABI (i386
through int 0x80, x32) gets EPERM for every call: their numbers differ and nothing here needs
them. Stdlib only: it runs under the image's python3.
"""

import ctypes
import os
import struct

# Runtime/runc.py's DENIED_SYSCALLS, by x86-64 number (the names x86-64 lacks are left out:
# stime, umount, vm86, vm86old).
DENIED = {
    "acct": 163, "add_key": 248, "bpf": 321, "clock_adjtime": 305, "clock_settime": 227, "create_module": 174,
    "delete_module": 176, "finit_module": 313, "fanotify_init": 300, "fsconfig": 431, "fsmount": 432,
    "fsopen": 430, "fspick": 433, "get_kernel_syms": 177, "get_mempolicy": 239, "init_module": 175,
    "ioperm": 173, "iopl": 172, "kcmp": 312, "kexec_file_load": 320, "kexec_load": 246, "keyctl": 250,
    "lookup_dcookie": 212, "mbind": 237, "mount": 165, "mount_setattr": 442, "move_mount": 429,
    "move_pages": 279, "name_to_handle_at": 303, "nfsservctl": 180, "open_by_handle_at": 304, "open_tree": 428,
    "perf_event_open": 298, "pivot_root": 155, "process_vm_readv": 310, "process_vm_writev": 311, "ptrace": 101,
    "query_module": 178, "quotactl": 179, "reboot": 169, "request_key": 249, "set_mempolicy": 238, "setns": 308,
    "settimeofday": 164, "swapoff": 168, "swapon": 167, "sysfs": 139, "_sysctl": 156, "syslog": 103,
    "umount2": 166, "unshare": 272, "uselib": 134, "userfaultfd": 323, "ustat": 136, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427,
}
NR_CLONE, NR_CLONE3 = 56, 435
# clone() flags that make namespaces (linux/sched.h): the container has none to make.
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


def _insn(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


def program():
    """The filter as bytes of `struct sock_filter` (8 bytes per instruction)."""
    body = [_insn(LD_W_ABS, 0, 0, 4)]  # arch
    # The instructions after it, symbolically; jumps are resolved against the three returns.
    insns = [("jeq_arch",), ("ld_nr",), ("x32",)] + [("deny", nr) for nr in sorted(set(DENIED.values()))] + [
        ("clone3",), ("clone",), ("ld_flags",), ("ns_flags",), ("allow",), ("eperm",), ("enosys",)]
    eperm_at = len(insns) - 2
    enosys_at = len(insns) - 1
    allow_at = len(insns) - 3
    for i, ins in enumerate(insns):
        to = lambda target: target - i - 1  # noqa: E731 - a jump offset from the next insn
        op = ins[0]
        if op == "jeq_arch":
            body.append(_insn(JEQ_K, 0, to(eperm_at), AUDIT_ARCH_X86_64))
        elif op == "ld_nr":
            body.append(_insn(LD_W_ABS, 0, 0, 0))
        elif op == "x32":
            body.append(_insn(JGE_K, to(eperm_at), 0, X32_SYSCALL_BIT))
        elif op == "deny":
            body.append(_insn(JEQ_K, to(eperm_at), 0, ins[1]))
        elif op == "clone3":  # ENOSYS: libc falls back to clone, which is checked below
            body.append(_insn(JEQ_K, to(enosys_at), 0, NR_CLONE3))
        elif op == "clone":
            body.append(_insn(JEQ_K, 0, to(allow_at), NR_CLONE))
        elif op == "ld_flags":
            body.append(_insn(LD_W_ABS, 0, 0, 16))  # args[0], its low 32 bits (the flags)
        elif op == "ns_flags":
            body.append(_insn(JSET_K, to(eperm_at), 0, CLONE_NS_FLAGS))
        elif op == "allow":
            body.append(_insn(RET_K, 0, 0, RET_ALLOW))
        elif op == "eperm":
            body.append(_insn(RET_K, 0, 0, RET_ERRNO | EPERM))
        else:
            body.append(_insn(RET_K, 0, 0, RET_ERRNO | ENOSYS))
    return b"".join(body)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class Filter:
    """The built program, ready to install (built once, in the zygote: a fork that built it
    would pay for the allocations page by page)."""

    def __init__(self):
        self.code = program()
        self.prog = _SockFprog(len(self.code) // 8, self.code)
        self.libc = ctypes.CDLL(None, use_errno=True)

    def install(self):
        """Installs the filter on this thread (after PR_SET_NO_NEW_PRIVS). Raises OSError."""
        if self.libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self.prog), 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "installing the container's seccomp filter: %s" % os.strerror(e))
