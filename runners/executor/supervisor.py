"""The worker's side of a sealed run: start it, watch it, and say how it ended.

By default every program is sealed in namespaces of its own (runners.executor.isolation), started by a zygote
(runners.executor.zygote) that forks it warm or execs it cold, and watched from here: its time, its output, its
total memory, the oracle record on its report FIFO. Where this kernel or container offers no user namespaces,
``run_sandboxed`` refuses to run it, unless the operator opted in (``Limits.allow_unisolated``): then the older
confinement applies (runners.executor.unisolated), and the run says so.
"""
import functools
import json
import logging
import math
import os
import pwd
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .cgroups import RunCgroup
from .cgroups import support as cgroup_support
from .confinement import landlock_abi
from .confinement import layers as confinement_layers
from .isolation import Layers, SandboxSpec, probe_layers
from .limits import Limits, thread_environment
from .output import CapturedStream, capture
from .result import SandboxResult
from .unisolated import run_unisolated, sandbox_account
from .zygote import TORCH_PRELOAD, Preload, ZygoteClient

logger = logging.getLogger(__name__)
GROUP_CHECK_SECONDS = 0.2
RUNNERS_DIR = Path(__file__).resolve().parent.parent  # the package a sealed program imports from: probe, detectors


def run_sandboxed(argv: list[str], workdir: str | Path, env: dict[str, str], limits: Limits, *, warm: bool = False,
                  preload: Preload = TORCH_PRELOAD, report_path: str | Path | None = None, alarm_key: str = "",
                  probe: str = "", devices: Sequence[str] = (), python: str | Path | None = None) -> SandboxResult:
    """Run ``argv`` in ``workdir`` with exactly ``env``; never raises for the program's misbehaviour.

    ``warm``: ``argv`` is ``[python, script, *args]`` and the script runs in a child of the zygote that has already
    imported ``preload``. ``report_path``: where the program writes its report (a path in ``workdir``); what it
    wrote comes back as ``SandboxResult.report_text``. ``alarm_key``: handed to a warm run's probe in memory,
    which ``probe`` ("module:function") starts before the script. ``devices``: device nodes it may use (leased
    GPUs). ``python``: the interpreter of another Python environment the program runs on, readable in the
    sandbox and warm from a zygote of its own; None for this process's own.
    """
    env = {**thread_environment(limits.threads), **env}  # what the reproducer declares itself comes first
    layers = isolation_layers()
    if layers["namespaces"]:
        return _run_isolated(Path(workdir), argv, env, limits, warm, preload, report_path, alarm_key, probe,
                             devices, layers, python)
    if not limits.allow_unisolated:
        return SandboxResult(exit_code=None, wall_seconds=0.0, stdout="", stderr="", output_truncated=False,
                             refused=layers["error"])
    if alarm_key:  # no warm start without namespaces: a cold probe takes the key from its environment
        env = {**env, "SILENTBENCH_ALARM_KEY": alarm_key}
    result = run_unisolated(argv, workdir, env, limits, data_mb=0 if devices else limits.memory_mb)
    result.started_warm = False
    result.layers = ["landlock"] if landlock_abi() else []
    result.notes.append("Not sealed in namespaces (this worker's operator allowed it): " + layers["error"])
    if report_path is not None and Path(report_path).exists():
        with open(report_path, "rb") as report:
            result.report_text = report.read(limits.report_cap_bytes).decode("utf-8", "replace")
    return result


@functools.cache
def isolation_layers() -> Layers:
    """{"namespaces": [...], "error": why none} for this process's children; probed once."""
    return probe_layers()


def describe_confinement(limits: Limits) -> str:
    """One line for the worker's log: how runs are sealed here, or why they are not."""
    layers = isolation_layers()
    if layers["namespaces"]:
        return (f"runs sealed in their own {', '.join(layers['namespaces'])} namespaces; "
                f"{', '.join(confinement_layers())}; Landlock ABI {landlock_abi()}; {cgroup_support().describe()}")
    if not limits.allow_unisolated:
        return (f"REFUSING untrusted code: this worker cannot seal runs in namespaces of their own "
                f"({layers['error']}); it runs none unless its operator sets SILENTBENCH_ALLOW_UNISOLATED=true")
    account = sandbox_account(limits, [sys.executable]) or pwd.getpwuid(os.geteuid())
    abi = landlock_abi()
    confined = f"Landlock ABI {abi}" if abi else "NOT confined (no Landlock in this kernel or container)"
    return f"reproducers run as {account.pw_name}; writes outside their directory: {confined}"


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

    def start(self) -> None:
        self._read_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._write_fd = os.open(self.path, os.O_WRONLY)
        os.set_blocking(self._read_fd, True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
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

    def close(self) -> None:
        os.close(self._write_fd)
        self._thread.join(timeout=10)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _is_oracle(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("event") == "oracle"


MEMORY_CHECK_EVERY = 5  # ticks of GROUP_CHECK_SECONDS: reading every process's PSS costs more than a count
REPORT_FLOOD_FACTOR = 4  # a report this many times its cap is a flood: the run is killed
KILLED_RUN_GRACE_SECONDS = 60  # how long a killed run may take to report its end (its copy-out included)


def _run_isolated(cwd: Path, argv: list[str], env: dict[str, str], limits: Limits, warm: bool, preload: Preload,
                  report_path: str | Path | None, alarm_key: str, probe: str, devices: Sequence[str], layers: Layers,
                  python: str | Path | None) -> SandboxResult:
    """A sealed run of ``argv`` in ``cwd``; its directory (what it may write, copied in and out) is its home,
    ``env["HOME"]``, which holds ``cwd`` (TrainCheck's fit runs each reference program in a folder of it)."""
    workdir = Path(env.get("HOME") or cwd)
    root_mountpoint = Path(tempfile.mkdtemp(prefix=f"{workdir.name}-root-", dir=workdir.parent))
    fifo = None
    account = pwd.getpwnam(limits.user) if os.geteuid() == 0 and limits.user else None
    spec = SandboxSpec(
        workdir=str(workdir), cwd=str(cwd), root_mountpoint=str(root_mountpoint), argv=list(argv), env=dict(env),
        warm=warm,
        file_size_mb=limits.file_size_mb,
        max_processes=limits.max_processes, open_files=limits.open_files, threads=limits.threads,
        # No cgroup to limit its memory: each process's private writable memory backs the watch (not for a GPU run,
        # whose driver's mappings were never measured against it)
        data_mb=0 if (limits.own_cgroup and cgroup_support().version) or devices else limits.memory_mb,
        disk_mb=limits.disk_mb, copy_out_mb=limits.disk_mb,
        read_only=interpreter_paths(python),
        devices=list(devices),
        alarm_key=alarm_key, start_hook=probe, host_uid=account.pw_uid if account else None,
        host_gid=account.pw_gid if account else None,
    )
    report = None
    stdout_read = stdout_write = stderr_read = stderr_write = None
    mine = theirs = run = None
    streams: dict[str, CapturedStream]
    readers: list[threading.Thread]
    streams, readers = {}, []
    timed_out = memory_exceeded = ended_after_oracle = forked_too_much = report_flood = False
    cgroup, cgroup_left = None, ""
    try:
        if limits.own_cgroup and cgroup_support().version:  # the kernel's account of its memory, processes, CPU
            cgroup = RunCgroup(cgroup_support(), limits.memory_mb, limits.disk_mb, limits.max_processes)
            spec.cgroup_procs = cgroup.procs_files
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
        streams, flooded, readers = capture(os.fdopen(stdout_read, "rb"), os.fdopen(stderr_read, "rb"), limits,
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
            elif len(run.members()) >= limits.max_processes:
                forked_too_much = True  # RLIMIT_NPROC refuses more; a program that keeps trying is stopped
            elif (cgroup is not None or ticks % MEMORY_CHECK_EVERY == 0) and run.memory_mb(cgroup) > limits.memory_mb:
                memory_exceeded = True
            else:
                continue
            run.kill()
            if not run.ended(KILLED_RUN_GRACE_SECONDS):
                run.note = run.note or "The run did not report its end after it was killed."
            break
        wall_seconds = (run.ended_at or time.monotonic()) - started
        memory_exceeded = memory_exceeded or (cgroup is not None and cgroup.oom_killed())
    except BaseException:  # the caller was interrupted (Ctrl-C, SystemExit on SIGTERM): the program goes too
        if run is not None:
            run.kill()
        raise
    finally:
        for read_fd in (stdout_read, stderr_read):
            if read_fd is not None:
                os.close(read_fd)
        if run is not None:
            run.close()
        elif mine is not None:
            mine.close()
        if report:
            report.close()
            assert fifo is not None  # made before the report's reader
            shutil.rmtree(fifo.parent, ignore_errors=True)
        for reader in readers:
            reader.join(timeout=5)
        _remove_mountpoint(root_mountpoint)
        if cgroup is not None:
            cgroup_left = cgroup.remove()
    notes = [note for note in (run.note, run.unreadable) if note]
    if cgroup_left:
        logger.warning("a run's cgroup was not removed: %s", cgroup_left)
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
        layers=([f"{name} namespace" for name in layers["namespaces"]] + confinement_layers()
                + ([f"cgroup v{cgroup.version}"] if cgroup is not None else [])
                + (["gpu view: /sys read-only, /proc writable"] if devices else [])),
        notes=notes,
    )


def _remove_mountpoint(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        logger.warning("could not remove %s", path)


class _SealedRun:
    """The worker's side of one sealed run: the launcher's messages on ``conn``, the init's pidfd."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.pidfd: int | None = None
        self.init_pid: int | None = None  # the host PID of the run's init, whose descendants are the run
        self.exit_code: int | None = None
        self.note = ""
        self.unreadable = ""  # why its memory could not be read, when that killed it
        self.over = False
        self.program_ended = False  # its launcher is copying its directory out
        self.ended_at: float | None = None
        self.lock = threading.Lock()  # a kill from a stream reader's thread never meets a closed pidfd

    def ended(self, timeout: float | None) -> bool:
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
                self.init_pid = news["pid"]
            if news.get("ended") and not self.program_ended:
                self.program_ended, self.ended_at = True, time.monotonic()
            if "exit" in news:
                self.over, self.exit_code, self.note = True, news["exit"], news.get("note", "")
                if self.exit_code is None and not self.note:
                    self.note = "The sandbox failed to start the program."
        self._close_pidfd()
        return True

    def _close_pidfd(self) -> None:
        with self.lock:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None

    def close(self) -> None:
        self._close_pidfd()
        self.conn.close()

    def kill(self) -> None:
        with self.lock:
            if self.pidfd is not None:
                try:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                except OSError:
                    pass

    def members(self) -> list[int]:
        """The host PIDs of the run's processes: its init and every descendant (an orphan of the run is reparented
        to its init). Read from each process's /proc/<pid>/stat, which the worker may read even of a process that
        made itself undumpable; [] once the init has died (its PID may then be another process's)."""
        if self.init_pid is None or not self._init_alive():
            return []
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(f"/proc/{entry.name}/stat", "rb") as stat:
                        parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry.name))
        members, waiting = [], [self.init_pid]
        while waiting:
            pid = waiting.pop()
            members.append(pid)
            waiting.extend(children.get(pid, ()))
        return members if self._init_alive() else []

    def _init_alive(self) -> bool:
        with self.lock:
            if self.pidfd is None:
                return False
            try:
                signal.pidfd_send_signal(self.pidfd, 0)
            except OSError:
                return False
            return True

    def memory_mb(self, cgroup: RunCgroup | None = None) -> float:
        """What the run holds, in MB: its cgroup's account (kernel memory included) where it has one, else its
        program's processes' proportional share of memory (PSS) together (the run's init, the sandbox's own and a few
        MB, aside). That watch fails closed: a process of the program that the worker may not read (it made itself
        undumpable) counts as over any limit."""
        if cgroup is not None:
            return cgroup.memory_mb()
        total = 0
        for pid in self.members():
            if pid == self.init_pid:  # ours, not the program's: unreadable so that the program cannot trace it
                continue
            try:
                with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
                    for line in rollup:
                        if line.startswith(b"Pss:"):
                            total += int(line.split()[1])
                            break
            except PermissionError:
                self.unreadable = (f"Killed: the worker could not read the memory of process {pid} of the run (it "
                                   "had made itself unreadable), so the run counted as over its memory limit.")
                return math.inf
            except (OSError, ValueError):  # it ended meanwhile
                continue
        return total / 1024


def interpreter_paths(python: str | Path | None = None) -> list[str]:
    """What a sealed program may read besides the system's /usr: the interpreter, its environment (the
    packages) and this package (the probe, the detectors). ``python``: another virtual environment's
    interpreter (``<env>/bin/python``), whose environment and base interpreter (its ``pyvenv.cfg``'s
    ``home``) are added; bound at their own paths, so what lies above them (``/root``) stays closed."""
    paths = {sys.base_prefix, sys.prefix, os.path.realpath(sys.prefix), str(RUNNERS_DIR)}
    # Packages found outside its prefix: a user's site, a distribution's dist-packages, or the folders of a node's own
    # Python that bin/gpu-check's environment reaches through a .pth file (that Python's CUDA build of torch)
    paths |= {path for path in sys.path if path.endswith(("site-packages", "dist-packages")) and os.path.isdir(path)}
    if python is not None:
        prefix = Path(python).parent.parent
        paths |= {str(prefix), os.path.realpath(prefix)}
        home = _venv_home(prefix)
        if home:
            paths.add(str(Path(home).parent))
    return sorted(paths)


def _venv_home(prefix: str | Path) -> str:
    """The ``home`` of a virtual environment's ``pyvenv.cfg``: the bin folder of the interpreter it was made from."""
    try:
        lines = Path(prefix, "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    return next((line.partition("=")[2].strip() for line in lines if line.partition("=")[0].strip() == "home"), "")
