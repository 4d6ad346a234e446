"""The zygote: an interpreter that has already imported torch and the probe, and forks one sealed child
per run (runners.isolation), so that a run no longer pays the interpreter's and torch's start-up.

``python -m runners.zygote FD PRELOAD`` serves requests on the SOCK_SEQPACKET socket FD: a request is one
packet, a SandboxSpec as JSON, with three file descriptors (the run's own socket, its stdout and its
stderr). The zygote forks the run's launcher and goes back to waiting; the launcher reports on the
run's socket. It exits when the worker closes its end, and dies with the worker.

A warm child runs the reproducer as ``__main__`` with its argv, in the environment the run declares.
What the zygote imports first is its *preload* (``PRELOADS``): torch and the probe for the in-process
detectors, torch and TrainCheck for TrainCheck's phases, and for TrainCheck's traced programs torch already
instrumented as the program's instrumented copy would instrument it (a zygote of each, started on first use;
a preload with an argument is a ``(name, argument)`` pair, one zygote per distinct argument).
``torch.multiprocessing.spawn`` forks its ranks from the same warm state instead of starting a new
interpreter for each.

A run in another Python environment (runners.environments: another torch release) forks from a zygote of that
environment's interpreter, started the same way (``python -m runners.zygote`` in the repository, whose
modules it imports are pure Python); ``PRELOAD_PACKAGES`` says what each preload needs the environment to have.
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
from pathlib import Path

from .detectors.traincheck import TRAINCHECK_ENV
from .isolation import SandboxSpec, launch

REQUEST_BYTES = 1 << 20
MAX_ZYGOTES_WITH_ARGUMENT = 2  # per process: instrumented zygotes are keyed by the fit; older ones are closed
MAX_ENVIRONMENT_ZYGOTES = 2  # per process: zygotes of other environments' interpreters; older ones are closed
READY = b"ready"
START_TIMEOUT_SECONDS = 300
REPO_ROOT = Path(__file__).resolve().parent.parent
# What the zygote's environment holds when it imports torch: the same as every run's, nothing secret.
ZYGOTE_ENV_PASSED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG", "TZ")


class ZygoteError(RuntimeError):
    """The zygote did not start or went away."""


class ZygoteClient:
    """The worker's end of its zygote for one preload: started on first use, one per process and preload (a
    forked pool child starts its own), gone with the process."""

    _shared = {}
    _lock = threading.Lock()

    @classmethod
    def shared(cls, preload="torch", python=None):
        """The zygote of ``preload`` (a name of ``PRELOADS``, or a ``(name, argument)`` pair) on the interpreter
        ``python`` (None: this process's own; else another environment's)."""
        key = (preload, str(python) if python else None)
        with cls._lock:
            client = cls._shared.get(key)
            if client is None or not client.alive():
                cls._close_oldest([other for other in cls._shared if isinstance(other[0], tuple)],
                                  MAX_ZYGOTES_WITH_ARGUMENT, isinstance(preload, tuple))
                cls._close_oldest([other for other in cls._shared if other[1]], MAX_ENVIRONMENT_ZYGOTES, key[1])
                client = cls._shared[key] = cls(preload, python)
            return client

    @classmethod
    def _close_oldest(cls, keys, keep, adding):
        """Close the oldest of ``keys`` (in the order they started) so that at most ``keep`` stay with the new one."""
        if adding:
            for key in keys[:max(0, len(keys) - keep + 1)]:
                cls._shared.pop(key).close()

    def __init__(self, preload="torch", python=None):
        name, argument = preload if isinstance(preload, tuple) else (preload, None)
        if name not in PRELOADS:
            raise ValueError(f"unknown preload {name!r}: one of {', '.join(PRELOADS)}")
        python = str(python or sys.executable)
        self.owner = os.getpid()
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {"PATH": os.pathsep.join([str(Path(python).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "HOME": tempfile.gettempdir()}
        env.update({name: os.environ[name] for name in ZYGOTE_ENV_PASSED if name in os.environ})
        from .compile_cache import COMPILER_ENV  # here: the zygote process itself never loads Django

        env.update(COMPILER_ENV)
        env.update(PRELOAD_ENV.get(name, {}))
        self.log = tempfile.TemporaryFile()
        self.argument_file = None
        command = [python, "-m", "runners.zygote", str(theirs.fileno()), name]
        if argument is not None:  # in a file: it can be larger than a command line's argument may be
            self.argument_file = tempfile.NamedTemporaryFile("w", prefix="zygote-", suffix=".json")
            self.argument_file.write(argument)
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

    def alive(self):
        return self.owner == os.getpid() and self.process.poll() is None

    def close(self):
        """Stop the zygote (the runs it forked go on); it exits as its control socket closes."""
        self.control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        if self.argument_file is not None:
            self.argument_file.close()

    def launch(self, spec, fds):
        """Have the zygote fork a launcher for ``spec`` with ``fds`` (the run's socket, stdout, stderr)."""
        try:
            socket.send_fds(self.control, [spec.to_json().encode()], fds)
        except OSError as error:
            raise ZygoteError(f"the zygote went away: {error}") from error


def preload_torch():
    """What every run would import first: torch and its usual companions, and the probe's detectors."""
    import argparse  # noqa: F401
    import math  # noqa: F401

    try:
        import numpy  # noqa: F401
    except ImportError:  # an environment without it (runners.environments): its runs do without it, warm or cold
        pass
    import torch
    import torch.distributed  # noqa: F401
    import torch.multiprocessing  # noqa: F401
    import torch.nn  # noqa: F401
    import torch.nn.functional  # noqa: F401
    import torch.optim  # noqa: F401
    import torch.utils.data  # noqa: F401

    from .detectors import registered_plugins  # noqa: F401 - every plugin module, as the probe loads them

    # The first optimizer a process builds imports torch._dynamo, torch._inductor and sympy (about 3 s here).
    # A one-element tensor runs no parallel kernel: the zygote starts no thread pool a fork would break.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    torch.multiprocessing.spawn = _spawn_by_fork


def preload_traincheck():
    """What each of TrainCheck's phases imports first: torch, then TrainCheck's instrumentor, collector,
    checker and inference engine. Nothing more of torch: TrainCheck instruments the torch modules loaded
    when the program starts, so a warm run must find the ones a cold run would (no optimizer warm-up).

    Ranks fork from the traced program, already instrumented, and each starts a trace of its own
    (``detectors.traincheck.ForkedRankTracer``)."""
    import torch
    import traincheck.checker  # noqa: F401
    import traincheck.collect_trace  # noqa: F401
    import traincheck.infer_engine  # noqa: F401
    import traincheck.instrumentor.tracer  # noqa: F401

    from .detectors.traincheck import ForkedRankTracer

    torch.multiprocessing.spawn = _spawn_by_fork_as(torch.multiprocessing.spawn, ForkedRankTracer)


def preload_traincheck_instrumented(spec_path):
    """``preload_traincheck``, then torch instrumented as TrainCheck's instrumented copy of a program would
    instrument it first thing (``detectors.traincheck.instrumentation_spec``: the copy's settings, the options of
    its ``Instrumentor`` calls and its ``instr_opts.json``), then the first optimizer's imports, untraced.

    In a program forked from here the copy's own ``Instrumentor(...).instrument()`` calls wrap nothing more and
    return at once (TrainCheck skips what it has instrumented), and its first optimizer finds ``torch._dynamo``
    imported. Only the order differs from a cold run: torch's compiler is imported *after* instrumentation, as the
    cold run imports it, so the same functions are wrapped (importing it first wraps 5,167 more); but the calls torch
    makes while importing it are not traced, in fitting and checking alike."""
    import shutil

    preload_traincheck()
    import torch
    import traincheck.config.config as traincheck_config
    from traincheck.instrumentor.tracer import Instrumentor

    with open(spec_path, encoding="utf-8") as source:
        spec = json.load(source)
    for name, value in spec["config"].items():
        setattr(traincheck_config, name, value)
    scratch = tempfile.mkdtemp(prefix="zygote-traincheck-")
    os.environ["TRAINCHECK_OUTPUT_DIR"] = scratch  # the zygote's own instrumentation log, removed below
    os.chdir(scratch)
    try:
        if spec["instr_opts"] is not None:  # read once by the first Instrumentor, kept by TrainCheck for the process
            Path(scratch, traincheck_config.INSTR_OPTS_FILE).write_text(spec["instr_opts"], encoding="utf-8")
        Instrumentor(torch, **spec["instrumentor"]).instrument()
        traincheck_config.DISABLE_WRAPPER = True
        try:
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # imports torch._dynamo: see preload_torch
        finally:
            traincheck_config.DISABLE_WRAPPER = False
    finally:
        os.chdir(REPO_ROOT)
        os.environ.pop("TRAINCHECK_OUTPUT_DIR", None)
        shutil.rmtree(scratch, ignore_errors=True)
    from .detectors.traincheck import ForkedRankTracer

    _run_start_hooks.append(ForkedRankTracer.start)  # a run forked from here starts a trace of its own


_run_start_hooks = []  # what a warm child runs first (the zygote's preload adds them)


PRELOADS = {"torch": preload_torch, "traincheck": preload_traincheck,
            "traincheck-instrumented": preload_traincheck_instrumented}
PRELOAD_ENV = {"traincheck": TRAINCHECK_ENV, "traincheck-instrumented": TRAINCHECK_ENV}  # set before the imports
# The packages each preload imports: a detector's runs need them in whatever environment they run in.
PRELOAD_PACKAGES = {"torch": ("torch",), "traincheck": ("torch", "traincheck"),
                    "traincheck-instrumented": ("torch", "traincheck")}


def _spawn_by_fork(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn", rank_hooks=None):
    """``torch.multiprocessing.spawn`` in a warm run: the ranks fork from this already warm process."""
    from torch.multiprocessing import start_processes

    global _forking_ranks
    _forking_ranks = rank_hooks
    try:
        return start_processes(_forked_rank(fn, rank_hooks), args, nprocs, join, daemon, start_method="fork")
    finally:
        _forking_ranks = None


_forking_ranks = None  # the rank hooks of the spawn under way: a process forked meanwhile is one of its ranks


def _start_forked_rank():
    """In a process just forked: if it is a rank, its hooks' ``start()`` runs before any Python code of the
    rank's (multiprocessing's bootstrap, torch's wrapper), which a tracer may record. Its own forks are not
    ranks."""
    global _forking_ranks
    hooks, _forking_ranks = _forking_ranks, None
    if hooks is not None:
        hooks.start()


def _spawn_by_fork_as(spawn, rank_hooks):
    """``_spawn_by_fork`` with ``rank_hooks`` (``.start()`` as a rank is forked, ``.finish()`` as it ends), under
    the name of the ``spawn`` it replaces: a tracer that records calls by name sees the function a cold run
    calls."""
    os.register_at_fork(after_in_child=_start_forked_rank)

    @functools.wraps(spawn)
    def spawn_by_fork(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        return _spawn_by_fork(fn, args, nprocs, join, daemon, start_method, rank_hooks)

    return spawn_by_fork


def _forked_rank(fn, rank_hooks=None):
    """``fn``, then what a spawned rank's interpreter does as it exits: a forked rank ends in ``os._exit``,
    which would lose what the program's open files still buffer."""
    def rank(*args):
        try:
            return fn(*args)
        finally:
            _finalize_main()
            if rank_hooks is not None:
                rank_hooks.finish()

    return rank


def _finalize_main():
    """Drop the script's globals and collect: the files it left open are flushed and closed, as at exit."""
    main = sys.modules.get("__main__")
    if main is not None:
        main.__dict__.clear()
    gc.collect()


def run_warm(spec):
    """In the sealed child: become ``python script args...`` in the run's environment; never returns."""
    os.environ.clear()
    os.environ.update(spec.env)
    script, *arguments = spec.argv[1:]
    path = os.path.abspath(script)  # as the interpreter makes ``__main__.__file__`` since Python 3.9
    sys.argv = [script, *arguments]
    sys.path[0] = os.path.dirname(path)
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__ = path, builtins
    sys.modules["__main__"] = main
    code = 0
    for hook in _run_start_hooks:
        hook()
    try:
        if spec.env.get("SILENTBENCH_DETECTOR"):
            from .detectors.base import start_probe

            start_probe(alarm_key=spec.alarm_key)
        with open(path, "rb") as source:
            program = compile(source.read(), path, "exec")
        exec(program, main.__dict__)
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback on stderr, exit code 1
        traceback.print_exc()
        code = 1
    threading._shutdown()  # what the interpreter does at exit: wait for threads, then atexit, then finalize
    atexit._run_exitfuncs()
    _finalize_main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def serve(control):
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


def _launch_child(spec, conn_fd, stdout_fd, stderr_fd):
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(source, target)
    for fd in (null, stdout_fd, stderr_fd):
        os.close(fd)
    conn = socket.socket(fileno=conn_fd)
    conn.set_inheritable(False)

    def report(message, fds=()):
        socket.send_fds(conn, [json.dumps(message).encode()], list(fds))

    launch(spec, report)


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    control.set_inheritable(False)
    PRELOADS[sys.argv[2] if len(sys.argv) > 2 else "torch"](*sys.argv[3:])
    if threading.active_count() > 1:  # a fork copies one thread: the others' locks would stay held for good
        raise ZygoteError(f"the preload left threads running: {threading.enumerate()}")
    serve(control)


if __name__ == "__main__":
    main()
