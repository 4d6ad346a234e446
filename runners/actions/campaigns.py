"""Campaigns, as named actions: create one from a plan and queue its runs, cancel, retry, complete it, and the
verification a completed one records (stability, and the bug's verdict through the catalog's own action).

Each action takes the acting user (None: the system, i.e. a worker, the reconciler or the operator's own management
command). Permissions are checked by the callers (runners.permissions); a change that people make (create, cancel,
retry) leaves an audit record (core.audit). The broker only carries run IDs: runs are queued by the task's name
(``EXECUTE_RUN``), so nothing here imports the worker's tasks."""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.core.exceptions import ValidationError
from django.db import transaction
from django.template.defaultfilters import pluralize
from django.utils import timezone

from bugs.actions import do_set_verification_verdict
from core import audit
from core.enums import AuditAction, VerificationVerdict, worst_verdict

from ..environments.routing import queue_for
from ..failures import cancelled_before_start
from ..models import (
    UNSUCCESSFUL_STATUSES,
    Alarm,
    Campaign,
    CampaignPurpose,
    Run,
    RunFailureKind,
    RunStatus,
    StabilityCheck,
    Variant,
)
from ..plans import CampaignPlan
from .detectors import do_record_detector

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.db.models import QuerySet

    from bugs.models import Bug, ReproducerVersion

logger = logging.getLogger(__name__)
EXECUTE_RUN = "runners.tasks.execute_run"  # the Celery task that claims and executes one run (runners.tasks)


def do_create_campaign(name: str, plan: CampaignPlan, purpose: str = CampaignPurpose.MANUAL, enqueue: bool = True, *,
                       acting_user: User | None) -> Campaign:
    """Create exactly the runs of ``plan`` (a runners.plans.CampaignPlan) as a campaign and enqueue them
    once the transaction commits; ``enqueue=False`` leaves them for the caller to execute itself.
    Approval is checked again here, so no path queues unapproved code."""
    unapproved = sorted({str(run.version) for run in plan.runs if not run.version.is_approved})
    if unapproved:
        raise ValidationError(f"Not approved by a maintainer, so they cannot run: {', '.join(unapproved)}")
    with transaction.atomic():
        campaign = Campaign.objects.create(name=name, created_by=acting_user, purpose=purpose,
                                           parameters=plan.parameters)
        runs = Run.objects.bulk_create([
            Run(campaign=campaign, reproducer_version=run.version, detector=run.detector, variant=run.variant,
                seed=run.seed, steps=plan.steps_of(run.version), queue=queue_for(run.version, run.environment),
                python_environment=run.environment)
            for run in plan.runs
        ])
        run_ids = [run.pk for run in runs]  # bulk_create returns keys on PostgreSQL and SQLite
        audit.record(acting_user, AuditAction.CREATE, campaign,
                     f"created campaign #{campaign.pk} with {len(run_ids)} runs")
        if enqueue:
            transaction.on_commit(lambda: enqueue_runs(run_ids))
    return campaign


RETRY_RECORD_FIELDS = ("id", "status", "failure_kind", "failure_reason", "attempts", "worker__hostname", "exit_code",
                       "wall_seconds", "manifested", "finished_at")


AUDIT_RECORD_RUNS = 200  # runs a cancel's or retry's audit record keeps one by one (all of them are counted)


def do_retry_failed_runs(campaign: Campaign, runs: QuerySet[Run] | None = None, kinds: Iterable[str] | None = None, *,
                         acting_user: User | None) -> list[int]:
    """Queue the failed and cancelled runs of ``campaign`` (or those of ``runs``) again, as new attempts;
    with ``kinds`` (RunFailureKinds), only those that failed for one of these reasons.

    Their results and alarms are cleared and the campaign is open again; what they were (status, kind,
    reason, worker, ...) and who had cancelled the campaign are kept in the audit record. The approval of
    each version is checked again when it runs. Returns the IDs queued. An overhead measurement's runs are
    not retried: only the process that made them times them (evaluation.overhead); nor is a historical
    reproducer's, which never runs.
    """
    if not campaign.runs_through_broker:
        raise ValidationError(f"{campaign} is an overhead measurement: its runs are timed one by one by the "
                              f"command that made them; run `manage.py evaluate` again instead of retrying.")
    runs = (runs if runs is not None else campaign.runs.all()).filter(
        campaign=campaign, status__in=UNSUCCESSFUL_STATUSES, reproducer_version__reproducer__historical_reason="")
    if kinds is not None:
        kinds = list(dict.fromkeys(RunFailureKind(kind) for kind in kinds))  # ValueError for a name that is no kind
        runs = runs.filter(failure_kind__in=kinds)
    with transaction.atomic():
        locked = Campaign.objects.select_for_update().get(pk=campaign.pk)  # serialises with do_complete_campaign
        previous = list(runs.select_for_update(of=("self",)).order_by("id").values(*RETRY_RECORD_FIELDS))
        run_ids = [run["id"] for run in previous]
        if run_ids:
            which = f" ({', '.join(RunFailureKind(kind).label.lower() for kind in kinds)})" if kinds is not None else ""
            audit.record(acting_user, AuditAction.RETRY, locked,
                         f"queued {len(run_ids)} failed or cancelled run(s) again{which}",
                         runs=previous[:AUDIT_RECORD_RUNS], run_count=len(previous),
                         alarms_cleared=Alarm.objects.filter(run_id__in=run_ids).count(),
                         cancelled_at=locked.cancelled_at, cancelled_by=locked.cancelled_by_id,
                         completed_at=locked.completed_at, kinds=kinds)
        Alarm.objects.filter(run_id__in=run_ids).delete()
        Run.objects.filter(pk__in=run_ids).update(
            status=RunStatus.QUEUED, failure_reason="", failure_kind="", started_at=None, finished_at=None, worker=None,
            exit_code=None, wall_seconds=None, manifested=None, analysis_seconds=None, detector_summary={},
            queued_at=timezone.now())  # queued anew: the reconciler's grace periods count from now
        if run_ids:
            Campaign.objects.filter(pk=campaign.pk).update(completed_at=None, cancelled_at=None, cancelled_by=None)
        transaction.on_commit(lambda: enqueue_runs(run_ids))
    return run_ids


def do_cancel_campaign(campaign: Campaign, *, acting_user: User | None) -> list[int]:
    """Cancel the runs of ``campaign`` that have not started. Runs already executing finish and keep
    their results (a reproducer is never killed half-way by a cancel). Returns the IDs cancelled."""
    who = audit.actor_label(acting_user)
    with transaction.atomic():
        Campaign.objects.select_for_update().get(pk=campaign.pk)
        queued = campaign.runs.select_for_update().filter(status=RunStatus.QUEUED)
        run_ids = list(queued.values_list("id", flat=True))
        Run.objects.filter(pk__in=run_ids, status=RunStatus.QUEUED).update(
            status=RunStatus.CANCELLED, failure_reason=cancelled_before_start(who),
            failure_kind=RunFailureKind.CANCELLED, finished_at=timezone.now())
        if run_ids:  # nothing queued: nothing was cancelled, and the campaign keeps its state
            Campaign.objects.filter(pk=campaign.pk, cancelled_at__isnull=True, completed_at__isnull=True).update(
                cancelled_at=timezone.now(), cancelled_by=acting_user)
            audit.record(acting_user, AuditAction.CANCEL, campaign, f"cancelled {len(run_ids)} queued run(s)",
                         runs=run_ids[:AUDIT_RECORD_RUNS], run_count=len(run_ids))
    do_complete_campaign(campaign, acting_user=acting_user)
    return run_ids


def do_complete_campaign(campaign: Campaign, *, acting_user: User | None = None) -> bool:
    """Mark ``campaign`` completed if none of its runs is queued or running; True for the one call
    that does it. A completed verification campaign records the stability of what it ran.

    The check and the mark happen under the campaign's row lock, which a retry also takes, so a
    campaign is never marked completed while a retry is queueing runs again.
    """
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().get(pk=campaign.pk)
        if campaign.completed_at is not None or campaign.runs.filter(
                status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists():
            return False
        campaign.completed_at = timezone.now()
        campaign.save(update_fields=["completed_at"])
        if campaign.purpose == CampaignPurpose.VERIFICATION and campaign.cancelled_at is None:
            do_record_stability(campaign, acting_user=acting_user)
    return True


def do_start_verification(versions: Sequence[ReproducerVersion], seeds: int = 3, steps: int | None = None, *,
                          acting_user: User | None) -> Campaign:
    """Verification of approved bug reproducers through the normal pipeline: k seeds of buggy and fixed,
    no detector. Its stability is recorded when its last run finishes (do_complete_campaign). Approving
    a version starts it (runners.receivers), so approving does not also need the right to trigger runs. Its name
    counts the reproducers without naming them: a bug may be held out later, and its parameters list them, as each
    reader may see them (runners.selectors.shown_parameters)."""
    plan = CampaignPlan.build(versions, [do_record_detector("plain")],
                              [Variant.BUGGY, Variant.FIXED], range(seeds), steps)
    return do_create_campaign(f"verification k={seeds}: {len(versions)} reproducer{pluralize(len(versions))}", plan,
                              CampaignPurpose.VERIFICATION, acting_user=acting_user)


def enqueue_runs(run_ids: Iterable[int]) -> None:
    """Send each run's ID to its queue, for the task named ``EXECUTE_RUN``, in the order of their IDs: a campaign's
    runs are made in its plan's order (runners.plans), which the queues keep."""
    for run_id, queue in Run.objects.filter(pk__in=run_ids).order_by("id").values_list("id", "queue"):
        current_app.send_task(EXECUTE_RUN, args=[run_id], queue=queue)


def do_record_stability(campaign: Campaign, *, acting_user: User | None = None) -> list[StabilityCheck]:
    """Stability of every bug reproducer a verification campaign ran, and the bugs' new status.

    Over the campaign's seeds: buggy manifested a/k, fixed b/k (StabilityCheck.verdict_for). A
    deprecated bug keeps its status; a bug with several reproducers takes the worst verdict among them.
    """
    tallies: dict[ReproducerVersion, dict[str, Any]] = {}
    for run in campaign.runs.select_related("reproducer_version__reproducer__bug", "environment"):
        if run.reproducer_version.reproducer.is_reference_pipeline:
            continue
        tally = tallies.setdefault(run.reproducer_version, {"seeds": set(), "buggy": 0, "fixed": 0, "failed": 0,
                                                          "environment": run.environment})
        tally["seeds"].add(run.seed)
        if run.status != RunStatus.SUCCEEDED:
            tally["failed"] += 1
        elif run.manifested:
            tally[run.variant] += 1
    checks: list[StabilityCheck] = []
    with transaction.atomic():
        # A retried campaign is verified anew: its new checks replace those of its first completion.
        StabilityCheck.objects.filter(campaign=campaign).delete()
        for version, tally in tallies.items():
            seeds = len(tally["seeds"])
            checks.append(StabilityCheck.objects.create(
                reproducer_version=version, campaign=campaign, environment=tally["environment"], seeds=seeds,
                buggy_manifested=tally["buggy"], fixed_manifested=tally["fixed"], failed_runs=tally["failed"],
                verdict=StabilityCheck.verdict_for(seeds, tally["buggy"], tally["fixed"], tally["failed"]),
            ))
        by_bug: dict[Bug, str] = {}
        for check in checks:
            bug = check.reproducer_version.reproducer.bug
            assert bug is not None  # a reference pipeline (no bug) was skipped above
            by_bug[bug] = worst_verdict(by_bug.get(bug, VerificationVerdict.VERIFIED), check.verdict)
        for bug, verdict in by_bug.items():
            do_set_verification_verdict(bug, verdict, acting_user=acting_user, campaign=campaign)
    return checks
