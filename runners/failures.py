"""Why runs fail: every failed or cancelled run has a kind (``Run.failure_kind``, a RunFailureKind) and a
sentence for a person (``Run.failure_reason``), set together where the failure is recorded.

The sentences come from builders: the sandbox's (runners.sandbox: how the program ended), the ones
below (what happened before, around or instead of the program) and routing's. ``REASON_BUILDERS``
says which builders write the sentences of each kind: the worker classifies the sandbox's verdict by it
(``sandbox_kind``), and the synthetic history (devtools.synthetic) writes its failures with the same
builders and kinds. Migration 0007 classified the runs stored before kinds existed from these sentences.
"""
from django.db.models import Count

from . import sandbox
from .models import UNSUCCESSFUL_STATUSES, RunFailureKind
from .routing import environment_lacks_packages, environment_not_built, unservable_reason, wrong_worker_reason


def no_oracle_report():
    return ("No oracle report: the reproducer exited normally but wrote no 'oracle' record "
            "(see docs/reproducer-protocol.md).")


def offline_check_failed(error):
    """The detector's check after the run (TrainCheck's) failed: the detector's doing, not the program's."""
    return f"The detector's offline check failed: {error}"


def detector_setup_failed(error):
    """The detector's own preparation of the run (TrainCheck's instrumentation of the script) failed."""
    return f"The detector could not prepare the run: {error}"


def unapproved():
    return "Refused: this reproducer version is not approved by a maintainer."


def fit_failed(error):
    return f"The detector's fit phase failed: {error}"


def internal_error(error):
    return f"Internal error before the reproducer ran: {error}"


def storing_failed(error):
    """The run finished but the database refused its result (runners.actions.do_finish_run)."""
    detail = (str(error).strip().splitlines() or [""])[0][:500]
    return f"Storing the result failed: {type(error).__name__}: {detail}"


def too_many_records(what, seen, cap):
    """The report held more records of one kind (``what``: step, alarm, compare) than a run keeps."""
    return f"Too many {what} records: {seen} written, at most {cap} are kept per run."


def cancelled_before_start(who):
    return f"Cancelled by {who} before it started."


def timer_interrupted():
    """An overhead run whose timing process (manage.py evaluate) stopped while it ran: nobody will finish it."""
    return "Lost: the overhead measurement that was running it stopped before it finished (interrupted)."


def lost_again(max_attempts):
    """A broker run whose executor went away on its last allowed attempt (runners.actions.MAX_ATTEMPTS)."""
    return (f"Lost again: its worker stopped while running it (the worker died, or the run took it down); "
            f"a run lost after {max_attempts} attempts is not retried again.")


REASON_BUILDERS = {
    RunFailureKind.TIME_LIMIT: (sandbox.time_limit_exceeded,),
    RunFailureKind.MEMORY: (sandbox.out_of_memory,),
    RunFailureKind.OUTPUT_FLOOD: (sandbox.output_flood,),
    RunFailureKind.PROCESS_LIMIT: (sandbox.process_limit_exceeded, sandbox.process_limit_reached),
    RunFailureKind.SANDBOX_REFUSAL: (sandbox.write_refused, sandbox.isolation_refused),
    RunFailureKind.CRASH: (sandbox.crashed,),
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


def kind_of(builder):
    """The RunFailureKind of the sentences ``builder`` writes."""
    return KIND_OF_BUILDER[builder]


def sandbox_kind(failure):
    """The kind of a sandbox verdict (a runners.sandbox.Failure)."""
    return kind_of(failure.cause)


def failure_counts(runs):
    """{kind: count} over the failed and cancelled runs among ``runs``, in one query ('' for any without
    a kind)."""
    return dict(runs.filter(status__in=UNSUCCESSFUL_STATUSES).order_by()
                .values_list("failure_kind").annotate(n=Count("id")))


def breakdown(counts):
    """[{kind, label, count}] from ``failure_counts``, most runs first (ties in the kinds' order); runs
    without a kind last, as "Not classified"."""
    order = list(RunFailureKind.values)
    rows = [{"kind": kind, "label": RunFailureKind(kind).label, "count": count}
            for kind, count in counts.items() if kind in order and count]
    rows.sort(key=lambda row: (-row["count"], order.index(row["kind"])))
    unknown = sum(count for kind, count in counts.items() if kind not in order)
    if unknown:
        rows.append({"kind": "", "label": "Not classified", "count": unknown})
    return rows


def parse_kinds(values):
    """RunFailureKinds from names ("time_limit"); ValueError naming the unknown ones and the known ones."""
    unknown = [value for value in values if value not in RunFailureKind.values]
    if unknown:
        raise ValueError(f"Unknown failure kind{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}. "
                         f"The kinds are: {', '.join(RunFailureKind.values)}.")
    return [RunFailureKind(value) for value in dict.fromkeys(values)]
