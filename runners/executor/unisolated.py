"""Programs run without namespaces, where this kernel or container offers none and the operator opted in
(``Limits.allow_unisolated``): the older confinement.

From the outside in: its own session and process group (killed as a whole); rlimits for memory (each process's
private writable memory, RLIMIT_DATA: there is no total), file size, core dumps and processes; death with the
process that started it (``PR_SET_PDEATHSIG``), so a worker killed with -9 leaves no reproducer behind; an
unprivileged user when the worker is root (``Limits.user``); and a Landlock ruleset, which needs no privilege (it
works as uid 1000 in Docker, whose default seccomp profile allows it): the program may write only under its own
directory and ``/dev`` (``/dev/null``, ``/dev/shm``, GPU devices), and (ABI 6) may not signal processes outside its
sandbox, such as the worker. Landlock does not stop it from reading files, nor ``/proc/<worker>/environ`` when it
runs as the worker's user: for that the worker hides itself (runners.executor.hardening), and a root worker's
reproducers lose ``CAP_SYS_PTRACE``.
"""
import io
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import cast

from .confinement import confine_unisolated
from .hardening import hide_from_reproducers
from .limits import Limits
from .output import capture
from .result import SandboxResult

logger = logging.getLogger(__name__)
GROUP_CHECK_SECONDS = 0.2


def sandbox_account(limits: Limits, paths: Iterable[str | Path] = ()) -> pwd.struct_passwd | None:
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


def _interpreters(program: str, env: dict[str, str]) -> list[str]:
    """The program's file and, for a script, the interpreter on its ``#!`` line."""
    path = shutil.which(program, path=env.get("PATH")) or program
    try:
        with open(path, "rb") as head:
            line = head.readline(512)
    except OSError:
        return [path]
    words = line[2:].split() if line.startswith(b"#!") else []
    return [path, words[0].decode(errors="replace")] if words else [path]


def _reachable_by(account: pwd.struct_passwd, path: Path) -> bool:
    for parent in path.resolve().parents:
        info = parent.stat()
        search = 0o100 if info.st_uid == account.pw_uid else 0o010 if info.st_gid == account.pw_gid else 0o001
        if not info.st_mode & search:
            return False
    return True


def _give_to(account: pwd.struct_passwd, root: Path) -> None:
    """Hand the run directory to the sandbox's user (a root worker wrote it)."""
    for directory, subdirectories, files in os.walk(root):
        os.chown(directory, account.pw_uid, account.pw_gid)
        for name in files:
            os.chown(os.path.join(directory, name), account.pw_uid, account.pw_gid, follow_symlinks=False)


def group_size(pgid: int) -> int:
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


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_unisolated(argv: list[str], workdir: str | Path, env: dict[str, str], limits: Limits,
                   data_mb: int) -> SandboxResult:
    """The confinement without namespaces (see the module's docstring): an operator's opt-in.

    The program may write only beneath its home (``env["HOME"]``, else ``workdir``): the run's own
    directory. It dies if the calling thread ends, so call this from a thread that waits for it. ``data_mb``: each
    process's private writable memory (RLIMIT_DATA), its only memory limit here; 0 for none (a GPU run).
    """
    hide_from_reproducers()
    writable = Path(env.get("HOME") or workdir)
    account = sandbox_account(limits, [writable, *_interpreters(argv[0], env)])
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
        preexec_fn=confine_unisolated(limits, str(writable), os.getpid(), data_mb),
    )
    # Popen made them buffered readers (the default bufsize); its stubs say only IO[bytes] | None.
    stdout, stderr = cast(io.BufferedReader, process.stdout), cast(io.BufferedReader, process.stderr)
    streams, flooded, readers = capture(stdout, stderr, limits, lambda: _kill_group(process))
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
