"""The executor: one program run sealed, watched, and reported on as facts.

Pure Python: no Django, and nothing of the rest of the project. It runs in the worker, in each zygote (also on
the interpreter of another Python environment, which has no Django) and in the sealed run's own processes.

The rooms inside, from the kernel up:
- ``confinement``: what confines the program itself (privileges, no_new_privs, Landlock, rlimits), and ``layers``;
- ``isolation``: the namespaces, the mount view and the launcher, init and program of one sealed run;
- ``zygote``: the interpreter that has imported torch (and its ``Preload``) and forks warm runs;
- ``supervisor``: the worker's side, ``run_sandboxed``: starts a run, watches its time, output, processes and
  memory, reads its report as it is written;
- ``unisolated``: the older confinement, where the kernel offers no namespaces and the operator allowed it;
- ``hardening``: what keeps the worker's own secrets from its runs;
- ``limits``, ``output``, ``result``: what a run may use, its captured output, how it ended (``Ending``).

Everything else imports only what this module exports.
"""
from .cgroups import support as cgroup_support
from .confinement import IsolationError, landlock_abi
from .hardening import hide_from_reproducers
from .limits import Limits
from .result import Ending, SandboxedProgramFailed, SandboxResult, signal_name
from .supervisor import describe_confinement, interpreter_paths, isolation_layers, run_sandboxed
from .zygote import (
    COMPILER_ENV,
    TORCH_PRELOAD,
    Preload,
    ZygoteClient,
    ZygoteError,
    add_run_start_hook,
    spawn_by_fork_with,
    warm_torch,
)

__all__ = [
    "COMPILER_ENV", "TORCH_PRELOAD", "Ending", "IsolationError", "Limits", "Preload", "SandboxResult", "cgroup_support",
    "SandboxedProgramFailed", "ZygoteClient", "ZygoteError", "add_run_start_hook", "describe_confinement",
    "hide_from_reproducers", "interpreter_paths", "isolation_layers", "landlock_abi", "run_sandboxed",
    "signal_name", "spawn_by_fork_with", "warm_torch",
]
