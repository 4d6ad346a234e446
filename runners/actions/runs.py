"""Runs, as named actions: claim one for a worker, store its result once per attempt, fail it without executing,
and the repairs of runs whose executor went away (the reaper, lost runs, runs nobody can serve).

PostgreSQL (or SQLite) is the truth and the broker only carries run IDs, so every action here is safe to repeat."""
from __future__ import annotations

import functools
import logging
import time
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from ..detector_versions.registry import plugin_for
from ..environments.routing import describe_worker, environment_of_queue, needs_of_queue
from ..failures import kind_of, lost_again, storing_failed, timer_interrupted, unservable_reason
from ..models import Alarm, Campaign, CampaignPurpose, Run, RunFailureKind, RunStatus, Worker
from ..report import json_safe
from ..selectors import dispatched_runs, live_workers
from .campaigns import do_cancel_campaign, do_complete_campaign, enqueue_runs
from .workers import current_environment

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.db.models import QuerySet

    from ..execution import RunOutcome

logger = logging.getLogger(__name__)
STALE_RUN_GRACE = timedelta(minutes=5)
# A run whose executor goes away while it runs is queued again as a new attempt, but one lost on its second
# attempt (or later) fails as lost: it may be what takes its workers down (do_requeue_lost_runs).
MAX_ATTEMPTS = 2

P = ParamSpec("P")
R = TypeVar("R")


def do_claim_run(run_id: int, worker: Worker) -> Run | None:
    """Move a queued run to running for this worker; None if it is not (or no longer) queued."""
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).select_related(
            "reproducer_version__reproducer__bug", "detector", "python_environment").filter(pk=run_id).first()
        if run is None or run.status != RunStatus.QUEUED:
            return None
        run.status = RunStatus.RUNNING
        run.started_at = timezone.now()
        run.attempts += 1
        run.worker = worker
        run.environment = current_environment(run.python_environment)
        run.save(update_fields=["status", "started_at", "attempts", "worker", "environment"])
    return run


def retry_while_database_away(action: Callable[P, R]) -> Callable[P, R]:
    """Retry ``action`` with backoff for up to SILENTBENCH_DB_RETRY_SECONDS while the database cannot be
    reached (a restart, a failover), reconnecting each time: a worker keeps the result it holds. Only
    for idempotent actions, outside any transaction."""
    @functools.wraps(action)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
        deadline, pause = time.monotonic() + settings.SILENTBENCH_DB_RETRY_SECONDS, 0.5
        while True:
            try:
                return action(*args, **kwargs)
            except (OperationalError, InterfaceError) as error:
                if connection.in_atomic_block or time.monotonic() + pause > deadline:
                    raise
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
                logger.warning("%s: database unavailable (%s); trying again in %.1f s", action.__name__, reason, pause)
                try:
                    connection.close()  # broken: the next query opens a new one
                except DatabaseError:
                    pass
                time.sleep(pause)
                pause = min(pause * 2, 10)
    return retrying


@retry_while_database_away
def do_fail_run_without_executing(run: Run, reason: str, kind: str) -> bool:
    """Fail a claimed run that will not execute (refused, its fit failed, an internal error): ``reason``
    for a person, ``kind`` a RunFailureKind."""
    kind = RunFailureKind(kind)
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.FAILED, failure_reason=reason, failure_kind=kind, finished_at=timezone.now())
    return bool(updated)


def do_give_up_running_runs(campaign: Campaign, *, acting_user: User | None = None) -> int:
    """Fail the runs of ``campaign`` still running in this process when it stops timing them (an overhead
    measurement interrupted): the reconciler leaves such runs alone, so nothing else would end them."""
    with transaction.atomic():
        return Run.objects.filter(campaign=campaign, status=RunStatus.RUNNING).update(
            status=RunStatus.FAILED, failure_reason=timer_interrupted(), failure_kind=kind_of(timer_interrupted),
            finished_at=timezone.now())


@retry_while_database_away
def do_finish_run(run: Run, outcome: RunOutcome) -> bool:
    """Store a finished run's results exactly once: a repeated call for the same attempt changes nothing.

    Every value goes through ``json_safe`` (no NaN or Infinity reaches the database). Should storing still
    fail, the run fails saying why, in a transaction of its own; only a database that cannot be reached is
    left to ``retry_while_database_away``."""
    try:
        return _store_result(run, outcome)
    except (OperationalError, InterfaceError):
        raise
    except Exception as error:
        logger.exception("run %s: storing the result of attempt %s failed", run.pk, run.attempts)
        return _fail_storing(run, outcome, error)


def _store_result(run: Run, outcome: RunOutcome) -> bool:
    with transaction.atomic():
        current = Run.objects.select_for_update().filter(pk=run.pk).first()
        if current is None or current.status != RunStatus.RUNNING or current.attempts != run.attempts:
            logger.warning("run %s: result of attempt %s ignored (status is %s)", run.pk, run.attempts,
                           getattr(current, "status", "gone"))
            return False
        oracle = outcome.oracle or {}
        current.status = RunStatus.SUCCEEDED if outcome.succeeded else RunStatus.FAILED
        current.failure_reason = json_safe(outcome.failure_reason)
        current.failure_kind = outcome.failure_kind
        current.exit_code = outcome.exit_code
        current.wall_seconds = outcome.wall_seconds
        current.finished_at = timezone.now()
        current.stdout, current.stderr = outcome.stdout, outcome.stderr
        current.output_truncated = outcome.output_truncated
        current.manifested = oracle.get("manifested")
        current.oracle_summary = json_safe(oracle.get("summary", ""))
        current.oracle_evidence = json_safe(oracle.get("evidence", {}))
        current.trigger_step = outcome.trigger_step
        current.trigger_time = outcome.trigger_time
        current.step_records = json_safe(outcome.steps)
        current.protocol_errors = json_safe(outcome.protocol_errors)
        current.analysis_seconds = outcome.analysis_seconds
        current.detector_summary = json_safe(outcome.detector_summary)
        current.execution = json_safe(outcome.execution)
        current.save()
        current.alarms.all().delete()
        Alarm.objects.bulk_create([Alarm(run=current, **json_safe(alarm)) for alarm in outcome.alarms])
    return True


def _fail_storing(run: Run, outcome: RunOutcome, error: Exception) -> bool:
    """Fail a run whose result the database refused (``error``), keeping its exit code and time, and its
    logs and how it ran unless they are what cannot be stored. False when the attempt is no longer running."""
    failed = dict(status=RunStatus.FAILED, failure_reason=storing_failed(error), failure_kind=kind_of(storing_failed),
                  exit_code=outcome.exit_code, wall_seconds=outcome.wall_seconds, finished_at=timezone.now())
    logs = dict(stdout=outcome.stdout, stderr=outcome.stderr, output_truncated=outcome.output_truncated,
                execution=json_safe(outcome.execution))
    attempt = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, attempts=run.attempts)
    try:
        with transaction.atomic():
            return bool(attempt.update(**failed, **logs))
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        logger.exception("run %s: its logs cannot be stored either", run.pk)
        with transaction.atomic():
            return bool(attempt.update(**failed))


def stale_running_runs(runs: QuerySet[Run], now: datetime) -> Iterator[Run]:
    """The runs among ``runs`` still running long past their allowance (their time limit under their
    detector, plus a grace period): whatever was executing them is gone."""
    for run in runs.filter(status=RunStatus.RUNNING).select_related("reproducer_version", "detector__code"):
        allowed = plugin_for(run.detector).run_allowance(run.reproducer_version.time_limit_seconds)
        assert run.started_at is not None  # a running run has started
        if run.started_at + timedelta(seconds=allowed) + STALE_RUN_GRACE < now:
            yield run


def do_requeue_stale_runs(now: datetime | None = None) -> LostRuns:
    """The reaper: a run still 'running' long past its time limit lost its worker; queue it again (or give it
    up, do_requeue_lost_runs). Returns LostRuns."""
    now = now or timezone.now()
    return do_requeue_lost_runs({run.pk: run.attempts for run in stale_running_runs(dispatched_runs(), now)}, now)


LostRuns = namedtuple("LostRuns", "requeued given_up")  # run IDs


def do_requeue_lost_runs(seen: Mapping[int, int], now: datetime | None = None) -> LostRuns:
    """Queue again, as new attempts, the runs of ``seen`` ({run ID: attempt}) still running that attempt:
    whatever was executing them is gone. One lost on attempt MAX_ATTEMPTS or later fails as lost instead, and
    its campaign completes if nothing else is left to run. Returns LostRuns."""
    now = now or timezone.now()
    with transaction.atomic():
        running = Run.objects.filter(pk__in=list(seen), status=RunStatus.RUNNING).select_for_update()
        lost = [(run_id, attempts) for run_id, attempts in running.values_list("id", "attempts")
                if attempts == seen[run_id]]
        requeued = sorted(run_id for run_id, attempts in lost if attempts < MAX_ATTEMPTS)
        given_up = sorted(run_id for run_id, attempts in lost if attempts >= MAX_ATTEMPTS)
        Run.objects.filter(pk__in=requeued).update(status=RunStatus.QUEUED, started_at=None, worker=None)
        Run.objects.filter(pk__in=given_up).update(
            status=RunStatus.FAILED, failure_reason=lost_again(MAX_ATTEMPTS), failure_kind=kind_of(lost_again),
            finished_at=now)
        if requeued:
            transaction.on_commit(lambda: enqueue_runs(requeued))
    for campaign in Campaign.objects.filter(runs__in=given_up).distinct():
        do_complete_campaign(campaign, acting_user=None)
    return LostRuns(requeued, given_up)


def do_give_up_stale_timed_runs(now: datetime | None = None) -> list[int]:
    """The reaper of overhead runs, which nobody queues again: one still running long past its allowance lost
    the process timing it (killed, its host gone). It fails as lost, and its campaign is closed (the runs
    left queued are cancelled). Returns the IDs given up."""
    now = now or timezone.now()
    given_up, campaign_ids = [], set()
    timed = Run.objects.filter(campaign__purpose=CampaignPurpose.OVERHEAD)
    for run in stale_running_runs(timed, now):
        if Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, attempts=run.attempts).update(
                status=RunStatus.FAILED, failure_reason=timer_interrupted(), failure_kind=kind_of(timer_interrupted),
                finished_at=now):
            given_up.append(run.pk)
            campaign_ids.add(run.campaign_id)
    for campaign in Campaign.objects.filter(pk__in=campaign_ids):
        do_cancel_campaign(campaign, acting_user=None)
    return given_up


def do_flag_unservable_runs(now: datetime | None = None) -> list[int]:
    """Fail the runs that nobody can serve instead of leaving them queued for ever: queued for longer
    than SILENTBENCH_UNSERVABLE_GRACE_MINUTES while no worker seen within SILENTBENCH_WORKER_SEEN_MINUTES
    consumes their queue. The reason names what they need and what the live workers offer. Returns the IDs."""
    now = now or timezone.now()
    workers = list(live_workers(now).order_by("hostname"))
    window = settings.SILENTBENCH_WORKER_SEEN_MINUTES
    served = {queue for worker in workers for queue in worker.queues}
    seen = [describe_worker(worker) for worker in workers]
    waiting = (dispatched_runs().filter(status=RunStatus.QUEUED,
                                  queued_at__lt=now - timedelta(minutes=settings.SILENTBENCH_UNSERVABLE_GRACE_MINUTES))
               .exclude(queue__in=served))
    campaign_ids: set[int]
    failed, campaign_ids = [], set()
    for queue in sorted(set(waiting.values_list("queue", flat=True))):
        with transaction.atomic():
            runs = list(waiting.filter(queue=queue).select_for_update(of=("self",)).values_list("id", "campaign_id"))
            Run.objects.filter(pk__in=[run_id for run_id, _ in runs], status=RunStatus.QUEUED).update(
                status=RunStatus.FAILED, failure_reason=unservable_reason(
                    queue, needs_of_queue(queue), environment_of_queue(queue), seen, window),
                failure_kind=RunFailureKind.UNSERVABLE, finished_at=now)
        failed += [run_id for run_id, _ in runs]
        campaign_ids.update(campaign_id for _, campaign_id in runs if campaign_id)
    for campaign in Campaign.objects.filter(pk__in=campaign_ids):
        do_complete_campaign(campaign, acting_user=None)
    if failed:
        logger.warning("failed %d run(s) that no live worker can serve: %s", len(failed), failed)
    return failed
