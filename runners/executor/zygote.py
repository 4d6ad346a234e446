"""The zygote: an interpreter that has already imported torch (and whatever its preload adds), and forks one
sealed child per run (runners.executor.isolation), so that a run no longer pays the interpreter's and torch's
start-up.

``python -m runners.executor FD TARGET [ARGUMENT_FILE]`` serves requests on the SOCK_SEQPACKET socket FD: a request is
one packet, a SandboxSpec as JSON, with three file descriptors (the run's own socket, its stdout and its stderr).
The zygote forks the run's launcher and goes back to waiting; the launcher reports on the run's socket. It exits
when the worker closes its end, and dies with the worker.

A warm child runs the reproducer as ``__main__`` with its argv, in the environment the run declares. What the
zygote imports first is its *preload* (``Preload``): a function named by its import path, which the caller
provides. The executor knows only torch (``warm_torch``); the detectors say what else their runs need imported
(the probe's plugins, TrainCheck, torch already instrumented by TrainCheck: runners.detectors). A zygote is started
on first use, one per preload, and one per distinct argument of a preload that takes one.
``torch.multiprocessing.spawn`` forks its ranks from the same warm state instead of starting a new interpreter for
each; a preload may add what a forked rank does as it starts and ends (``spawn_by_fork_with``) and what a run
does before its script (``add_run_start_hook``).

A run in another Python environment (another torch release) forks from a zygote of that environment's interpreter,
started the same way (``python -m runners.executor`` in the repository, whose modules it imports are pure Python);
``Preload.packages`` says what the environment must have.
"""
import atexit
import builtins
import functools
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import types
import warnings
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar, NoReturn, Protocol

from .isolation import SandboxSpec, launch
from .limits import thread_environment

REQUEST_BYTES = 1 << 20
MAX_ZYGOTES_WITH_ARGUMENT = 2  # per process: instrumented zygotes are keyed by the fit; older ones are closed
MAX_ENVIRONMENT_ZYGOTES = 2  # per process: zygotes of other environments' interpreters; older ones are closed
READY = b"ready"
START_TIMEOUT_SECONDS = 300
REPO_ROOT = Path(__file__).resolve().parent.parent.parent  # where ``python -m runners.executor`` finds the package
# What the zygote's environment holds when it imports torch: the same as every run's, nothing secret.
ZYGOTE_ENV_PASSED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG", "TZ")
# Set in every zygote's environment and in every run's (runners.compile_cache): Inductor reads it as its config is
# imported. With precompiled headers on, Inductor preprocesses its C++ prelude and builds a 149 MB header under the
# default ``/tmp`` folder in every process that loads a C++ kernel, even one it finds in its cache: 4 to 5 s of a run
# of PT-197888. The kernels are the same code either way; only how g++ is fed differs.
COMPILER_ENV = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}
# Set for a zygote whose preload lists torch among its packages: it imports torch before the preload (_limit_threads)
TORCH_FIRST_ENV = "SILENTBENCH_ZYGOTE_TORCH_FIRST"


@dataclass(frozen=True)
class Preload:
    """What a zygote imports before it forks runs: ``target``, a function named ``"package.module:function"``,
    called in the new zygote (with ``argument`` when it takes one: a zygote per distinct argument). ``name`` is
    what the run page shows; ``packages`` what a Python environment must have for it; ``env``, variables set in
    the zygote's environment before the import (pairs, so that a Preload can key a zygote)."""

    name: str
    target: str
    argument: str | None = None
    packages: tuple[str, ...] = ("torch",)
    env: tuple[tuple[str, str], ...] = ()

    def with_argument(self, argument: str) -> "Preload":
        return Preload(self.name, self.target, argument, self.packages, self.env)


TORCH_PRELOAD = Preload("torch", "runners.executor.zygote:warm_torch")


class RankHooks(Protocol):
    """What a forked rank runs as it starts (before any Python code of the rank) and as it ends."""

    def start(self) -> None: ...

    def finish(self) -> None: ...


class ZygoteError(RuntimeError):
    """The zygote did not start or went away."""


class ZygoteClient:
    """The worker's end of its zygote for one preload: started on first use, one per process and preload (a
    forked pool child starts its own), gone with the process."""

    _shared: ClassVar[dict[tuple[Preload, str | None], "ZygoteClient"]] = {}
    _lock = threading.Lock()

    @classmethod
    def shared(cls, preload: Preload = TORCH_PRELOAD, python: str | Path | None = None) -> "ZygoteClient":
        """The zygote of ``preload`` on the interpreter ``python`` (None: this process's own; else another
        environment's)."""
        key = (preload, str(python) if python else None)
        with cls._lock:
            client = cls._shared.get(key)
            if client is None or not client.alive():
                cls._close_oldest([other for other in cls._shared if other[0].argument is not None],
                                  MAX_ZYGOTES_WITH_ARGUMENT, preload.argument is not None)
                cls._close_oldest([other for other in cls._shared if other[1]], MAX_ENVIRONMENT_ZYGOTES, key[1])
                client = cls._shared[key] = cls(preload, python)
            return client

    @classmethod
    def close_all(cls) -> None:
        """Stop every zygote of this process (a worker's main process after its GPU check, before its pool forks)."""
        with cls._lock:
            while cls._shared:
                cls._shared.popitem()[1].close()

    @classmethod
    def _close_oldest(cls, keys: list[tuple[Preload, str | None]], keep: int, adding: bool | str | None) -> None:
        """Close the oldest of ``keys`` (in the order they started) so that at most ``keep`` stay with the new one."""
        if adding:
            for key in keys[:max(0, len(keys) - keep + 1)]:
                cls._shared.pop(key).close()

    def __init__(self, preload: Preload = TORCH_PRELOAD, python: str | Path | None = None) -> None:
        python = str(python or sys.executable)
        self.owner = os.getpid()
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {"PATH": os.pathsep.join([str(Path(python).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "HOME": tempfile.gettempdir()}
        env.update({name: os.environ[name] for name in ZYGOTE_ENV_PASSED if name in os.environ})
        env.update(COMPILER_ENV)
        # One thread per library in the zygote: each thread OpenBLAS starts holds memory every fork would inherit
        # (about 41 MB); a warm child sizes its pools to its run's budget (_limit_threads).
        env.update(thread_environment(1))
        env.update(preload.env)
        if "torch" in preload.packages:
            env[TORCH_FIRST_ENV] = "1"
        self.log = tempfile.TemporaryFile()
        self.argument_file = None
        command = [python, "-m", "runners.executor", str(theirs.fileno()), preload.target]
        if preload.argument is not None:  # in a file: it can be larger than a command line's argument may be
            self.argument_file = tempfile.NamedTemporaryFile("w", prefix="zygote-", suffix=".json")
            self.argument_file.write(preload.argument)
            self.argument_file.flush()
            command.append(self.argument_file.name)
        self.process = subprocess.Popen(command, pass_fds=[theirs.fileno()], cwd=REPO_ROOT, env=env,
                                        stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                        start_new_session=True)
        theirs.close()
        self.control.settimeout(START_TIMEOUT_SECONDS)
        try:
            ready = self.control.recv(len(READY))
        except TimeoutError:
            ready = b""
        self.control.settimeout(None)
        if ready != READY:
            self.process.kill()
            self.log.seek(0)
            raise ZygoteError(f"the zygote did not start: {self.log.read()[-2000:].decode(errors='replace')}")

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.process.poll() is None

    def close(self) -> None:
        """Stop the zygote (the runs it forked go on); it exits as its control socket closes."""
        self.control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        if self.argument_file is not None:
            self.argument_file.close()

    def launch(self, spec: SandboxSpec, fds: list[int]) -> None:
        """Have the zygote fork a launcher for ``spec`` with ``fds`` (the run's socket, stdout, stderr)."""
        try:
            socket.send_fds(self.control, [spec.to_json().encode()], fds)
        except OSError as error:
            raise ZygoteError(f"the zygote went away: {error}") from error


def warm_torch() -> None:
    """What every run would import first: torch and its usual companions, warmed up; ``torch.multiprocessing.spawn``
    forks its ranks from here."""
    import argparse  # noqa: F401
    import math  # noqa: F401

    try:
        import numpy  # noqa: F401
    except ImportError:  # an environment without it: its runs do without it, warm or cold
        pass
    import torch
    import torch.distributed  # noqa: F401
    import torch.multiprocessing  # noqa: F401
    import torch.nn  # noqa: F401
    import torch.nn.functional  # noqa: F401
    import torch.optim  # noqa: F401
    import torch.utils.data  # noqa: F401

    # The first optimizer a process builds imports torch._dynamo, torch._inductor and sympy (about 3 s here).
    # A one-element tensor runs no parallel kernel: the zygote starts no thread pool a fork would break.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    # What ``torch.compile`` imports on its first call (Dynamo's tracer, AOTAutograd, Inductor's compiler and cache:
    # 0.96 s, 653 modules), and some programs that never compile reach too: a cached run of PT-197888 is 0.8 s
    # shorter with them here, and the quickstart's runs of five programs 46 run-seconds in all; a run that needs none
    # of it forks from a larger zygote (350 MB against 298), 0.01 to 0.02 s longer (docs/performance.md).
    import torch._dynamo.convert_frame  # noqa: F401
    import torch._functorch.aot_autograd  # noqa: F401
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    torch.multiprocessing.spawn = _spawn_by_fork


_run_start_hooks: list[Callable[[], None]] = []  # what a warm child runs first (a preload adds them)


def add_run_start_hook(hook: Callable[[], None]) -> None:
    """In a preload: ``hook()`` runs in every run forked from this zygote, before its script."""
    _run_start_hooks.append(hook)


def _spawn_by_fork(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
                   daemon: bool = False, start_method: str = "spawn", rank_hooks: RankHooks | None = None) -> Any:
    """``torch.multiprocessing.spawn`` in a warm run: the ranks fork from this already warm process."""
    from torch.multiprocessing import start_processes

    global _forking_ranks
    _forking_ranks = rank_hooks
    try:
        return start_processes(_forked_rank(fn, rank_hooks), args, nprocs, join, daemon, start_method="fork")
    finally:
        _forking_ranks = None


# the rank hooks of the spawn under way: a process forked meanwhile is one of its ranks
_forking_ranks: RankHooks | None = None


def _start_forked_rank() -> None:
    """In a process just forked: if it is a rank, its hooks' ``start()`` runs before any Python code of the
    rank's (multiprocessing's bootstrap, torch's wrapper), which a tracer may record. Its own forks are not
    ranks."""
    global _forking_ranks
    hooks, _forking_ranks = _forking_ranks, None
    if hooks is not None:
        hooks.start()


def spawn_by_fork_with(rank_hooks: RankHooks) -> None:
    """In a preload: ``torch.multiprocessing.spawn`` forks its ranks from the warm process, each running
    ``rank_hooks`` (``.start()`` as it is forked, ``.finish()`` as it ends), under the name of the ``spawn`` it
    replaces: a tracer that records calls by name sees the function a cold run calls."""
    import torch.multiprocessing

    spawn = torch.multiprocessing.spawn
    os.register_at_fork(after_in_child=_start_forked_rank)

    @functools.wraps(spawn)
    def spawn_by_fork(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
                      daemon: bool = False, start_method: str = "spawn") -> Any:
        return _spawn_by_fork(fn, args, nprocs, join, daemon, start_method, rank_hooks)

    torch.multiprocessing.spawn = spawn_by_fork


def _forked_rank(fn: Callable[..., Any], rank_hooks: RankHooks | None = None) -> Callable[..., Any]:
    """``fn``, then what a spawned rank's interpreter does as it exits: a forked rank ends in ``os._exit``,
    which would lose what the program's open files still buffer."""
    def rank(*args: Any) -> Any:
        try:
            return fn(*args)
        finally:
            _finalize_main()
            if rank_hooks is not None:
                rank_hooks.finish()

    return rank


def _finalize_main() -> None:
    """Drop the script's globals and collect: the files it left open are flushed and closed, as at exit."""
    main = sys.modules.get("__main__")
    if main is not None:
        main.__dict__.clear()
    gc.collect()


def run_warm(spec: SandboxSpec) -> NoReturn:
    """In the sealed child: become ``python script args...`` in the run's environment; never returns."""
    os.environ.clear()
    os.environ.update(spec.env)
    script, *arguments = spec.argv[1:]
    path = os.path.abspath(script)  # as the interpreter makes ``__main__.__file__`` since Python 3.9
    sys.argv = [script, *arguments]
    sys.path[0] = os.path.dirname(path)
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__ = path, builtins  # type: ignore[attr-defined]  # set as for a real __main__
    sys.modules["__main__"] = main
    code = 0
    for hook in _run_start_hooks:
        hook()
    _limit_threads(spec.threads or len(os.sched_getaffinity(0)))  # 0: the libraries' default, one per core
    try:
        if spec.start_hook:  # the probe of an instrumented run: before the script, with the run's key in memory
            module, _, function = spec.start_hook.partition(":")
            getattr(import_module(module), function)(alarm_key=spec.alarm_key)
        with open(path, "rb") as source:
            program = compile(source.read(), path, "exec")
        exec(program, main.__dict__)
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback on stderr, exit code 1
        traceback.print_exc()
        code = 1
    # What the interpreter does at exit: wait for threads, then atexit, then finalize.
    threading._shutdown()  # type: ignore[attr-defined]  # CPython's private, not in the stubs
    atexit._run_exitfuncs()
    _finalize_main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# torch's own ``set_num_threads``, taken before the preload: a preload may wrap torch's functions (TrainCheck's
# instrumentation traces each call, and a call before the program has named its trace folder fails)
_set_torch_threads: Callable[[int], None] | None = None


def _limit_threads(threads: int) -> None:
    """A warm child's libraries were loaded by its zygote before the run's thread budget was known (the variables of
    runners.executor.limits came too late for them): size their pools now, torch's and, through threadpoolctl,
    OpenMP's, MKL's and OpenBLAS's (numpy's)."""
    if _set_torch_threads is not None:
        _set_torch_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # another Python environment without it: torch's pool only, the others keep the zygote's one
        return
    with warnings.catch_warnings():  # threadpoolctl warns of some pairs of OpenMP libraries: not the run's output
        warnings.simplefilter("ignore")
        try:
            threadpool_limits(threads)
        except Exception:  # noqa: BLE001 - best effort: the run goes on with the pools as they are
            pass


def _exit_code(code: str | int | None) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def serve(control: socket.socket) -> NoReturn:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # launchers report on their own sockets; nobody waits
    control.sendall(READY)
    while True:
        message, fds, _, _ = socket.recv_fds(control, REQUEST_BYTES, 3)
        if not message:
            os._exit(0)
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        conn_fd, stdout_fd, stderr_fd = fds
        if os.fork() == 0:
            control.close()
            _launch_child(SandboxSpec.from_json(message), conn_fd, stdout_fd, stderr_fd)
        for fd in fds:
            os.close(fd)


def _launch_child(spec: SandboxSpec, conn_fd: int, stdout_fd: int, stderr_fd: int) -> NoReturn:
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(source, target)
    for fd in (null, stdout_fd, stderr_fd):
        os.close(fd)
    conn = socket.socket(fileno=conn_fd)
    conn.set_inheritable(False)

    def report(message: dict[str, Any], fds: Iterable[int] = ()) -> None:
        socket.send_fds(conn, [json.dumps(message).encode()], list(fds))

    launch(spec, report, run_warm)


def main() -> None:
    """``python -m runners.executor FD TARGET [ARGUMENT_FILE]``: preload, then serve the worker on FD."""
    control = socket.socket(fileno=int(sys.argv[1]))
    control.set_inheritable(False)
    module, _, function = sys.argv[2].partition(":")
    if os.environ.pop(TORCH_FIRST_ENV, "") == "1":
        global _set_torch_threads
        import torch

        _set_torch_threads = torch.set_num_threads
    getattr(import_module(module), function)(*sys.argv[3:])
    if threading.active_count() > 1:  # a fork copies one thread: the others' locks would stay held for good
        raise ZygoteError(f"the preload left threads running: {threading.enumerate()}")
    _settle_for_forks()
    serve(control)


def _settle_for_forks() -> None:
    """What the preload made belongs to the zygote; every run forked from it would otherwise pay for it again.

    * Its objects move to the collector's permanent generation (``gc.freeze``, what pre-forking servers do), after a
      collection of its garbage: a collection in a run no longer walks torch's objects, writing to each one's
      header and so copying every page of the zygote's heap (0.17 s of a single-rank run here, and 0.38 s of a
      two-rank one).
    * torch's finalizers no longer run at a run's exit: one per operator library (188)
      takes the library's registrations down, 50 ms of work at the end of a process that then ends. Only torch's: a
      preload's other finalizers (a flush, say) still run at a run's exit, as do the run's own and every ``atexit``
      function.
    """
    gc.collect()
    gc.freeze()
    for finalizer in list(weakref.finalize._registry):  # type: ignore[attr-defined]  # no public way to list them
        held = finalizer.peek()  # (object, function, args, kwargs); None once its object is gone
        module = (getattr(held[1], "__module__", None) or "") if held else ""
        if module == "torch" or module.startswith("torch."):
            finalizer.atexit = False
