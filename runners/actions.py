"""State changes of runs and campaigns, as named actions. PostgreSQL (or SQLite) is the truth;
the broker only carries run IDs, so every action here is safe to repeat.

Each action takes the acting user (None: the system, i.e. a worker, the reconciler or the operator's
own management command). Permissions are checked by the callers (runners.permissions); a change that
people make (create, cancel, retry) leaves an audit record (core.audit)."""
import functools
import logging
import socket
import time
from collections import namedtuple
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.template.defaultfilters import pluralize
from django.utils import timezone

from bugs.actions import do_set_verification_verdict
from core import audit
from core.review import record_review

from .detector_submissions import name_problem
from .environment import host_capabilities
from .environments import facts_in
from .failures import cancelled_before_start, kind_of, lost_again, storing_failed, timer_interrupted
from .models import (
    UNSUCCESSFUL_STATUSES,
    Alarm,
    Campaign,
    CampaignPurpose,
    DetectorReviewState,
    DetectorVersion,
    Environment,
    FitArtifact,
    Run,
    RunFailureKind,
    RunStatus,
    StabilityCheck,
    StabilityVerdict,
    Variant,
    Worker,
)
from .plans import CampaignPlan
from .registry import detector_record, plugin_for, submitted_record
from .report import json_safe
from .routing import queue_for, unservable_reason
from .scoring import published_seeds, scoring_versions
from .selectors import dispatched_runs, live_workers

logger = logging.getLogger(__name__)
STALE_RUN_GRACE = timedelta(minutes=5)
# A run whose executor goes away while it runs is queued again as a new attempt, but one lost on its second
# attempt (or later) fails as lost: it may be what takes its workers down (do_requeue_lost_runs).
MAX_ATTEMPTS = 2


def do_create_campaign(name, plan, purpose=CampaignPurpose.MANUAL, enqueue=True, *, acting_user):
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
        audit.record(acting_user, "create", campaign, f"created campaign #{campaign.pk} with {len(run_ids)} runs")
        if enqueue:
            transaction.on_commit(lambda: enqueue_runs(run_ids))
    return campaign


RETRY_RECORD_FIELDS = ("id", "status", "failure_kind", "failure_reason", "attempts", "worker__hostname", "exit_code",
                       "wall_seconds", "manifested", "finished_at")
AUDIT_RECORD_RUNS = 200  # runs a cancel's or retry's audit record keeps one by one (all of them are counted)


def do_retry_failed_runs(campaign, runs=None, kinds=None, *, acting_user):
    """Queue the failed and cancelled runs of ``campaign`` (or those of ``runs``) again, as new attempts;
    with ``kinds`` (RunFailureKinds), only those that failed for one of these reasons.

    Their results and alarms are cleared and the campaign is open again; what they were (status, kind,
    reason, worker, ...) and who had cancelled the campaign are kept in the audit record. The approval of
    each version is checked again when it runs. Returns the IDs queued. An overhead measurement's runs are
    not retried: only the process that made them times them (evaluation.overhead).
    """
    if not campaign.runs_through_broker:
        raise ValidationError(f"{campaign} is an overhead measurement: its runs are timed one by one by the "
                              f"command that made them; run `manage.py evaluate` again instead of retrying.")
    runs = (runs if runs is not None else campaign.runs.all()).filter(
        campaign=campaign, status__in=UNSUCCESSFUL_STATUSES)
    if kinds is not None:
        kinds = list(dict.fromkeys(RunFailureKind(kind) for kind in kinds))  # ValueError for a name that is no kind
        runs = runs.filter(failure_kind__in=kinds)
    with transaction.atomic():
        locked = Campaign.objects.select_for_update().get(pk=campaign.pk)  # serialises with do_complete_campaign
        previous = list(runs.select_for_update(of=("self",)).order_by("id").values(*RETRY_RECORD_FIELDS))
        run_ids = [run["id"] for run in previous]
        if run_ids:
            which = f" ({', '.join(kind.label.lower() for kind in kinds)})" if kinds is not None else ""
            audit.record(acting_user, "retry", locked,
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


def do_cancel_campaign(campaign, *, acting_user):
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
            audit.record(acting_user, "cancel", campaign, f"cancelled {len(run_ids)} queued run(s)",
                         runs=run_ids[:AUDIT_RECORD_RUNS], run_count=len(run_ids))
    do_complete_campaign(campaign, acting_user=acting_user)
    return run_ids


def do_complete_campaign(campaign, *, acting_user=None):
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


def do_start_verification(versions, seeds=3, steps=None, *, acting_user):
    """Verification of approved bug reproducers through the normal pipeline: k seeds of buggy and fixed,
    no detector. Its stability is recorded when its last run finishes (do_complete_campaign). Approving
    a version starts it (runners.receivers), so approving does not also need the right to trigger runs. Its name
    counts the reproducers without naming them: a bug may be held out later, and its parameters list them, as each
    reader may see them (runners.selectors.shown_parameters)."""
    plan = CampaignPlan.build(versions, [detector_record("plain")], [Variant.BUGGY, Variant.FIXED], range(seeds), steps)
    return do_create_campaign(f"verification k={seeds}: {len(versions)} reproducer{pluralize(len(versions))}", plan,
                              CampaignPurpose.VERIFICATION, acting_user=acting_user)


def enqueue_runs(run_ids):
    from .tasks import execute_run

    for run_id, queue in Run.objects.filter(pk__in=run_ids).values_list("id", "queue"):
        execute_run.apply_async(args=[run_id], queue=queue)


def do_register_worker(name, queues, concurrency=1):
    """Record a worker as it starts: the queues it consumes and what its host can serve."""
    capabilities = host_capabilities()
    gpus = capabilities["gpus"]
    now = timezone.now()
    worker, _ = Worker.objects.update_or_create(hostname=name, defaults={
        "queues": list(queues), "capabilities": capabilities, "concurrency": concurrency,
        "last_seen": now, "registered_at": now, "gpu_count": len(gpus),
        "gpu_model": ", ".join(dict.fromkeys(gpu["name"] for gpu in gpus)),
        "gpu_memory_mb": min((gpu["memory_mb"] for gpu in gpus), default=0),
        "memory_mb": capabilities["memory_mb"], "cuda": capabilities["cuda"] or capabilities["torch_cuda"],
        "torch": capabilities["torch"],
    })
    return worker


def current_worker(name=None):
    """The Worker row of this process (its Celery node name, else the host name), marked seen now.
    A process that runs tasks without having registered (eagerly, in tests) is recorded consuming nothing."""
    name = name or socket.gethostname()
    if not Worker.objects.filter(hostname=name).update(last_seen=timezone.now()):
        return do_register_worker(name, queues=())
    return Worker.objects.get(hostname=name)


def current_environment(python_environment=None):
    """The Environment row of this host as a run in ``python_environment`` (None: the default) sees it."""
    facts = facts_in(python_environment)
    environment, _ = Environment.objects.get_or_create(
        fingerprint=facts["fingerprint"],
        defaults={
            "host": facts["host"], "cpu": facts["cpu"], "gpu": facts["gpu"], "gpu_driver": facts["gpu_driver"],
            "cuda": facts["cuda"], "python": facts["python"], "torch": facts["packages"].get("torch", ""),
            "facts": facts,
        },
    )
    return environment


def do_record_heartbeat(worker_name):
    """A worker is alive: its ``last_seen`` is now (the reconciler requeues the runs of silent workers)."""
    return bool(Worker.objects.filter(hostname=worker_name).update(last_seen=timezone.now()))


def do_attach_fit(run, artifact):
    """The fit artifact a running run is checked against (recorded before it executes)."""
    run.fit_artifact = artifact
    Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(fit_artifact=artifact)


def do_store_fit_artifact(detector, key, tool_version, content, summary, fit_seconds, references):
    """Cache what a detector learned from its reference programs; if another worker stored the same fit
    meanwhile, theirs is kept and returned."""
    try:
        with transaction.atomic():
            artifact = FitArtifact.objects.create(detector=detector, key=key, tool_version=tool_version,
                                                  content=content, summary=summary, fit_seconds=fit_seconds)
            artifact.reference_versions.set(references)
    except IntegrityError:
        artifact = FitArtifact.objects.get(key=key)
    return artifact


def do_claim_run(run_id, worker):
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


def retry_while_database_away(action):
    """Retry ``action`` with backoff for up to SILENTBENCH_DB_RETRY_SECONDS while the database cannot be
    reached (a restart, a failover), reconnecting each time: a worker keeps the result it holds. Only
    for idempotent actions, outside any transaction."""
    @functools.wraps(action)
    def retrying(*args, **kwargs):
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
def do_fail_run_without_executing(run, reason, kind):
    """Fail a claimed run that will not execute (refused, its fit failed, an internal error): ``reason``
    for a person, ``kind`` a RunFailureKind."""
    kind = RunFailureKind(kind)
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.FAILED, failure_reason=reason, failure_kind=kind, finished_at=timezone.now())
    return bool(updated)


def do_give_up_running_runs(campaign, *, acting_user=None):
    """Fail the runs of ``campaign`` still running in this process when it stops timing them (an overhead
    measurement interrupted): the reconciler leaves such runs alone, so nothing else would end them."""
    with transaction.atomic():
        return Run.objects.filter(campaign=campaign, status=RunStatus.RUNNING).update(
            status=RunStatus.FAILED, failure_reason=timer_interrupted(), failure_kind=kind_of(timer_interrupted),
            finished_at=timezone.now())


@retry_while_database_away
def do_finish_run(run, outcome):
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


def _store_result(run, outcome):
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


def _fail_storing(run, outcome, error):
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


def stale_running_runs(runs, now):
    """The runs among ``runs`` still running long past their allowance (their time limit under their
    detector, plus a grace period): whatever was executing them is gone."""
    for run in runs.filter(status=RunStatus.RUNNING).select_related("reproducer_version", "detector__code"):
        allowed = plugin_for(run.detector).run_allowance(run.reproducer_version.time_limit_seconds)
        if run.started_at + timedelta(seconds=allowed) + STALE_RUN_GRACE < now:
            yield run


def do_requeue_stale_runs(now=None):
    """The reaper: a run still 'running' long past its time limit lost its worker; queue it again (or give it
    up, do_requeue_lost_runs). Returns LostRuns."""
    now = now or timezone.now()
    return do_requeue_lost_runs({run.pk: run.attempts for run in stale_running_runs(dispatched_runs(), now)}, now)


LostRuns = namedtuple("LostRuns", "requeued given_up")  # run IDs


def do_requeue_lost_runs(seen, now=None):
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


def do_give_up_stale_timed_runs(now=None):
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


def do_flag_unservable_runs(now=None):
    """Fail the runs that nobody can serve instead of leaving them queued for ever: queued for longer
    than SILENTBENCH_UNSERVABLE_GRACE_MINUTES while no worker seen within SILENTBENCH_WORKER_SEEN_MINUTES
    consumes their queue. The reason names what they need and what the live workers offer. Returns the IDs."""
    now = now or timezone.now()
    workers = list(live_workers(now).order_by("hostname"))
    window = settings.SILENTBENCH_WORKER_SEEN_MINUTES
    served = {queue for worker in workers for queue in worker.queues}
    waiting = (dispatched_runs().filter(status=RunStatus.QUEUED,
                                  queued_at__lt=now - timedelta(minutes=settings.SILENTBENCH_UNSERVABLE_GRACE_MINUTES))
               .exclude(queue__in=served))
    failed, campaign_ids = [], set()
    for queue in sorted(set(waiting.values_list("queue", flat=True))):
        with transaction.atomic():
            runs = list(waiting.filter(queue=queue).select_for_update(of=("self",)).values_list("id", "campaign_id"))
            Run.objects.filter(pk__in=[run_id for run_id, _ in runs], status=RunStatus.QUEUED).update(
                status=RunStatus.FAILED, failure_reason=unservable_reason(queue, workers, window),
                failure_kind=RunFailureKind.UNSERVABLE, finished_at=now)
        failed += [run_id for run_id, _ in runs]
        campaign_ids.update(campaign_id for _, campaign_id in runs if campaign_id)
    for campaign in Campaign.objects.filter(pk__in=campaign_ids):
        do_complete_campaign(campaign, acting_user=None)
    if failed:
        logger.warning("failed %d run(s) that no live worker can serve: %s", len(failed), failed)
    return failed


def do_record_stability(campaign, *, acting_user=None):
    """Stability of every bug reproducer a verification campaign ran, and the bugs' new status.

    Over the campaign's seeds: buggy manifested a/k, fixed b/k (StabilityCheck.verdict_for). A
    deprecated bug keeps its status; a bug with several reproducers takes the worst verdict among them.
    """
    tallies = {}
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
    checks = []
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
        severity = [StabilityVerdict.VERIFIED, StabilityVerdict.FLAKY, StabilityVerdict.UNREPRODUCIBLE]
        by_bug = {}
        for check in checks:
            bug = check.reproducer_version.reproducer.bug
            by_bug[bug] = max(by_bug.get(bug, StabilityVerdict.VERIFIED), check.verdict, key=severity.index)
        for bug, verdict in by_bug.items():
            do_set_verification_verdict(bug, verdict, acting_user=acting_user, campaign=campaign)
    return checks


# --- Detector versions: recorded (built-in), submitted, reviewed, scored --------------------------------------------

def do_record_builtin_detector_version(plugin, source, code_hash, interface, *, acting_user=None):
    """Record a built-in plugin's module (``source``) as an approved DetectorVersion of the system: built-in and
    submitted detectors are one kind of record (runners.registry.builtin_version calls it on first use)."""
    with transaction.atomic():
        version, created = DetectorVersion.objects.get_or_create(
            name=plugin.name, version=plugin.version, code_hash=code_hash,
            defaults={"code": source, "interface": interface, "description": plugin.description, "builtin": True,
                      "review_state": DetectorReviewState.APPROVED, "reviewed_at": timezone.now()})
        if created:
            audit.record(acting_user, "record", version, f"recorded built-in detector {version}")
    return version


@transaction.atomic
def do_submit_detector_version(checked, link="", *, acting_user) -> DetectorVersion:
    """A researcher's detector (a runners.detector_submissions.CheckedDetector), stored as a version waiting
    for review. Nothing is imported, queued or run. A new version of a submitted detector comes from its
    submitter or a maintainer (``permissions``: checked by the callers); a built-in's name is refused, as is a
    version label or code the detector already has. Raises ValidationError with every problem found."""
    problems = []
    if problem := name_problem(checked.name):
        problems.append(problem)
    earlier = DetectorVersion.objects.filter(name=checked.name, builtin=False)
    if earlier.filter(version=checked.version).exists():
        problems.append(f"{checked.name} already has a version {checked.version!r}: give the new one another "
                        f"version label (the class's version attribute).")
    if same := earlier.filter(code_hash=checked.code_hash).first():
        problems.append(f"This code is identical to {same}: nothing new to review.")
    if problems:
        raise ValidationError(problems)
    version = DetectorVersion.objects.create(
        name=checked.name, version=checked.version, code=checked.code, code_hash=checked.code_hash,
        config=checked.config, interface=checked.interface, description=checked.description, link=link,
        submitted_by=acting_user, review_state=DetectorReviewState.PENDING)
    audit.record(acting_user, "submit", version, f"submitted detector {version} for review")
    return version


def _review_detector_version(version, approve, note, acting_user):
    version = record_review(version, approve, note, acting_user)
    audit.record(acting_user, "approve" if approve else "reject", version,
                 f"{'approved' if approve else 'rejected'} detector {version}" + (f": {version.review_note}"
                                                                                 * bool(version.review_note)))
    return version


@transaction.atomic
def do_approve_detector_version(version, note="", *, acting_user):
    """A maintainer approves one exact detector version; its scoring campaign starts (``do_start_scoring``).
    Returns ``(version, campaign)``."""
    version = _review_detector_version(version, True, note, acting_user)
    return version, do_start_scoring(version, acting_user=acting_user)


@transaction.atomic
def do_reject_detector_version(version, note, *, acting_user):
    """A maintainer rejects one detector version, with a reason the submitter reads; nothing of it ever runs."""
    return _review_detector_version(version, False, note, acting_user)


def do_start_scoring(version, seeds=None, versions=None, *, acting_user):
    """An evaluation campaign of one approved DetectorVersion (its submitted config) over every CPU reproducer and
    clean pipeline (``versions``: runners.scoring.scoring_versions), both variants, at the published
    evaluation's seeds (``seeds``: runners.scoring.published_seeds), its own fit references left out. Approval
    starts it; ``manage.py rescore`` starts it again on the current corpus."""
    from .fitting import is_fit_reference  # runners.fitting imports this module

    if not version.is_approved:
        raise ValidationError(f"{version} is not approved by a maintainer; it cannot run.")
    record = detector_record(version.name) if version.builtin else submitted_record(version)
    if record.code_id != version.pk:
        raise ValidationError(f"{version} is no longer the repository's {version.name}; score the current one.")
    seeds = tuple(published_seeds() if seeds is None else seeds)
    versions = scoring_versions() if versions is None else versions
    if not versions:
        raise ValidationError("There is no approved CPU reproducer or clean pipeline to score a detector on yet.")
    plan = CampaignPlan.build(versions, [record],
                              [Variant.BUGGY, Variant.FIXED], seeds, skip=is_fit_reference)
    return do_create_campaign(f"scoring {version.name} {version.version}", plan, CampaignPurpose.SCORING,
                              acting_user=acting_user)
