"""What confines a program once it runs, below the namespaces: its privileges, Landlock and its rlimits.

A sealed run's program applies ``confine`` after its view is built (runners.executor.isolation); a run without
namespaces (an operator's opt-in, runners.executor.unisolated) applies ``confine_unisolated`` between fork and exec.
``layers`` names what ``confine`` applies on this kernel, for the run page and the worker's log: a new layer is
added here, in ``confine`` and in ``layers``, and nowhere else.

Landlock (Linux >= 5.13) through raw system calls, the same numbers on every architecture: the program may write
only beneath the paths it is given, and (ABI 6) may not signal processes outside its sandbox.
"""
import ctypes
import functools
import os
import resource
import signal
from collections.abc import Callable
from pathlib import Path

from . import seccomp
from .limits import Limits

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 4, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_SYS_PTRACE = 19
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_FS_WRITE = sum(1 << bit for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write file, remove, make anything
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14  # Landlock ABI 2 and 3
_SCOPE_SIGNAL = 1 << 1  # ABI 6
INSIDE_UID = INSIDE_GID = 1000  # the program's user and group inside a sealed run's user namespace

_libc = ctypes.CDLL(None, use_errno=True)


class IsolationError(OSError):
    """A step of sealing or confining a run failed: the program must not start."""


def check(result: int, what: str) -> None:
    """Raise IsolationError with the C library's error when a call of it returned non-zero."""
    if result != 0:
        code = ctypes.get_errno()
        raise IsolationError(code, f"{what}: {os.strerror(code)}")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 where it is unavailable (old kernel, disabled, seccomp)."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(version, 0)


def layers() -> list[str]:
    """The layers ``confine`` applies to a sealed program on this kernel, in order."""
    return (["no capabilities", "no_new_privs"] + (["landlock"] if landlock_abi() else [])
            + ["rlimits", "session keyring"] + (["seccomp"] if seccomp.available() else []))


def landlock_writes_only_under(paths: list[str]) -> None:
    """In the child: from now on, writes succeed only beneath ``paths``; signals stay inside the sandbox."""
    abi = landlock_abi()
    if not abi:
        return
    handled = _FS_WRITE | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(handled_access_fs=handled, scoped=_SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct grew with the ABI
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in paths:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(allowed_access=handled, parent_fd=fd)
                if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if _libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)):
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def set_rlimits(file_size_mb: int, max_processes: int, open_files: int) -> None:
    """This process's limits, inherited by what it starts: file size, no core dumps, processes and threads
    (counted per user; in a sealed run, per user of the run's own user namespace), open files (never above the
    worker's own hard limit).

    No address-space limit (RLIMIT_AS): address space is not memory (CUDA reserves tens of GB of it, glibc 64 MB per
    thread's arena), and a limit on it broke CUDA and CUDA builds of torch; memory is limited by the run's cgroup or
    the worker's watch, and where no cgroup limits it, by ``limit_private_memory`` too."""
    file_size = file_size_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    files = open_files if hard == resource.RLIM_INFINITY else min(open_files, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))


def _private_memory_bytes() -> int:
    """This process's private writable memory as RLIMIT_DATA counts it (``VmData``)."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))


def limit_private_memory(data_mb: int, beyond_held: bool) -> None:
    """Let this process (and what it starts) write at most ``data_mb`` of private memory (RLIMIT_DATA, which counts
    what a process may write, not PROT_NONE reservations), ``beyond_held``: more than it holds now (a warm start,
    which inherits its zygote's torch and runs on; not a process about to exec, which drops what it holds).
    The backstop of the worker's watch where no cgroup limits the run: the watch samples, and a process could take
    the host's memory between two samples. Never above the worker's own hard limit. Set last, once nothing of the
    confinement needs to allocate."""
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    limit = (_private_memory_bytes() if beyond_held else 0) + data_mb * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def confine(home: str, file_size_mb: int, max_processes: int, open_files: int, holds_devices: bool = False,
            data_mb: int = 0, warm: bool = False) -> None:
    """In a sealed run's program, as root of its user namespace: rlimits, then no capability left in any set and
    none to regain (bounding set, ambient), the program's own user, no_new_privs, Landlock (writes beneath
    ``home``, ``/tmp`` and ``/dev`` only, and the run's own ``/proc`` when it ``holds_devices``: CUDA's driver names
    its threads there), a session keyring of its own and, last, the system-call filter (runners.executor.seccomp)."""
    set_rlimits(file_size_mb, max_processes, open_files)
    last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last_cap + 1):
        check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setresgid(INSIDE_GID, INSIDE_GID, INSIDE_GID)
    os.setresuid(INSIDE_UID, INSIDE_UID, INSIDE_UID)  # clears the effective and permitted capabilities
    check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    landlock_writes_only_under([home, "/tmp", "/dev"] + (["/proc"] if holds_devices else []))
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    check(_libc.capset(ctypes.byref(header), data), "capset")
    # Readable by its worker (process count, memory), as an exec would make it; its init stays closed.
    _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    seccomp.join_session_keyring()
    if seccomp.available():
        seccomp.install()
    if data_mb:
        limit_private_memory(data_mb, beyond_held=warm)


def confine_unisolated(limits: Limits, writable: str, parent_pid: int, data_mb: int) -> Callable[[], None]:
    """The set-up of a program run without namespaces, between fork and exec (after Popen switched to the
    sandbox's user): rlimits, death with its starter, no CAP_SYS_PTRACE for a root program, Landlock, a session
    keyring of its own and the system-call filter."""
    def preexec() -> None:
        set_rlimits(limits.file_size_mb, limits.max_processes, limits.open_files)
        # Die with the thread that started us (a worker killed -9). Set after the change of user, which
        # clears it; and if that parent is already gone, die now.
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        if os.geteuid() == 0:  # a root reproducer keeps no CAP_SYS_PTRACE across exec: the worker stays hidden
            _libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_PTRACE, 0, 0, 0)
        landlock_writes_only_under([writable, "/dev"])
        seccomp.join_session_keyring()
        if seccomp.available():
            seccomp.install()
        if data_mb:
            limit_private_memory(data_mb, beyond_held=False)

    return preexec
