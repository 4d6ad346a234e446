"""How a sealed program ended, as facts: what the executor saw and measured, and which way it ended (``Ending``).

Sentences for a person are the run's business, not the executor's: runners.failures turns an ending into a failure
kind and a reason."""
import enum
import signal
from dataclasses import dataclass, field

from .limits import Limits

OOM_MARKERS = ("MemoryError", "std::bad_alloc", "can't allocate memory", "Cannot allocate memory", "out of memory")


class Ending(enum.StrEnum):
    """The ways a program can end badly, in the order ``SandboxResult.ending`` tells them apart."""

    REFUSED = "refused"  # the sandbox did not start it (``SandboxResult.refused`` says why)
    MEMORY_EXCEEDED = "memory_exceeded"  # killed by the watch: its processes together held more than the limit
    PROCESS_LIMIT_EXCEEDED = "process_limit_exceeded"  # killed for having more processes than the limit at once
    TIME_LIMIT = "time_limit"  # killed at its time limit
    OUTPUT_FLOOD = "output_flood"  # killed for writing more output (or report records) than the flood limit
    OUT_OF_MEMORY = "out_of_memory"  # ended on its own, saying it could not allocate memory
    PROCESS_LIMIT_REACHED = "process_limit_reached"  # ended on its own after a fork failed at the process limit
    WRITE_REFUSED = "write_refused"  # ended on its own after a write was refused (outside its directory)
    CRASHED = "crashed"  # any other non-zero end: a signal or an exit code


def signal_name(exit_code: int | None) -> str | None:
    """SIGKILL for -9 (a subprocess killed by a signal), None for an exit code."""
    if exit_code is not None and exit_code < 0:
        try:
            return signal.Signals(-exit_code).name
        except ValueError:
            return f"signal {-exit_code}"
    return None


def looks_out_of_memory(stderr: str) -> bool:
    return any(marker in stderr for marker in OOM_MARKERS)


def hit_process_limit(stderr: str) -> bool:
    return "BlockingIOError" in stderr or "Resource temporarily unavailable" in stderr


def looks_like_refused_write(stderr: str) -> bool:
    return "PermissionError" in stderr or "Permission denied" in stderr or "Read-only file system" in stderr


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
    layers: list[str] = field(default_factory=list)  # the isolation layers that were active
    started_warm: bool = False  # forked from the zygote (else the command was exec'd)
    notes: list[str] = field(default_factory=list)  # for the run page: how it was started, ended, confined

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.exit_code)

    @property
    def sealed(self) -> bool:
        """Whether it ran in PID and mount namespaces of its own: once it ended, no process of it is left."""
        return {"pid namespace", "mount namespace"} <= set(self.layers)

    @property
    def last_line(self) -> str:
        """The program's last words on stderr: they decide (an earlier, handled "Permission denied" is no reason)."""
        return next((line for line in reversed(self.stderr.strip().splitlines()) if line.strip()), "")

    @property
    def forking(self) -> bool:
        """Whether its last words say a fork failed at the process limit."""
        return hit_process_limit(self.last_line)

    def ending(self) -> Ending | None:
        """How it ended badly, or None when it ended normally: exit code 0, or judged from its records."""
        if self.refused:
            return Ending.REFUSED
        if self.ended_after_oracle:
            return None
        if self.memory_exceeded:
            return Ending.MEMORY_EXCEEDED
        if self.forked_too_much:
            return Ending.PROCESS_LIMIT_EXCEEDED
        if self.timed_out:
            return Ending.TIME_LIMIT
        if self.flooded:
            return Ending.OUTPUT_FLOOD
        if self.exit_code == 0:
            return None
        if looks_out_of_memory(self.stderr):
            return Ending.OUT_OF_MEMORY
        if self.forking:
            return Ending.PROCESS_LIMIT_REACHED
        if looks_like_refused_write(self.last_line):
            return Ending.WRITE_REFUSED
        return Ending.CRASHED


class SandboxedProgramFailed(RuntimeError):
    """A sealed program that its caller needed to end well (a detector's tool, a submitted detector's hook) did
    not: ``what`` failed, as ``result`` says. runners.failures words it for a person."""

    def __init__(self, what: str, result: SandboxResult, limits: Limits) -> None:
        super().__init__(f"{what} failed ({result.ending()})")
        self.what, self.result, self.limits = what, result, limits
