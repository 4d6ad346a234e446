"""Why runs fail: every failed or cancelled run has a kind (``Run.failure_kind``, a RunFailureKind) and a
sentence for a person (``Run.failure_reason``), set together where the failure is recorded.

This module holds every sentence builder there is, and ``REASON_BUILDERS`` says which builders write the
sentences of each kind:
- how a sealed program ended badly: the executor reports it as facts (runners.executor.Ending), and
  ``program_failure`` words it;
- what happened before, around or instead of the program: a refusal or an error that fails a run raises a
  ``RunRefused``, which carries its kind and its sentence, and the worker records both as they are;
- what the reconciler and the campaign actions write (lost, cancelled, nobody can serve it).
The synthetic history (devtools.synthetic) writes its failures with the same builders and kinds. Migration 0007
classified the runs stored before kinds existed from these sentences.
"""
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from django.db.models import Count, QuerySet

from .executor import Ending, Limits, SandboxedProgramFailed, SandboxResult, signal_name
from .models import UNSUCCESSFUL_STATUSES, Run, RunFailureKind

# --- How a sealed program ended badly ----------------------------------------------------------------------------

def process_limit_exceeded(limits: Limits) -> str:
    """Killed for having more than ``limits.max_processes`` processes at once (the group count)."""
    return (f"Process limit exceeded: more than {limits.max_processes} processes at once (a fork bomb?); "
            "the process group was killed.")


def time_limit_exceeded(limits: Limits, forking: bool = False) -> str:
    return (f"Time limit exceeded: still running after {limits.time_limit_seconds:g} s; "
            "the process group was killed."
            + (f" It had reached the limit of {limits.max_processes} processes (a fork bomb?)." if forking else ""))


def output_flood(limits: Limits) -> str:
    return f"Output flood: more than {limits.flood_bytes} bytes on stdout/stderr; the process group was killed."


def out_of_memory(limits: Limits, last_line: str = "") -> str:
    return f"Out of memory: exceeded the memory limit of {limits.memory_mb} MB. {last_line}".strip()


def process_limit_reached(limits: Limits, last_line: str = "") -> str:
    """It ended on its own after a fork failed at RLIMIT_NPROC."""
    return f"Process limit reached: at most {limits.max_processes} processes. {last_line}".strip()


def isolation_unavailable(error: str) -> str:
    """The sandbox did not start the program: this worker cannot seal runs (``error``: the kernel's reason)."""
    return ("Refused: this worker cannot seal runs in namespaces of their own "
            f"({error}); it runs no untrusted code unless its operator sets SILENTBENCH_ALLOW_UNISOLATED=true.")


def write_refused(last_line: str = "") -> str:
    return ("Refused by the sandbox: a reproducer may write only inside its own run directory. "
            f"{last_line}").strip()


def crashed(exit_code: int | None, last_line: str = "") -> str:
    """Any other non-zero end: a signal (negative ``exit_code``) or an exit code."""
    name = signal_name(exit_code)
    how = f"killed by {name}" if name else f"exited with code {exit_code}"
    return f"Crashed: {how}. {last_line}".strip()


@dataclass(frozen=True)
class Failure:
    """How a run failed: its kind and the sentence for a person."""

    kind: RunFailureKind
    reason: str


def program_failure(result: SandboxResult, limits: Limits) -> Failure | None:
    """How the sealed program of ``result`` failed, worded; None when it ended well (exit code 0, or judged from its
    records after a teardown hang)."""
    ending = result.ending()
    if ending is None:
        return None
    last_line = result.last_line
    wordings: dict[Ending, tuple[Callable[..., str], tuple[object, ...]]] = {
        Ending.REFUSED: (isolation_unavailable, (result.refused,)),
        Ending.MEMORY_EXCEEDED: (out_of_memory, (limits, "(the run's processes together)")),
        Ending.PROCESS_LIMIT_EXCEEDED: (process_limit_exceeded, (limits,)),
        Ending.TIME_LIMIT: (time_limit_exceeded, (limits, result.forking)),
        Ending.OUTPUT_FLOOD: (output_flood, (limits,)),
        Ending.OUT_OF_MEMORY: (out_of_memory, (limits, last_line)),
        Ending.PROCESS_LIMIT_REACHED: (process_limit_reached, (limits, last_line)),
        Ending.WRITE_REFUSED: (write_refused, (last_line,)),
        Ending.CRASHED: (crashed, (result.exit_code, last_line)),
    }
    builder, arguments = wordings[ending]
    return Failure(kind_of(builder), builder(*arguments))


def error_text(error: BaseException) -> str:
    """An error of a detector's or its tool's, for a sentence: a sealed program that failed says how, with the tail
    of its output."""
    if isinstance(error, SandboxedProgramFailed):
        failure = program_failure(error.result, error.limits)
        tail = (error.result.stderr or error.result.stdout)[-1500:]
        return f"{error.what} failed: {failure.reason if failure else 'it ended without its answer'}\n{tail}"
    return str(error)


# --- Before, around or instead of the program --------------------------------------------------------------------

def no_oracle_report() -> str:
    return ("No oracle report: the reproducer exited normally but wrote no 'oracle' record "
            "(see docs/reproducer-protocol.md).")


def offline_check_failed(error: BaseException | str) -> str:
    """The detector's check after the run (TrainCheck's) failed: the detector's doing, not the program's."""
    return f"The detector's offline check failed: {error}"


def detector_setup_failed(error: BaseException | str) -> str:
    """The detector's own preparation of the run (TrainCheck's instrumentation of the script) failed."""
    return f"The detector could not prepare the run: {error}"


def unapproved() -> str:
    return "Refused: this reproducer version is not approved by a maintainer."


def fit_failed(error: BaseException | str) -> str:
    return f"The detector's fit phase failed: {error}"


def internal_error(error: BaseException | str) -> str:
    return f"Internal error before the reproducer ran: {error}"


def storing_failed(error: BaseException) -> str:
    """The run finished but the database refused its result (runners.actions.runs.do_finish_run)."""
    detail = (str(error).strip().splitlines() or [""])[0][:500]
    return f"Storing the result failed: {type(error).__name__}: {detail}"


def too_many_records(what: str, seen: int, cap: int) -> str:
    """The report held more records of one kind (``what``: step, alarm, compare) than a run keeps."""
    return f"Too many {what} records: {seen} written, at most {cap} are kept per run."


def cancelled_before_start(who: str) -> str:
    return f"Cancelled by {who} before it started."


def timer_interrupted() -> str:
    """An overhead run whose timing process (manage.py evaluate) stopped while it ran: nobody will finish it."""
    return "Lost: the overhead measurement that was running it stopped before it finished (interrupted)."


def lost_again(max_attempts: int) -> str:
    """A broker run whose executor went away on its last allowed attempt (runners.actions.runs.MAX_ATTEMPTS)."""
    return (f"Lost again: its worker stopped while running it (the worker died, or the run took it down); "
            f"a run lost after {max_attempts} attempts is not retried again.")

def unservable_reason(queue: str, needs: object, environment: str, workers_seen: Iterable[str],
                      window_minutes: float) -> str:
    """No live worker consumes ``queue``: what the run ``needs`` (in ``environment``, '' for the default one), and
    the workers seen (``workers_seen``: runners.environments.routing.describe_worker of each)."""
    where = f" in the environment {environment}" if environment else ""
    return (f"No worker can serve this run: it needs {needs}{where} (queue {queue}); "
            f"workers seen in the last {window_minutes:g} min: {'; '.join(workers_seen) or 'none'}.")


def environment_not_built(name: str) -> str:
    """A worker took a run of an environment it has not built (its folder is gone, or it was routed by hand)."""
    return (f"This worker cannot serve the run: the environment {name} is not built here (manage.py "
            "build_environment, or SILENTBENCH_WORKER_ENVIRONMENTS, on the workers that consume its queues).")


def environment_lacks_packages(detector: str, environment: str, missing: Iterable[str]) -> str:
    """The run's detector needs packages its environment does not have (TrainCheck's, in another torch release)."""
    return (f"This worker cannot serve the run: the detector {detector} needs {', '.join(missing)}, which the "
            f"environment {environment} does not have; run it in the default environment, or build one with them.")


def wrong_worker_reason(needs: object, gpus: Iterable[Mapping[str, Any]], runs_per_gpu: int = 1) -> str:
    """Why a worker refuses a run it took: its host (``gpus``, its inventory) lacks what the run needs; where
    ``runs_per_gpu`` runs share each GPU, a run counts on that share of a GPU's memory."""
    offered = ", ".join(f"{gpu['index']}: {gpu['name']} {round(gpu['memory_mb'] / 1024)} GB" for gpu in gpus)
    shared = (f", each GPU shared by {runs_per_gpu} runs (SILENTBENCH_RUNS_PER_GPU), each counting on 1/{runs_per_gpu}"
              " of its memory") if runs_per_gpu > 1 and offered else ""
    return f"This worker cannot serve the run: it needs {needs}; this host has {offered or 'no GPU'}{shared}."


REASON_BUILDERS = {
    RunFailureKind.TIME_LIMIT: (time_limit_exceeded,),
    RunFailureKind.MEMORY: (out_of_memory,),
    RunFailureKind.OUTPUT_FLOOD: (output_flood,),
    RunFailureKind.PROCESS_LIMIT: (process_limit_exceeded, process_limit_reached),
    RunFailureKind.SANDBOX_REFUSAL: (write_refused, isolation_unavailable),
    RunFailureKind.CRASH: (crashed,),
    RunFailureKind.PROTOCOL: (no_oracle_report, too_many_records),
    RunFailureKind.FIT_FAILED: (fit_failed,),
    RunFailureKind.UNAPPROVED: (unapproved,),
    RunFailureKind.INTERNAL: (internal_error, detector_setup_failed, offline_check_failed, storing_failed),
    # The reconciler fails runs no live worker consumes the queue of; a worker refuses a run whose GPUs
    # its host does not have (routed to the wrong worker), whose Python environment it has not built, or whose
    # detector needs packages that environment lacks.
    RunFailureKind.UNSERVABLE: (unservable_reason, wrong_worker_reason, environment_not_built,
                                environment_lacks_packages),
    RunFailureKind.CANCELLED: (cancelled_before_start,),
    # A broker run whose worker vanished is queued again, and given up once lost on its last allowed attempt; an
    # overhead run is given up when the process timing it stops (evaluation.overhead).
    RunFailureKind.LOST: (timer_interrupted, lost_again),
}
KIND_OF_BUILDER = {builder: kind for kind, builders in REASON_BUILDERS.items() for builder in builders}


def kind_of(builder: Callable[..., str]) -> RunFailureKind:
    """The RunFailureKind of the sentences ``builder`` writes."""
    return KIND_OF_BUILDER[builder]


# --- Refusals and errors that fail a run, typed --------------------------------------------------------------------

class RunRefused(Exception):
    """A run fails without its program having ended badly: refused, or an error before or around it. ``kind`` and
    ``reason`` are what the run records; whoever catches one records them as they are."""

    kind: ClassVar[RunFailureKind] = RunFailureKind.INTERNAL

    @property
    def reason(self) -> str:
        return str(self)


class Unapproved(RunRefused):
    """The version no maintainer approved: nothing of it may run."""

    kind = RunFailureKind.UNAPPROVED

    @property
    def reason(self) -> str:
        return unapproved()


class Unservable(RunRefused):
    """This worker cannot serve the run at all (its GPUs, its environments); the message is the whole sentence."""

    kind = RunFailureKind.UNSERVABLE


class FitError(RunRefused):
    """The detector's fit phase failed; the message says why."""

    kind = RunFailureKind.FIT_FAILED

    @property
    def reason(self) -> str:
        return fit_failed(self)


class DetectorSetupFailed(RunRefused):
    """The detector's own preparation of the run failed (its ``command``); the message says why."""

    @property
    def reason(self) -> str:
        return detector_setup_failed(self)


def failure_counts(runs: QuerySet[Run]) -> dict[str, int]:
    """{kind: count} over the failed and cancelled runs among ``runs``, in one query ('' for any without
    a kind)."""
    return dict(runs.filter(status__in=UNSUCCESSFUL_STATUSES).order_by()
                .values_list("failure_kind").annotate(n=Count("id")))


def breakdown(counts: Mapping[str, int]) -> list[dict[str, Any]]:
    """[{kind, label, count}] from ``failure_counts``, most runs first (ties in the kinds' order); runs
    without a kind last, as "Not classified"."""
    order = list(RunFailureKind.values)
    rows: list[dict[str, Any]] = [{"kind": kind, "label": RunFailureKind(kind).label, "count": count}
                                  for kind, count in counts.items() if kind in order and count]
    rows.sort(key=lambda row: (-row["count"], order.index(row["kind"])))
    unknown = sum(count for kind, count in counts.items() if kind not in order)
    if unknown:
        rows.append({"kind": "", "label": "Not classified", "count": unknown})
    return rows


def parse_kinds(values: Collection[str]) -> list[RunFailureKind]:
    """RunFailureKinds from names ("time_limit"); ValueError naming the unknown ones and the known ones."""
    unknown = [value for value in values if value not in RunFailureKind.values]
    if unknown:
        raise ValueError(f"Unknown failure kind{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}. "
                         f"The kinds are: {', '.join(RunFailureKind.values)}.")
    return [RunFailureKind(value) for value in dict.fromkeys(values)]
