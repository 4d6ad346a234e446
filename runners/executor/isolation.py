"""Seal a run in namespaces of its own: the kernel's primitives, through ctypes, in this one module.

Why not bubblewrap or nsjail: both *exec* the program they confine, and a warm start forks the
program from an interpreter that has already imported torch (runners.executor.zygote). So the forked child
isolates itself with the same steps bubblewrap takes (user, mount, PID, network, IPC and UTS
namespaces; a fresh root of read-only binds; pivot_root; no capabilities; Landlock), and a cold start
is the same child calling ``execve`` at the end. No system package is needed, and Python 3.11 has no
``os.unshare``, hence ctypes.

The process tree of one run (``launch``, called in a freshly forked child)::

    launcher   unshares the namespaces, maps its user, forks the init; after the init died (and with
      |        it every process of the run), copies the run directory back out and reports the end
      init     PID 1 of the run's PID namespace: builds the mount view, brings up loopback, forks the
      |        program and waits for it; when it exits, the kernel kills whatever is left
      program  the reproducer (or a tool such as traincheck-collect), confined (runners.executor.confinement:
               no capabilities, no_new_privs, Landlock, rlimits); its own session

What the program sees: the interpreter and its packages (read-only, at their own paths), the system's
``/usr``, a few files of ``/etc`` (not ``shadow``), its run directory (at its host path), a private
``/tmp`` and ``/dev/shm`` (those three share one size-limited tmpfs: the disk total), ``/dev/null``,
``zero``, ``full``, ``random``, ``urandom`` and the GPU devices it leased, its own ``/proc``, and a
network namespace with nothing but its own loopback.

A run that holds devices (leased GPUs) sees what CUDA's driver needs besides their nodes, and a CPU run does not:
``/sys``, read-only (``cuInit`` fails with CUDA_ERROR_OPERATING_SYSTEM without it): a sysfs of its own, which shows
only its own network namespace's interfaces, or, where the kernel refuses one, the host's folders of devices and
drivers bound read-only (``SYS_OF_DEVICES``); and
writes beneath its own ``/proc`` (the driver names its threads in ``/proc/<pid>/task/<tid>/comm``, and ``cuInit``
fails when Landlock refuses that; the kernel still lets a process write only its own entries there).
"""
import ctypes
import errno
import json
import os
import platform
import signal
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from fcntl import ioctl
from pathlib import Path
from typing import BinaryIO, NoReturn, TypedDict

from .confinement import INSIDE_GID, INSIDE_UID, IsolationError, check, confine

MAX_FILES = 65536  # files and folders a run may make (its tmpfs's inodes), so copying them out stays quick
MAX_COPY_DEPTH = 64  # folders deeper than this in a run directory are not copied out
HOSTNAME = "sandbox"
DEVICES = ("null", "zero", "full", "random", "urandom")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "alternatives",
             "ssl", "mime.types")
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Where the kernel refuses a run a sysfs of its own, the host's folders of devices and drivers, read-only: not
# /sys/fs nor /sys/kernel, where the host's cgroups, debugfs and securityfs are mounted.
SYS_OF_DEVICES = ("devices", "bus", "class", "dev", "module")

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = {"user": CLONE_NEWUSER, "mount": CLONE_NEWNS, "pid": CLONE_NEWPID, "network": CLONE_NEWNET,
              "ipc": CLONE_NEWIPC, "uts": CLONE_NEWUTS, "cgroup": CLONE_NEWCGROUP}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
ST_FLAGS_TO_MS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC}
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}.get(platform.machine())
_SYS_MOUNT_SETATTR, _AT_RECURSIVE = 442, 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4
_PR_SET_PDEATHSIG, _PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 1, 3, 4
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class SandboxSpec:
    """One program to run sealed. Plain data: it travels as JSON from the worker to the zygote."""

    workdir: str  # the run directory: copied in before the run (at the same path) and back out after it
    cwd: str  # where the program starts: the run directory or a folder in it
    root_mountpoint: str  # an empty host directory the new root is built on
    argv: list[str]  # a cold start: execve(argv[0], argv, env); a warm one: [python, script, *args]
    env: dict[str, str]
    warm: bool = False
    file_size_mb: int = 256
    max_processes: int = 512  # processes and threads, counted in the run's own user namespace
    open_files: int = 4096  # per process (RLIMIT_NOFILE)
    data_mb: int = 0  # per process (RLIMIT_DATA), where no cgroup limits the run's memory; 0: none
    threads: int = 0  # torch's intra-op threads in a warm start (the environment says so to a cold one); 0: as is
    disk_mb: int = 1024  # the run directory, /tmp and /dev/shm together
    copy_out_mb: int = 1024
    read_only: list[str] = field(default_factory=list)  # host paths shown read-only at their own paths
    devices: list[str] = field(default_factory=list)  # host device nodes (leased GPUs)
    report_fifo: str = ""  # a host FIFO, shown at ``report_path`` (a path in the run directory)
    report_path: str = ""
    alarm_key: str = ""  # a warm start hands it to the probe in memory, never in the environment
    start_hook: str = ""  # a warm start's probe: "module:function", called with ``alarm_key`` before the script
    cgroup_procs: list[str] = field(default_factory=list)  # the run's cgroups (runners.executor.cgroups), joined first
    # Under a root worker, the host user the program runs as (``nobody``): a user RLIMIT_NPROC holds for.
    host_uid: int | None = None
    host_gid: int | None = None

    @classmethod
    def from_json(cls, text: str | bytes) -> "SandboxSpec":
        return cls(**json.loads(text))

    def to_json(self) -> str:
        return json.dumps(asdict(self))


# --- Which layers this kernel offers -------------------------------------------------------------

class Layers(TypedDict):
    """What ``probe_layers`` found: the namespaces a child can enter here, or why none."""

    namespaces: list[str]
    error: str


def probe_layers() -> Layers:
    """The isolation layers a child of this process can set up here: {"namespaces": [...], "error": str}.

    Forks a child that tries the unshare and the user mapping (a container's seccomp profile or a
    kernel setting may forbid user namespaces); costs a few milliseconds."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            _unshare_and_map()
            message = {"namespaces": sorted(NAMESPACES), "error": ""}
        except OSError as error:
            message = {"namespaces": [], "error": str(error)}
        os.write(write, json.dumps(message).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data or b'{"namespaces": [], "error": "the probe died"}')


def _unshare_and_map(host_uid: int | None = None, host_gid: int | None = None) -> None:
    """Enter new namespaces. The program's user inside (INSIDE_UID) is this process's own user, or, when
    this process is root and ``host_uid`` is given, that host user: then a helper still outside writes
    the map (as newuidmap does), which also maps root to itself, so that the set-up steps, which stay
    root, can reach the interpreter under /root and create files."""
    uid, gid = os.geteuid(), os.getegid()
    privileged = uid == 0 and host_uid is not None
    if not privileged:
        check(_libc.unshare(sum(NAMESPACES.values())), "unshare")
        # A worker that hid itself (runners.executor.hardening) is not dumpable, and a process that is not has its
        # /proc files owned by root: it could not write its own maps (EACCES; an image's uid-1000 worker refused
        # every run). Dumpable for these three writes only: no run can name this process (each is in a PID
        # namespace of its own), and the worker's other processes are its own.
        dumpable = _libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
        _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        try:
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{INSIDE_UID} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{INSIDE_GID} {gid} 1")
        finally:
            _libc.prctl(_PR_SET_DUMPABLE, dumpable, 0, 0, 0)
        return
    os.setgroups([])
    unshared_read, unshared_write = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(unshared_write)
        code = 1
        try:
            if os.read(unshared_read, 1) == b"1":
                parent = os.getppid()
                Path(f"/proc/{parent}/setgroups").write_text("deny")
                Path(f"/proc/{parent}/uid_map").write_text(f"0 0 1\n{INSIDE_UID} {host_uid} 1\n")
                Path(f"/proc/{parent}/gid_map").write_text(f"0 0 1\n{INSIDE_GID} {host_gid} 1\n")
                code = 0
        finally:
            os._exit(code)
    os.close(unshared_read)
    try:
        check(_libc.unshare(sum(NAMESPACES.values())), "unshare")
        os.write(unshared_write, b"1")
    finally:
        os.close(unshared_write)
        _, status = os.waitpid(helper, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise IsolationError(errno.EPERM, "could not map the sandbox's user")


# --- The launcher, the init and the program --------------------------------------------------------

def launch(spec: SandboxSpec, report: Callable[..., None], run_warm: Callable[[SandboxSpec], NoReturn]) -> NoReturn:
    """In a freshly forked child: run ``spec`` sealed, then ``os._exit``. ``report(message)`` sends the
    worker {"pid": host PID of the init} once it exists, then {"exit": code or -signal, "note": ...}.
    A warm start's program becomes ``run_warm(spec)`` (the zygote's). Standard output and error are the
    caller's (fds 1 and 2)."""
    exit_status, note = None, ""
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        workdir_fd = os.open(spec.workdir, os.O_RDONLY | os.O_DIRECTORY)
        for procs in spec.cgroup_procs:  # before the namespaces: the run's cgroup namespace is rooted at its cgroup
            with open(procs, "w", encoding="ascii") as join:
                join.write("0")
        _unshare_and_map(spec.host_uid, spec.host_gid)
        status_read, status_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(status_read)
            _init(spec, workdir_fd, status_write, run_warm)
        os.close(status_write)
        pidfd = os.pidfd_open(pid)  # the worker signals the init through it: no PID reuse can misdirect a kill
        report({"pid": pid}, [pidfd])
        os.close(pidfd)
        os.waitpid(pid, 0)  # returns once every process of the run's PID namespace is gone
        report({"ended": True})  # the copy-out below is not the program's time
        with os.fdopen(status_read, "rb") as status:
            told = status.read()
        exit_status = json.loads(told)["exit"] if told else -signal.SIGKILL  # no word: the init was killed
        note = _copy_tree_out(Path(spec.workdir), workdir_fd, spec.copy_out_mb * 1024 * 1024)
    except Exception as error:  # noqa: BLE001 - any failure of the set-up is the run's failure, said plainly
        note = f"isolation failed: {error}"
    report({"exit": exit_status, "note": note})
    os._exit(0)


def _init(spec: SandboxSpec, workdir_fd: int, status_write: int,
          run_warm: Callable[[SandboxSpec], NoReturn]) -> NoReturn:
    """PID 1 of the run. Never returns."""
    code = 127
    try:
        for number in signal.valid_signals():  # a namespace's init ignores what has no handler (Python's SIGINT has)
            if number not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(number, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        _build_root(spec, workdir_fd)
        os.close(workdir_fd)
        _libc.sethostname(HOSTNAME.encode(), len(HOSTNAME))
        _loopback_up()
        # No user namespace below this one: in a new one the program would hold every capability again.
        Path("/proc/sys/user/max_user_namespaces").write_text("0")
        _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program cannot trace or read its init
        program = os.fork()
        if program == 0:
            os.close(status_write)
            _program(spec, run_warm)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == program:
                code = os.waitstatus_to_exitcode(status)
                break
    except BaseException as error:  # noqa: BLE001
        os.write(2, f"SilentBench sandbox: {error}\n".encode())
        code = 126
    os.write(status_write, json.dumps({"exit": code}).encode())
    os._exit(0)  # the kernel now kills every process left in the namespace


def _program(spec: SandboxSpec, run_warm: Callable[[SandboxSpec], NoReturn]) -> NoReturn:
    """The sealed program: confined (runners.executor.confinement), then exec (cold) or the script as __main__
    (warm)."""
    try:
        os.setsid()
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(spec.cwd)
        confine(spec.workdir, spec.file_size_mb, spec.max_processes, spec.open_files, holds_devices=bool(spec.devices),
                data_mb=spec.data_mb, warm=spec.warm)
        if not spec.warm:
            os.execve(spec.argv[0], spec.argv, spec.env)
        run_warm(spec)
    except SystemExit as exit_:
        code = exit_.code
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))
    except BaseException as error:  # noqa: BLE001
        os.write(2, f"SilentBench sandbox: {type(error).__name__}: {error}\n".encode())
        os._exit(126)
    os._exit(0)


# --- The mount view -------------------------------------------------------------------------------

def _mount(source: str | None, target: str | Path, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(source and os.fsencode(source), os.fsencode(target), fstype and fstype.encode(),
                         ctypes.c_ulong(flags), data and data.encode())
    check(result, f"mount {source or fstype} on {target}")


def _read_only(target: str | Path, devices: bool = False) -> None:
    """Make the mount at ``target`` and every mount below it read-only and nosuid (and nodev, unless it holds
    ``devices``)."""
    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(attr_set=_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | (0 if devices else _MOUNT_ATTR_NODEV))
    if _libc.syscall(_SYS_MOUNT_SETATTR, -100, os.fsencode(target), _AT_RECURSIVE, ctypes.byref(attr),
                     ctypes.c_size_t(ctypes.sizeof(attr))) == 0:
        return
    # Before Linux 5.12: remount the top mount, keeping the flags the user namespace may not clear.
    locked = sum(ms for st, ms in ST_FLAGS_TO_MS.items() if os.statvfs(target).f_flag & st)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if devices else MS_NODEV) | locked)


def _bind(source: str | Path, target: Path, read_only: bool = True) -> None:
    source = Path(source)
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    _mount(str(source), str(target), None, MS_BIND | MS_REC)
    if read_only:
        _read_only(str(target))


def _build_root(spec: SandboxSpec, workdir_fd: int) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = Path(spec.root_mountpoint)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    # One tmpfs holds the run directory, /tmp and /dev/shm: its size is their total. /tmp comes first, so
    # that what lies under the host's /tmp (a test's interpreter or run directory) is bound over it.
    writable = root / ".writable"
    writable.mkdir()
    _mount("tmpfs", writable, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={spec.disk_mb}m,nr_inodes={MAX_FILES},mode=0755")
    for name, mode in (("home", 0o755), ("tmp", 0o1777), ("shm", 0o1777)):
        (writable / name).mkdir()
        os.chmod(writable / name, mode)
    _bind(writable / "tmp", root / "tmp", read_only=False)
    for name in SYSTEM_DIRS:
        host = Path("/", name)
        if host.is_symlink():
            (root / name).symlink_to(os.readlink(host))
        elif host.is_dir():
            _bind(host, root / name)
    _etc(root)
    for path in spec.read_only:
        if os.path.exists(path):
            _bind(path, root / path.lstrip("/"))
    _copy_tree_in(workdir_fd, writable / "home")
    if spec.report_fifo:  # a mount point: the program can write to it, not remove or replace it
        (writable / "home" / Path(spec.report_path).relative_to(spec.workdir)).touch()
    for directory, _, files in os.walk(writable):  # the set-up may run as root: hand it all to the program
        for path in [directory, *(os.path.join(directory, name) for name in files)]:
            os.lchown(path, INSIDE_UID, INSIDE_GID)
    _dev(root, spec.devices, writable / "shm")
    _bind(writable / "home", root / spec.workdir.lstrip("/"), read_only=False)
    check(_libc.umount2(os.fsencode(writable), MNT_DETACH), "umount the staging tmpfs")
    writable.rmdir()
    if spec.report_fifo:
        _bind(spec.report_fifo, root / spec.report_path.lstrip("/"), read_only=False)
    (root / "proc").mkdir()
    _mount("proc", root / "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if spec.devices:
        _sys(root / "sys")
    os.chdir(root)
    if _SYS_PIVOT_ROOT is None:
        raise IsolationError(errno.ENOSYS, f"pivot_root: unknown system call number on {platform.machine()}")
    check(_libc.syscall(_SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    check(_libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _sys(target: Path) -> None:
    """A read-only sysfs for a run that holds devices: its own, else the host's device folders (``SYS_OF_DEVICES``)."""
    target.mkdir()
    try:
        _mount("sysfs", target, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:  # a container's masked paths (a tmpfs over /sys/firmware) make the kernel refuse a new one
        for name in SYS_OF_DEVICES:
            if os.path.isdir(f"/sys/{name}"):
                _bind(f"/sys/{name}", target / name)


def _etc(root: Path) -> None:
    etc = root / "etc"
    etc.mkdir()
    for name in ETC_FILES:
        host = Path("/etc", name)
        if host.is_symlink() and name == "localtime":
            (etc / name).symlink_to(os.readlink(host))
        elif host.exists():
            _bind(host, etc / name)
    (etc / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{INSIDE_UID}:{INSIDE_GID}::"
                                f"/tmp:/bin/sh\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"root:x:0:\nsandbox:x:{INSIDE_GID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text(f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost ip6-localhost\n")
    (etc / "hostname").write_text(f"{HOSTNAME}\n")


def _dev(root: Path, devices: list[str], shm: Path) -> None:
    dev = root / "dev"
    dev.mkdir()
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        _bind(f"/dev/{name}", dev / name, read_only=False)
    for device in devices:
        _bind(device, root / device.lstrip("/"), read_only=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        (dev / name).symlink_to(target)
    (dev / "shm").mkdir()
    _read_only(dev, devices=True)  # device nodes stay usable on a read-only mount; nothing new can be made there
    _bind(shm, dev / "shm", read_only=False)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", ioctl(sock, _SIOCGIFFLAGS, request))[1]
        ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


# --- Copying the run directory in and out ---------------------------------------------------------

def _copy_tree_in(source_fd: int, target: Path) -> None:
    """Regular files and directories under ``source_fd`` (the host run directory) into ``target``."""
    for entry in os.scandir(source_fd):
        if entry.is_symlink():
            continue
        if entry.is_dir():
            (target / entry.name).mkdir()
            child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=source_fd)
            try:
                _copy_tree_in(child, target / entry.name)
            finally:
                os.close(child)
        elif entry.is_file():
            with _open_regular(entry.name, source_fd) as reader, open(target / entry.name, "wb") as writer:
                _copy(reader, writer)
                os.fchmod(writer.fileno(), os.fstat(reader.fileno()).st_mode & 0o755)


def _copy_tree_out(source: Path, target_fd: int, budget: int) -> str:
    """After the run (every process of it is gone): regular files and directories of ``source`` back
    into the host run directory, at most ``budget`` bytes; links, FIFOs and the like are left behind, and
    so is whatever cannot be copied (a name the host has as a folder, a tree too deep). Returns a note
    when something was left out."""
    skipped: list[str] = []

    def copy(directory: str | Path, directory_fd: int, depth: int) -> None:
        nonlocal budget
        for entry in os.scandir(directory):
            try:
                if entry.is_symlink() or not (entry.is_dir() or entry.is_file()):
                    continue
                if entry.is_dir():
                    if depth >= MAX_COPY_DEPTH:
                        skipped.append(entry.path)
                        continue
                    try:
                        os.mkdir(entry.name, dir_fd=directory_fd)
                    except FileExistsError:
                        pass
                    child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory_fd)
                    try:
                        copy(entry.path, child, depth + 1)
                    finally:
                        os.close(child)
                    continue
                size = entry.stat(follow_symlinks=False).st_size
                if size > budget:
                    skipped.append(entry.path)
                    continue
                budget -= size
                try:
                    reader = _open_regular(entry.path)
                except OSError:  # not a regular file after all (a FIFO mounted over one: the report)
                    continue
                with reader:
                    try:
                        os.unlink(entry.name, dir_fd=directory_fd)
                    except FileNotFoundError:
                        pass
                    fd = os.open(entry.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                                 dir_fd=directory_fd)
                    with os.fdopen(fd, "wb") as writer:
                        _copy(reader, writer)
            except OSError:
                skipped.append(entry.path)

    copy(source, target_fd, 0)
    return f"{len(skipped)} file(s) not copied out of the run directory (over the size budget, or not copyable)" \
        if skipped else ""


def _open_regular(path: str, dir_fd: int | None = None) -> BinaryIO:
    """``path`` opened for reading if it is a regular file: never a link, and never blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsolationError(errno.EINVAL, f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _copy(reader: BinaryIO, writer: BinaryIO) -> None:
    while chunk := reader.read(1 << 20):
        writer.write(chunk)
