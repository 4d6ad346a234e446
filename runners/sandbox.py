"""Run an untrusted program with limits, and say clearly how it ended.

Pure Python (no Django), so that it can be tested and reused on its own.

By default every program is sealed in namespaces of its own (runners.isolation), started by a
zygote (runners.zygote) that forks it warm or execs it cold, and watched from here: its time, its
output, its total memory, the oracle record on its report FIFO. Where this kernel or container
offers no user namespaces, ``run_sandboxed`` refuses to run it, unless the operator opted in
(``Limits.allow_unisolated``): then the older confinement below applies, and the run says so.

The older confinement (no namespaces), from the outside in: its own session and process group
(killed as a whole); rlimits for memory, file size, core dumps and processes; death with the process that started it
(``PR_SET_PDEATHSIG``), so a worker killed with -9 leaves no reproducer behind; an unprivileged
user when the worker is root (``Limits.user``); and a Landlock ruleset, which needs no privilege
(it works as uid 1000 in Docker, whose default seccomp profile allows it): the program may write
only under its own directory and ``/dev`` (``/dev/null``, ``/dev/shm``, GPU devices), and (ABI 6)
may not signal processes outside its sandbox, such as the worker. Landlock does not stop it from
reading files, nor ``/proc/<worker>/environ`` when it runs as the worker's user: for that the worker
hides itself (``hide_from_reproducers``: non-dumpable, secret values wiped from the environment
block /proc shows), and a root worker's reproducers lose ``CAP_SYS_PTRACE``.
"""
import ctypes
import functools
import json
import logging
import os
import pwd
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    time_limit_seconds: float
    memory_mb: int
    log_cap_bytes: int = 64 * 1024
    flood_bytes: int = 32 * 1024 * 1024
    file_size_mb: int = 256
    # Processes and threads of the program's user (RLIMIT_NPROC counts per user: all of the worker's
    # when it runs unprivileged, only the sandbox's when a root worker switches to ``user``).
    max_processes: int = 512
    user: str = "nobody"  # who runs the program when the worker is root ("" keeps root: tests only)
    disk_mb: int = 1024  # the run directory, /tmp and /dev/shm together (sealed runs)
    allow_unisolated: bool = False  # run without namespaces where the kernel has none (an operator's opt-in)
    teardown_grace_seconds: float = 10.0  # after the oracle record, how long its processes may take to end
    report_cap_bytes: int = 16 * 1024 * 1024
    warm_start: bool = True  # a detector's own phases (TrainCheck's) may fork from a zygote (sealed runs only)
    # Added to ``memory_mb`` in the per-process address-space limit (RLIMIT_AS) only: what the libraries of
    # another Python environment map beyond the default one's (a CUDA build of torch maps 2.3 to 3.7 GB more on import:
    # runners.environments). The watch of the run's real memory stays at ``memory_mb``.
    address_space_extra_mb: int = 0


@dataclass
class CapturedStream:
    """Keeps the head and the tail of a stream within a cap, and counts everything."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk):
        self.total += len(chunk)
        half = self.cap // 2
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > half:
                del self.tail[: len(self.tail) - half]

    @property
    def truncated(self):
        return self.total > len(self.head) + len(self.tail)

    def text(self):
        """What was kept, as text a database stores (NUL, which PostgreSQL refuses, becomes U+FFFD)."""
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            text = head + self.tail.decode("utf-8", "replace")
        else:
            skipped = self.total - len(self.head) - len(self.tail)
            text = f"{head}\n[... {skipped} bytes not kept ...]\n{self.tail.decode('utf-8', 'replace')}"
        return text.replace("\x00", "\ufffd")


# --- Why a program failed: one sentence builder per cause. ``SandboxResult.failure`` picks one and
# names it as the failure's ``cause``; runners.failures gives each builder its RunFailureKind, and the
# synthetic history (devtools.synthetic) writes its failures with these same sentences.

def process_limit_exceeded(limits):
    """Killed for having more than ``limits.max_processes`` processes at once (the group count)."""
    return (f"Process limit exceeded: more than {limits.max_processes} processes at once (a fork bomb?); "
            "the process group was killed.")


def time_limit_exceeded(limits, forking=False):
    return (f"Time limit exceeded: still running after {limits.time_limit_seconds:g} s; "
            "the process group was killed."
            + (f" It had reached the limit of {limits.max_processes} processes (a fork bomb?)." if forking else ""))


def output_flood(limits):
    return f"Output flood: more than {limits.flood_bytes} bytes on stdout/stderr; the process group was killed."


def out_of_memory(limits, last_line=""):
    return f"Out of memory: exceeded the memory limit of {limits.memory_mb} MB. {last_line}".strip()


def process_limit_reached(limits, last_line=""):
    """It ended on its own after a fork failed at RLIMIT_NPROC."""
    return f"Process limit reached: at most {limits.max_processes} processes. {last_line}".strip()


def isolation_unavailable(error):
    return ("Refused: this worker cannot seal runs in namespaces of their own "
            f"({error}); it runs no untrusted code unless its operator sets SILENTBENCH_ALLOW_UNISOLATED=true.")


def isolation_refused(reason):
    """The sandbox did not start the program; ``reason`` already says why."""
    return reason


def write_refused(last_line=""):
    return ("Refused by the sandbox: a reproducer may write only inside its own run directory. "
            f"{last_line}").strip()


def crashed(exit_code, last_line=""):
    """Any other non-zero end: a signal (negative ``exit_code``) or an exit code."""
    name = signal_name(exit_code)
    how = f"killed by {name}" if name else f"exited with code {exit_code}"
    return f"Crashed: {how}. {last_line}".strip()


def signal_name(exit_code):
    """SIGKILL for -9 (a subprocess killed by a signal), None for an exit code."""
    if exit_code is not None and exit_code < 0:
        try:
            return signal.Signals(-exit_code).name
        except ValueError:
            return f"signal {-exit_code}"
    return None


@dataclass(frozen=True)
class Failure:
    """Why a program failed: the sentence, and the builder above that wrote it (its cause)."""

    cause: Callable[..., str]  # one of the builders above
    reason: str


@dataclass
class SandboxResult:
    exit_code: int | None
    wall_seconds: float
    stdout: str
    stderr: str
    output_truncated: bool
    timed_out: bool = False
    flooded: bool = False
    forked_too_much: bool = False
    memory_exceeded: bool = False
    refused: str = ""  # why the program was not started at all
    report_text: str = ""  # what the program wrote to its report (``report_path``), capped
    ended_after_oracle: bool = False  # killed a grace period after its oracle record: judged from its records
    layers: list = field(default_factory=list)  # the isolation layers that were active
    started_warm: bool = False  # forked from the zygote (else the command was exec'd)
    notes: list = field(default_factory=list)  # for the run page: how it was started, ended, confined

    @property
    def signal_name(self):
        return signal_name(self.exit_code)

    @property
    def sealed(self):
        """Whether it ran in PID and mount namespaces of its own: once it ended, no process of it is left."""
        return {"pid namespace", "mount namespace"} <= set(self.layers)

    def failure(self, limits):
        """A :class:`Failure`, or None when the program ended normally with exit code 0."""
        # The program's last words decide (an earlier, handled "Permission denied" is no reason).
        last_line = next((line for line in reversed(self.stderr.strip().splitlines()) if line.strip()), "")
        forking = hit_process_limit(last_line)
        if self.refused:
            return Failure(isolation_refused, self.refused)
        if self.ended_after_oracle:
            return None
        if self.memory_exceeded:
            return Failure(out_of_memory, out_of_memory(limits, "(the run's processes together)"))
        if self.forked_too_much:
            return Failure(process_limit_exceeded, process_limit_exceeded(limits))
        if self.timed_out:
            return Failure(time_limit_exceeded, time_limit_exceeded(limits, forking))
        if self.flooded:
            return Failure(output_flood, output_flood(limits))
        if self.exit_code == 0:
            return None
        if looks_out_of_memory(self.stderr):
            return Failure(out_of_memory, out_of_memory(limits, last_line))
        if forking:
            return Failure(process_limit_reached, process_limit_reached(limits, last_line))
        if looks_like_refused_write(last_line):
            return Failure(write_refused, write_refused(last_line))
        return Failure(crashed, crashed(self.exit_code, last_line))

    def failure_reason(self, limits):
        """A sentence for a human, or '' when the program ended normally with exit code 0."""
        failure = self.failure(limits)
        return failure.reason if failure else ""


OOM_MARKERS = ("MemoryError", "std::bad_alloc", "can't allocate memory", "Cannot allocate memory", "out of memory")


def looks_out_of_memory(stderr):
    return any(marker in stderr for marker in OOM_MARKERS)


def hit_process_limit(stderr):
    return "BlockingIOError" in stderr or "Resource temporarily unavailable" in stderr


def looks_like_refused_write(stderr):
    return "PermissionError" in stderr or "Permission denied" in stderr or "Read-only file system" in stderr


# --- Landlock (Linux >= 5.13), through raw system calls: same numbers on every architecture. ---
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_FS_WRITE = sum(1 << bit for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write file, remove, make anything
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14  # Landlock ABI 2 and 3
_SCOPE_SIGNAL = 1 << 1  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)


_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _CAP_SYS_PTRACE = 4, 24, 19
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|^DATABASE_URL$|BROKER_URL$|CACHE_URL$")
URL_WITH_CREDENTIALS = re.compile(rb"^[A-Za-z][\w+.-]*://[^/@\s]*@")


def hide_from_reproducers():
    """Keep the secrets in this process's environment (database and broker URLs, the secret key) from
    the reproducers it starts. Idempotent; forked children (a worker's pool) inherit it.

    - Non-dumpable: a process of the same user can no longer open its /proc/<pid>/environ or memory,
      nor trace it (Landlock does not stop that on every kernel). A root reproducer could, with
      CAP_SYS_PTRACE, which ``_apply_limits`` drops.
    - The values of secret variables are wiped from the environment block that /proc/<pid>/environ
      shows (root can read that file of another root process even so). ``os.environ`` and the C
      environment keep them, in memory /proc/<pid>/mem guards.
    """
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51 of proc(5)
    except (OSError, IndexError, ValueError):
        return
    block, offset, wiped = ctypes.string_at(start, end - start), 0, []
    for entry in block.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and value and (SECRET_NAME.search(name.decode(errors="replace"))
                                 or URL_WITH_CREDENTIALS.match(value)):
            ctypes.memset(start + offset + len(name) + 1, 0, len(value))
            wiped.append(os.fsdecode(name))
        offset += len(entry) + 1
    for name in wiped:  # the C environment pointed into the block: give it the values back, elsewhere
        if name in os.environ:
            os.putenv(name, os.environ[name])


@functools.cache
def landlock_abi():
    """The kernel's Landlock ABI version, or 0 where it is unavailable (old kernel, disabled, seccomp)."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(version, 0)


def describe_confinement(limits):
    """One line for the worker's log: how runs are sealed here, or why they are not."""
    layers = isolation_layers()
    if layers["namespaces"]:
        return f"runs sealed in their own {', '.join(layers['namespaces'])} namespaces; Landlock ABI {landlock_abi()}"
    if not limits.allow_unisolated:
        return "REFUSING untrusted code: " + isolation_unavailable(layers["error"])
    account = _sandbox_account(limits, [sys.executable]) or pwd.getpwuid(os.geteuid())
    abi = landlock_abi()
    confined = f"Landlock ABI {abi}" if abi else "NOT confined (no Landlock in this kernel or container)"
    return f"reproducers run as {account.pw_name}; writes outside their directory: {confined}"


def _sandbox_account(limits, paths=()):
    """The user to run as: ``limits.user`` when the worker is root, else None (stay who we are).

    Also None, with a warning, when that user could not reach one of ``paths`` (the run directory,
    the interpreter) through a parent directory closed to others, such as a Python under /root:
    Landlock still confines the writes, and the process count still holds."""
    if os.geteuid() != 0 or not limits.user:
        return None
    account = pwd.getpwnam(limits.user)
    unreachable = [str(path) for path in paths if not _reachable_by(account, Path(path))]
    if unreachable:
        logger.warning("%s cannot reach %s: the reproducer runs as root", account.pw_name, ", ".join(unreachable))
        return None
    return account


def _interpreters(program, env):
    """The program's file and, for a script, the interpreter on its ``#!`` line."""
    path = shutil.which(program, path=env.get("PATH")) or program
    try:
        with open(path, "rb") as head:
            line = head.readline(512)
    except OSError:
        return [path]
    words = line[2:].split() if line.startswith(b"#!") else []
    return [path, words[0].decode(errors="replace")] if words else [path]


def _reachable_by(account, path):
    for parent in path.resolve().parents:
        info = parent.stat()
        search = 0o100 if info.st_uid == account.pw_uid else 0o010 if info.st_gid == account.pw_gid else 0o001
        if not info.st_mode & search:
            return False
    return True


def landlock_writes_only_under(paths):
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


def set_rlimits(memory_mb, file_size_mb, max_processes):
    """This process's limits, inherited by what it starts: address space, file size, no core dumps, processes
    and threads (counted per user; in a sealed run, per user of the run's own user namespace)."""
    memory, file_size = memory_mb * 1024 * 1024, file_size_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))


def _apply_limits(limits, writable, parent_pid):
    """The child's set-up between fork and exec (after Popen switched to the sandbox's user)."""
    def preexec():
        set_rlimits(limits.memory_mb + limits.address_space_extra_mb, limits.file_size_mb, limits.max_processes)
        # Die with the thread that started us (a worker killed -9). Set after the change of user, which
        # clears it; and if that parent is already gone, die now.
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        if os.geteuid() == 0:  # a root reproducer keeps no CAP_SYS_PTRACE across exec: the worker stays hidden
            _libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_PTRACE, 0, 0, 0)
        landlock_writes_only_under([writable, "/dev"])

    return preexec


def _give_to(account, root):
    """Hand the run directory to the sandbox's user (a root worker wrote it)."""
    for directory, subdirectories, files in os.walk(root):
        os.chown(directory, account.pw_uid, account.pw_gid)
        for name in files:
            os.chown(os.path.join(directory, name), account.pw_uid, account.pw_gid, follow_symlinks=False)


GROUP_CHECK_SECONDS = 0.2


def group_size(pgid):
    """How many processes are in process group ``pgid`` now (from /proc)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            count += int(fields[2]) == pgid
    return count


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(argv, workdir, env, limits, *, warm=False, preload="torch", report_path=None, alarm_key="",
                  devices=(), python=None):
    """Run ``argv`` in ``workdir`` with exactly ``env``; never raises for the program's misbehaviour.

    ``warm``: ``argv`` is ``[python, script, *args]`` and the script runs in a child of the zygote that
    has already imported ``preload`` (runners.zygote.PRELOADS). ``report_path``: where the program writes
    its report (a path in ``workdir``); what it wrote comes back as ``SandboxResult.report_text``.
    ``alarm_key``: handed to a warm run's probe in memory. ``devices``: device nodes it may use (leased GPUs).
    ``python``: the interpreter of another Python environment (runners.environments) the program runs on,
    readable in the sandbox and warm from a zygote of its own; None for this process's own.
    """
    layers = isolation_layers()
    if layers["namespaces"]:
        return _run_isolated(Path(workdir), argv, env, limits, warm, preload, report_path, alarm_key, devices,
                             layers, python)
    reason = isolation_unavailable(layers["error"])
    if not limits.allow_unisolated:
        return SandboxResult(exit_code=None, wall_seconds=0.0, stdout="", stderr="", output_truncated=False,
                             refused=reason)
    if alarm_key:  # no warm start without namespaces: a cold probe takes the key from its environment
        env = {**env, "SILENTBENCH_ALARM_KEY": alarm_key}
    result = _run_unisolated(argv, workdir, env, limits)
    result.started_warm = False
    result.layers = ["landlock"] if landlock_abi() else []
    result.notes.append("Not sealed in namespaces (this worker's operator allowed it): " + layers["error"])
    if report_path is not None and Path(report_path).exists():
        with open(report_path, "rb") as report:
            result.report_text = report.read(limits.report_cap_bytes).decode("utf-8", "replace")
    return result


@functools.cache
def isolation_layers():
    """{"namespaces": [...], "error": why none} for this process's children; probed once."""
    from .isolation import probe_layers

    return probe_layers()


def _run_unisolated(argv, workdir, env, limits):
    """The confinement without namespaces (see the module's docstring): an operator's opt-in.

    The program may write only beneath its home (``env["HOME"]``, else ``workdir``): the run's own
    directory. It dies if the calling thread ends, so call this from a thread that waits for it.
    """
    hide_from_reproducers()
    writable = Path(env.get("HOME") or workdir)
    account = _sandbox_account(limits, [writable, *_interpreters(argv[0], env)])
    if account is not None:
        _give_to(account, writable)
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so that ranks and strays die with it
        user=account.pw_uid if account else None,
        group=account.pw_gid if account else None,
        extra_groups=[] if account else None,
        preexec_fn=_apply_limits(limits, writable, os.getpid()),
    )
    streams, flooded, readers = _capture(process.stdout, process.stderr, limits, lambda: _kill_group(process))
    deadline = started + limits.time_limit_seconds
    timed_out = forked_too_much = False
    try:
        while not (timed_out or forked_too_much):
            try:
                process.wait(timeout=min(GROUP_CHECK_SECONDS, max(deadline - time.monotonic(), 0)))
                break
            except subprocess.TimeoutExpired:
                timed_out = time.monotonic() >= deadline
                # RLIMIT_NPROC does not hold for root: count the group (a fork bomb stays in it).
                forked_too_much = group_size(process.pid) > limits.max_processes
    except BaseException:  # the caller was interrupted (Ctrl-C, SystemExit on SIGTERM): the program goes too
        _kill_group(process)
        process.wait()
        raise
    _kill_group(process)  # also reaps ranks or children the program left behind
    process.wait()
    for reader in readers:
        reader.join(timeout=5)
    return SandboxResult(
        exit_code=process.returncode,
        wall_seconds=time.monotonic() - started,
        stdout=streams["stdout"].text(),
        stderr=streams["stderr"].text(),
        output_truncated=streams["stdout"].truncated or streams["stderr"].truncated,
        timed_out=timed_out,
        flooded=flooded.is_set(),
        forked_too_much=forked_too_much,
    )


def _capture(stdout, stderr, limits, kill):
    """Read both streams in threads, within the log cap; ``kill()`` once past the flood limit."""
    streams = {"stdout": CapturedStream(limits.log_cap_bytes), "stderr": CapturedStream(limits.log_cap_bytes)}
    flooded = threading.Event()

    def pump(pipe, stream):
        for chunk in iter(lambda: pipe.read1(65536), b""):
            stream.feed(chunk)
            if streams["stdout"].total + streams["stderr"].total > limits.flood_bytes and not flooded.is_set():
                flooded.set()
                kill()
        pipe.close()

    readers = [threading.Thread(target=pump, args=(pipe, streams[name]), daemon=True)
               for name, pipe in (("stdout", stdout), ("stderr", stderr))]
    for reader in readers:
        reader.start()
    return streams, flooded, readers


@dataclass
class _ReportReader:
    """Reads the run's report FIFO as the program writes it: keeps ``cap`` bytes, notes the oracle record.

    The worker holds a write end too, so that the FIFO never reads as ended while the program has not
    opened it yet; ``close`` gives it up, and the reader ends once every writer of the run is gone."""

    path: Path
    cap: int
    oracle_at: float | None = None
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def start(self):
        self._read_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._write_fd = os.open(self.path, os.O_WRONLY)
        os.set_blocking(self._read_fd, True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        pending = b""
        while chunk := os.read(self._read_fd, 65536):
            self.total += len(chunk)
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if self.oracle_at is None:
                *lines, pending = (pending + chunk).split(b"\n")
                pending = pending[-65536:]
                if any(b'"oracle"' in line and _is_oracle(line) for line in lines):
                    self.oracle_at = time.monotonic()
        os.close(self._read_fd)

    def close(self):
        os.close(self._write_fd)
        self._thread.join(timeout=10)

    def text(self):
        return self.data.decode("utf-8", "replace")


def _is_oracle(line):
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("event") == "oracle"


MEMORY_CHECK_EVERY = 5  # ticks of GROUP_CHECK_SECONDS: reading every process's PSS costs more than a count
REPORT_FLOOD_FACTOR = 4  # a report this many times its cap is a flood: the run is killed
KILLED_RUN_GRACE_SECONDS = 60  # how long a killed run may take to report its end (its copy-out included)


def _run_isolated(cwd, argv, env, limits, warm, preload, report_path, alarm_key, devices, layers, python=None):
    """A sealed run of ``argv`` in ``cwd``; its directory (what it may write, copied in and out) is its home,
    ``env["HOME"]``, which holds ``cwd`` (TrainCheck's fit runs each reference program in a folder of it)."""
    from .isolation import SandboxSpec
    from .zygote import ZygoteClient

    workdir = Path(env.get("HOME") or cwd)
    root_mountpoint = Path(tempfile.mkdtemp(prefix=f"{workdir.name}-root-", dir=workdir.parent))
    fifo = None
    account = pwd.getpwnam(limits.user) if os.geteuid() == 0 and limits.user else None
    spec = SandboxSpec(
        workdir=str(workdir), cwd=str(cwd), root_mountpoint=str(root_mountpoint), argv=list(argv), env=dict(env),
        warm=warm,
        memory_mb=limits.memory_mb + limits.address_space_extra_mb, file_size_mb=limits.file_size_mb,
        max_processes=limits.max_processes, disk_mb=limits.disk_mb, copy_out_mb=limits.disk_mb,
        read_only=interpreter_paths(python),
        devices=list(devices),
        alarm_key=alarm_key, host_uid=account.pw_uid if account else None,
        host_gid=account.pw_gid if account else None,
    )
    report = None
    stdout_read = stdout_write = stderr_read = stderr_write = None
    mine = theirs = run = None
    streams, readers = {}, []
    timed_out = memory_exceeded = ended_after_oracle = forked_too_much = report_flood = False
    try:
        if report_path is not None:
            fifo = Path(tempfile.mkdtemp(prefix=f"{workdir.name}-report-", dir=workdir.parent)) / "report"
            os.mkfifo(fifo, 0o600)
            if account:
                os.chown(fifo, account.pw_uid, account.pw_gid)
            spec.report_fifo, spec.report_path = str(fifo), str(report_path)
            report = _ReportReader(fifo, limits.report_cap_bytes)
            report.start()
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ZygoteClient.shared(preload, python).launch(spec, [theirs.fileno(), stdout_write, stderr_write])
        finally:
            for fd in (theirs.detach(), stdout_write, stderr_write):
                os.close(fd)
        started = time.monotonic()  # the program's time: not the zygote's start, nor the copy-out after it
        run = _SealedRun(mine)
        streams, flooded, readers = _capture(os.fdopen(stdout_read, "rb"), os.fdopen(stderr_read, "rb"), limits,
                                             run.kill)
        stdout_read = stderr_read = None  # the readers own them now
        deadline = started + limits.time_limit_seconds
        ticks = 0
        while not run.ended(GROUP_CHECK_SECONDS):
            now, ticks = time.monotonic(), ticks + 1
            if run.program_ended:
                continue
            if now >= deadline:
                timed_out = True
            elif report and report.oracle_at and now - report.oracle_at > limits.teardown_grace_seconds:
                ended_after_oracle = True
            elif report and report.total > REPORT_FLOOD_FACTOR * limits.report_cap_bytes:
                report_flood = True
            elif len(namespace_members(run.pid_namespace)) >= limits.max_processes:
                forked_too_much = True  # RLIMIT_NPROC refuses more; a program that keeps trying is stopped
            elif ticks % MEMORY_CHECK_EVERY == 0 and run.memory_mb() > limits.memory_mb:
                memory_exceeded = True
            else:
                continue
            run.kill()
            if not run.ended(KILLED_RUN_GRACE_SECONDS):
                run.note = run.note or "The run did not report its end after it was killed."
            break
        wall_seconds = (run.ended_at or time.monotonic()) - started
    except BaseException:  # the caller was interrupted (Ctrl-C, SystemExit on SIGTERM): the program goes too
        if run is not None:
            run.kill()
        raise
    finally:
        for fd in (stdout_read, stderr_read):
            if fd is not None:
                os.close(fd)
        if run is not None:
            run.close()
        elif mine is not None:
            mine.close()
        if report:
            report.close()
            shutil.rmtree(fifo.parent, ignore_errors=True)
        for reader in readers:
            reader.join(timeout=5)
        _remove_mountpoint(root_mountpoint)
    notes = [note for note in (run.note,) if note]
    if ended_after_oracle:
        notes.append(f"Ended {limits.teardown_grace_seconds:g} s after its oracle record: its processes were still "
                     "running (a teardown hang). Judged from its records.")
    if report_flood:
        notes.append(f"Killed: it wrote more than {REPORT_FLOOD_FACTOR * limits.report_cap_bytes} bytes of report "
                     f"records (the first {limits.report_cap_bytes} are kept).")
    return SandboxResult(
        exit_code=run.exit_code,
        wall_seconds=wall_seconds,
        stdout=streams["stdout"].text(),
        stderr=streams["stderr"].text(),
        output_truncated=streams["stdout"].truncated or streams["stderr"].truncated,
        timed_out=timed_out,
        flooded=flooded.is_set() or report_flood,
        forked_too_much=forked_too_much,
        memory_exceeded=memory_exceeded,
        report_text=report.text() if report else "",
        ended_after_oracle=ended_after_oracle and run.exit_code is not None,
        started_warm=warm,
        layers=[f"{name} namespace" for name in layers["namespaces"]] + ["no capabilities", "no_new_privs"]
        + (["landlock"] if landlock_abi() else []) + ["rlimits"],
        notes=notes,
    )


def _remove_mountpoint(path):
    try:
        path.rmdir()
    except OSError:
        logger.warning("could not remove %s", path)


class _SealedRun:
    """The worker's side of one sealed run: the launcher's messages on ``conn``, the init's pidfd."""

    def __init__(self, conn):
        self.conn = conn
        self.pidfd = None
        self.pid_namespace = None
        self.exit_code = None
        self.note = ""
        self.over = False
        self.program_ended = False  # its launcher is copying its directory out
        self.ended_at = None
        self.lock = threading.Lock()  # a kill from a stream reader's thread never meets a closed pidfd

    def ended(self, timeout):
        """Wait up to ``timeout`` seconds (None: for good) for the launcher's news; True once the run is over."""
        while not self.over:
            ready, _, _ = select.select([self.conn], [], [], timeout)
            if not ready:
                return False
            message, fds, _, _ = socket.recv_fds(self.conn, 65536, 1)
            if not message:  # the launcher died without a word
                self.over = True
                self.note = self.note or "The sandbox's launcher ended without reporting how the run ended."
                break
            news = json.loads(message)
            if "pid" in news and fds:
                with self.lock:
                    self.pidfd = fds[0]
                self.pid_namespace = news.get("pid_namespace")
            if news.get("ended") and not self.program_ended:
                self.program_ended, self.ended_at = True, time.monotonic()
            if "exit" in news:
                self.over, self.exit_code, self.note = True, news["exit"], news.get("note", "")
                if self.exit_code is None and not self.note:
                    self.note = "The sandbox failed to start the program."
        self._close_pidfd()
        return True

    def _close_pidfd(self):
        with self.lock:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None

    def close(self):
        self._close_pidfd()
        self.conn.close()

    def kill(self):
        with self.lock:
            if self.pidfd is not None:
                try:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                except OSError:
                    pass

    def memory_mb(self):
        """The run's processes' proportional share of memory (PSS) together, in MB."""
        total = 0
        for pid in namespace_members(self.pid_namespace):
            try:
                with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
                    for line in rollup:
                        if line.startswith(b"Pss:"):
                            total += int(line.split()[1])
                            break
            except (OSError, ValueError):
                continue
        return total / 1024


def namespace_members(pid_namespace):
    """The host PIDs of the processes in ``pid_namespace`` (as /proc/<pid>/ns/pid names it)."""
    if not pid_namespace:
        return []
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == pid_namespace:
                    members.append(int(entry.name))
            except OSError:
                continue
    return members


def interpreter_paths(python=None):
    """What a sealed program may read besides the system's /usr: the interpreter, its environment (the
    packages) and this package (the probe, the detectors). ``python``: another virtual environment's
    interpreter (``<env>/bin/python``), whose environment and base interpreter (its ``pyvenv.cfg``'s
    ``home``) are added; bound at their own paths, so what lies above them (``/root``) stays closed."""
    here = Path(__file__).resolve().parent
    paths = {sys.base_prefix, sys.prefix, os.path.realpath(sys.prefix), str(here)}
    if python is not None:
        prefix = Path(python).parent.parent
        paths |= {str(prefix), os.path.realpath(prefix)}
        home = _venv_home(prefix)
        if home:
            paths.add(str(Path(home).parent))
    return sorted(paths)


def _venv_home(prefix):
    """The ``home`` of a virtual environment's ``pyvenv.cfg``: the bin folder of the interpreter it was made from."""
    try:
        lines = Path(prefix, "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    return next((line.partition("=")[2].strip() for line in lines if line.partition("=")[0].strip() == "home"), "")
