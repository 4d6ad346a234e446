"""The system-call filter of a sealed program (seccomp), through libseccomp.

libseccomp is Debian's and every distribution's (``libseccomp2``, which apt itself depends on); it is called through
ctypes, because the executor imports the standard library only (it runs in zygotes of other Python environments,
which have no third-party package of ours). libseccomp compiles the rules into the kernel's BPF, with the checks of
the architecture that such a filter must make; the executor writes no BPF by hand.

The filter allows everything but what ``REFUSED`` names, which fails with EPERM (``clone3`` with ENOSYS, so that the
C library falls back to ``clone``, whose flags the filter can read). What it refuses and why:

- ``io_uring_*``: a second path to the kernel's file and network operations, outside what the rest watches;
- ``keyctl``, ``add_key``, ``request_key``: the kernel's keyrings outlive a run and can be shared between runs of
  one user (each run also joins a fresh session keyring first, ``join_session_keyring``);
- ``ptrace``, ``process_vm_readv``, ``process_vm_writev``: reading or steering another process of the run;
- ``perf_event_open``, ``bpf``, ``userfaultfd``: kernel attack surface no training program needs;
- ``kexec_*``, ``init_module``, ``finit_module``, ``delete_module``: never for a program;
- new namespaces: ``unshare``, ``setns``, and ``clone`` with any ``CLONE_NEW*`` flag;
- ``prctl(PR_SET_DUMPABLE, 0)``: a process that hides itself from the worker's watch of the run's memory.
"""
import ctypes
import ctypes.util
import errno
import functools
import os
import platform

_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_ATTR_TSYNC = 4  # SCMP_FLTATR_CTL_TSYNC: every thread of the process gets the filter
_CMP_EQ, _CMP_MASKED_EQ = 4, 7
_KEYCTL_JOIN_SESSION_KEYRING = 1
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "ppc64le": 250, "s390x": 280}.get(platform.machine())
PR_SET_DUMPABLE = 4
CLONE_NEW = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
             "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
             "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}
REFUSED = ("io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "ptrace",
           "process_vm_readv", "process_vm_writev", "perf_event_open", "bpf", "userfaultfd", "kexec_load",
           "kexec_file_load", "init_module", "finit_module", "delete_module", "unshare", "setns")


class _ArgCompare(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.cache
def _library() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        library = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = [ctypes.c_uint32]
    library.seccomp_release.argtypes = [ctypes.c_void_p]
    library.seccomp_load.argtypes = [ctypes.c_void_p]
    library.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    library.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                               ctypes.POINTER(_ArgCompare)]
    return library


def available() -> bool:
    """Whether libseccomp can be loaded here (the layer is then applied to every sealed program)."""
    return _library() is not None


def _errno_action(code: int) -> int:
    return _ERRNO | (code & 0xFFFF)


def _rule(library: ctypes.CDLL, context: int, action: int, name: str, *compares: tuple[int, int, int, int]) -> None:
    number = library.seccomp_syscall_resolve_name(name.encode())
    if number < 0:  # a call this architecture does not have
        return
    array = (_ArgCompare * max(1, len(compares)))(*(_ArgCompare(*compare) for compare in compares))
    result = library.seccomp_rule_add_array(ctypes.c_void_p(context), action, number, len(compares), array)
    if result < 0:
        raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")


def join_session_keyring() -> None:
    """Leave the keyring the run was started with for a fresh, anonymous session keyring of its own. Where keyrings
    are out of reach already (a container's own filter refuses ``keyctl``: EPERM or ENOSYS), there is none to share
    and nothing to do."""
    if _SYS_KEYCTL is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        code = ctypes.get_errno()
        if code not in (errno.EPERM, errno.ENOSYS):
            raise OSError(code, f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(code)}")


def install() -> None:
    """In the program, after every other step of its confinement: load the filter (inherited by all it starts)."""
    library = _library()
    if library is None:
        raise OSError(errno.ENOSYS, "libseccomp is not installed")
    context = library.seccomp_init(_ALLOW)
    if not context:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        library.seccomp_attr_set(ctypes.c_void_p(context), _ATTR_TSYNC, 1)
        refused = _errno_action(errno.EPERM)
        for name in REFUSED:
            _rule(library, context, refused, name)
        _rule(library, context, _errno_action(errno.ENOSYS), "clone3")
        flags = 1 if platform.machine() == "s390x" else 0  # clone's flags: its first argument, its second on s390x
        for flag in CLONE_NEW.values():
            _rule(library, context, refused, "clone", (flags, _CMP_MASKED_EQ, flag, flag))
        # prctl's option is an int: the kernel reads its low 32 bits, whatever the upper ones hold
        _rule(library, context, refused, "prctl", (0, _CMP_MASKED_EQ, 0xFFFFFFFF, PR_SET_DUMPABLE), (1, _CMP_EQ, 0, 0))
        result = library.seccomp_load(ctypes.c_void_p(context))
        if result < 0:
            raise OSError(-result, f"seccomp_load: {os.strerror(-result)}")
    finally:
        library.seccomp_release(ctypes.c_void_p(context))
