"""State changes of stored evaluations, as named actions (the acting user is None for the operator's
``manage.py evaluate``)."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from bugs.actions import do_set_verification_verdict
from bugs.models import Bug, BugStatus, Reproducer, ReproducerVersion
from core import audit
from core.enums import AuditAction, ReviewState, Variant, worst_verdict
from runners.actions.campaigns import do_create_campaign
from runners.bisection import (
    BisectionResult,
    ReleaseOutcome,
    final_release,
    free_slots,
    index_releases,
    next_probes,
    not_served_reason,
    probe_outcome,
    probe_plan,
    probe_runs,
    release_of,
    releases_between,
    served_environments,
)
from runners.models import (
    ALARM_FIELDS,
    FINISHED_STATUSES,
    RUN_RECORD_FIELDS,
    Alarm,
    Campaign,
    Detector,
    DetectorVersion,
    Environment,
    PythonEnvironment,
    Run,
    RunStatus,
    StabilityCheck,
)
from runners.plans import MAX_STEPS, CampaignPlan
from runners.selectors import runnable_versions, visible_runs
from sensitivity.oracle import DEFAULT_QUANTILE

from .models import Bisection, BisectionProbe, BisectionStatus, Device, Evaluation, SensitivityEvaluation
from .published import (
    PUBLISHED_DIR,
    VERSION_FIELDS,
    SnapshotError,
    published_id_for,
    snapshot_of,
    snapshot_path,
    write_snapshot,
)
from .sensitivity import sensitivity_tables
from .tables import detection_table, false_positive_table, flakiness_table, judged_runs, latency_table
from .versions import MATRIX_KEY

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.db.models import QuerySet
    from pandas import DataFrame

logger = logging.getLogger(__name__)


def records(frame: DataFrame) -> list[dict[str, Any]]:
    return json.loads(frame.to_json(orient="records"))


def run_counts(runs: QuerySet[Run]) -> dict[str, int]:
    """How many runs, failed, retried, and cancelled (not finished by ``evaluate --timeout``)."""
    return {"runs": runs.count(), "failed_runs": runs.filter(status=RunStatus.FAILED).count(),
            "retried_runs": runs.filter(attempts__gt=1).count(),
            "cancelled_runs": runs.filter(status=RunStatus.CANCELLED).count()}


def run_tables(runs: QuerySet[Run]) -> dict[str, list[dict[str, Any]]]:
    """The tables computed from an evaluation's runs (overhead and fits are measured apart)."""
    judged = judged_runs(runs)
    return {name: records(table(judged=judged)) for name, table in (
        ("detection", detection_table), ("false_positives", false_positive_table), ("latency", latency_table),
        ("flakiness", flakiness_table))}


@transaction.atomic
def do_store_evaluation(campaign: Campaign, overhead_campaign: Campaign | None, overhead: list[dict[str, Any]],
                        fits: list[dict[str, Any]], parameters: dict[str, Any], wall_seconds: float, *,
                        device: str = Device.CPU, acting_user: User | None) -> Evaluation:
    """Store a finished evaluation: its tables computed from its campaign's runs, with the overhead and
    fit tables measured apart; ``device``, where its runs ran."""
    runs = campaign.runs.all()
    evaluation = Evaluation.objects.create(
        campaign=campaign, overhead_campaign=overhead_campaign, parameters={**parameters, **run_counts(runs)},
        tables={**run_tables(runs), "overhead": overhead, "fits": fits}, wall_seconds=wall_seconds, device=device)
    audit.record(acting_user, AuditAction.CREATE, evaluation, f"stored evaluation #{evaluation.pk} of {campaign}")
    return evaluation


def do_store_sensitivity_evaluation(campaign: Campaign, parameters: dict[str, Any], wall_seconds: float, *,
                                    acting_user: User | None) -> SensitivityEvaluation:
    """Store a finished sensitivity evaluation with its tables computed from its campaign's runs
    (evaluation.sensitivity)."""
    runs = campaign.runs.all()
    evaluation = SensitivityEvaluation.objects.create(
        campaign=campaign, parameters={**parameters, **run_counts(runs)},
        tables=sensitivity_tables(runs, parameters.get("quantile", DEFAULT_QUANTILE)), wall_seconds=wall_seconds)
    audit.record(acting_user, AuditAction.CREATE, evaluation,
                 f"stored sensitivity evaluation #{evaluation.pk} of {campaign}")
    return evaluation


def do_retabulate_sensitivity_evaluation(evaluation: SensitivityEvaluation, *,
                                         acting_user: User | None) -> SensitivityEvaluation:
    """Recompute a stored sensitivity evaluation's tables from its runs, with the code of now (its quantile kept)."""
    evaluation.tables = sensitivity_tables(evaluation.campaign.runs.all(),
                                           evaluation.parameters.get("quantile", DEFAULT_QUANTILE))
    evaluation.save(update_fields=["tables"])
    audit.record(acting_user, AuditAction.RETABULATE, evaluation,
                 f"retabulated sensitivity evaluation #{evaluation.pk} from its runs")
    return evaluation


@transaction.atomic
def do_record_overhead(evaluation: Evaluation, overhead_campaign: Campaign, overhead: list[dict[str, Any]],
                       wall_seconds: float, *, acting_user: User | None) -> Evaluation:
    """Add the overhead pairs, measured after the evaluation was stored (so that an interruption while they run
    loses only them), to its tables. A published one is refused, as for retabulating: its ID names its tables."""
    if evaluation.published_id:
        raise ValidationError(f"Evaluation #{evaluation.pk} is published as {evaluation.published_id}: its tables "
                              "stay as published.")
    evaluation.overhead_campaign = overhead_campaign
    evaluation.tables = {**evaluation.tables, "overhead": overhead}
    evaluation.wall_seconds = wall_seconds
    evaluation.save(update_fields=["overhead_campaign", "tables", "wall_seconds"])
    audit.record(acting_user, AuditAction.RECORD, evaluation,
                 f"recorded the overhead of evaluation #{evaluation.pk} ({overhead_campaign})")
    return evaluation


@transaction.atomic
def do_retabulate_evaluation(evaluation: Evaluation, *, acting_user: User | None) -> Evaluation:
    """Recompute a stored evaluation's run tables from its runs (after retried runs finished). A published one is
    refused: its ID names its tables, and copies of it are loaded elsewhere."""
    if evaluation.published_id:
        raise ValidationError(f"Evaluation #{evaluation.pk} is published as {evaluation.published_id}: its tables "
                              "stay as published (evaluate again, and publish that).")
    runs = evaluation.campaign.runs.all()
    previous = evaluation.parameters.copy()
    evaluation.tables = {**evaluation.tables, **run_tables(runs)}
    evaluation.parameters = {**evaluation.parameters, **run_counts(runs)}
    evaluation.save(update_fields=["tables", "parameters"])
    audit.record(acting_user, AuditAction.RETABULATE, evaluation,
                 f"recomputed the tables of evaluation #{evaluation.pk}",
                 previous_counts={key: previous.get(key) for key in ("runs", "failed_runs", "retried_runs")})
    return evaluation


# --- Published evaluations (evaluation.published) ---

def do_publish_evaluation(evaluation: Evaluation, directory: Path = PUBLISHED_DIR, *,
                          acting_user: User | None) -> Path:
    """Name ``evaluation`` by its published ID (once; publishing again rewrites the same snapshot) and write the
    snapshot that ships with the app. Refused (ValidationError) for an evaluation with runs the public may not see
    (a held-out bug's, unreviewed code's: the snapshot is public, and a fresh install could not load them) and for
    an ID another evaluation holds. The file is written before the name is stored, outside the transaction, so
    that workers are not held up while it is."""
    campaigns = [campaign for campaign in (evaluation.campaign, evaluation.overhead_campaign) if campaign]
    for campaign in campaigns:
        hidden = campaign.runs.count() - visible_runs(None, campaign.runs.all()).count()
        if hidden:
            raise ValidationError(f"Evaluation #{evaluation.pk} has {hidden} run(s) of code the public may not see "
                                  "(held-out bugs or unreviewed reproducers): publishing would make them public.")
    published_id = evaluation.published_id or published_id_for(evaluation)
    if Evaluation.objects.filter(published_id=published_id).exclude(pk=evaluation.pk).exists():
        raise ValidationError(f"Another evaluation is published as {published_id} (the same day, the same tables).")
    first_time = not evaluation.published_id
    if first_time:
        evaluation.published_id, evaluation.published_at = published_id, timezone.now()
    path = write_snapshot(snapshot_of(evaluation), snapshot_path(published_id, directory))
    if first_time:
        with transaction.atomic():
            evaluation.save(update_fields=["published_id", "published_at"])
            audit.record(acting_user, AuditAction.PUBLISH, evaluation,
                         f"published evaluation #{evaluation.pk} as {published_id}")
    return path


@transaction.atomic
def do_load_published_evaluation(snapshot: dict[str, Any], *, acting_user: User | None) -> tuple[Evaluation, bool]:
    """(the evaluation of ``snapshot`` in this database, whether it was loaded now): its reproducer versions,
    detectors and environments are matched by content (made where missing), its campaigns, runs, alarms and
    stability checks made anew with their original times. The catalog must be loaded first (its bugs and
    reproducers); SnapshotError names what is missing, and a snapshot whose tables do not match their digest."""
    published_id = snapshot["published_id"]
    existing = Evaluation.objects.filter(published_id=published_id).first()
    if existing is not None:
        return existing, False
    versions = [_version_from(entry, published_id) for entry in snapshot["reproducer_versions"]]
    detectors = [_detector_from(entry, acting_user) for entry in snapshot["detectors"]]
    environments = [Environment.objects.get_or_create(fingerprint=entry["fingerprint"], defaults=entry)[0]
                    for entry in ({k: v for k, v in e.items() if k != "key"} for e in snapshot["environments"])]
    campaigns = {role: _with_times(Campaign.objects.create(**_parsed(fields)), _parsed(fields), "created_at")
                 for role, fields in snapshot["campaigns"].items()}
    runs: list[Run] = []
    alarms: list[Alarm] = []
    for entry in snapshot["runs"]:
        fields = _parsed({name: entry[name] for name in RUN_RECORD_FIELDS})
        environment = entry["environment"]
        runs.append(Run(campaign=campaigns[entry["campaign"]], reproducer_version=versions[entry["reproducer_version"]],
                        detector=detectors[entry["detector"]],
                        environment=environments[environment] if environment is not None else None,
                        stdout=f"(not shipped: published evaluation {published_id} keeps no logs)", **fields))
    Run.objects.bulk_create(runs, batch_size=500)
    for run, entry in zip(runs, snapshot["runs"]):
        run.queued_at = _parsed(entry)["queued_at"]  # auto_now_add set it to now
        alarms.extend(Alarm(run=run, **dict(zip(ALARM_FIELDS, values, strict=True))) for values in entry["alarms"])
    Run.objects.bulk_update(runs, ["queued_at"], batch_size=500)
    Alarm.objects.bulk_create(alarms, batch_size=2000)
    checks, new = [], set()
    for check in snapshot["stability"]:  # one verification may ship in several snapshots: loaded once
        fields = _parsed({name: value for name, value in check.items() if name != "reproducer_version"})
        version = versions[check["reproducer_version"]]
        found = StabilityCheck.objects.filter(reproducer_version=version, checked_at=fields["checked_at"],
                                              verdict=fields["verdict"], seeds=fields["seeds"]).first()
        if found is None:
            found = _with_times(StabilityCheck.objects.create(reproducer_version=version, **fields), fields,
                                "checked_at")
            new.add(found.pk)
        checks.append(found)
    _verdicts_from(checks, new, acting_user)
    stored = snapshot["evaluation"]
    evaluation = Evaluation.objects.create(
        campaign=campaigns["evaluation"], overhead_campaign=campaigns.get("overhead"),
        parameters=stored["parameters"], tables=stored["tables"], wall_seconds=stored["wall_seconds"],
        published_id=published_id, published_at=_parsed(snapshot)["published_at"],
        device=stored.get("device", Device.CPU))  # snapshots made before GPU evaluations are all CPU ones
    if evaluation.tables_digest != stored["tables_digest"]:
        raise SnapshotError(f"{published_id}: its tables do not match their digest (changed after publishing?)")
    _with_times(evaluation, stored, "created_at")
    audit.record(acting_user, AuditAction.LOAD, evaluation,
                 f"loaded published evaluation {published_id}: {len(runs)} runs, {len(alarms)} alarms")
    return evaluation, True


def _verdicts_from(checks: list[StabilityCheck], new: set[int], acting_user: User | None) -> None:
    """Give each bug of ``checks`` (a snapshot's) the verdict of the published stability checks of its current
    reproducer versions, those of every snapshot loaded so far (the worst among them, as a verification gives it),
    when its status is still what the snapshots loaded before gave it (or it was never verified): a bug with a CPU
    and a CUDA reproducer takes both, whichever snapshot (the CPU evaluation's, the GPU one's) loads first, and a
    newer snapshot's newer checks count. A verdict given here that differs from theirs is kept; a check of a version
    the catalog has replaced says nothing of the bug as it is now. ``new``: the IDs of the checks this snapshot
    loaded first (the others came with an earlier one)."""
    bugs = {bug for bug in (check.reproducer_version.reproducer.bug for check in checks) if bug is not None}
    for bug in bugs:
        current = [version for version in (reproducer.latest_version() for reproducer in
                                           Reproducer.objects.filter(bug=bug)) if version is not None]
        published = list(StabilityCheck.objects.filter(reproducer_version__in=current, campaign=None)
                         .order_by("checked_at", "id"))
        before, now = published_verdict([c for c in published if c.pk not in new]), published_verdict(published)
        if now is not None and now != bug.status and bug.status in (BugStatus.APPROVED, before):
            do_set_verification_verdict(bug, now, acting_user=acting_user)


def published_verdict(checks: list[StabilityCheck]) -> str | None:
    """The worst verdict of the latest check of each version among ``checks`` (oldest first); None without any."""
    latest = {check.reproducer_version_id: check.verdict for check in checks}
    verdict = None
    for found in latest.values():
        verdict = found if verdict is None else worst_verdict(verdict, found)
    return verdict


TIME_FIELDS = ("created_at", "completed_at", "queued_at", "started_at", "finished_at", "checked_at", "published_at")


def _parsed(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with their times (ISO 8601 in a snapshot) as datetimes."""
    return {name: parse_datetime(value) if name in TIME_FIELDS and isinstance(value, str) else value
            for name, value in fields.items()}


def _with_times(row: Any, fields: dict[str, Any], name: str) -> Any:
    """``row`` with its auto_now_add time ``name`` set back to the one in ``fields``."""
    value = _parsed(fields)[name]
    type(row).objects.filter(pk=row.pk).update(**{name: value})
    setattr(row, name, value)
    return row


def _older_than_every(existing: Any, created_at: datetime) -> datetime:
    """A loaded version's time: its own, unless that would make it newer than a version this database already has
    of the same code (times of two databases do not compare), then just before the oldest of them: what ran for a
    published evaluation never becomes the latest version here."""
    oldest = existing.order_by("created_at").values_list("created_at", flat=True).first()
    return min(created_at, oldest - timedelta(seconds=1)) if oldest is not None else created_at


def _version_from(entry: dict[str, Any], published_id: str) -> ReproducerVersion:
    """The reproducer version a snapshot names, by its content; made, approved, when the catalog has moved on."""
    reproducer = Reproducer.objects.filter(bug__bug_id=entry["bug"], name=entry["reproducer"]).first() \
        if entry["bug"] else Reproducer.objects.filter(bug=None, name=entry["reproducer"]).first()
    if reproducer is None:
        named = f"{entry['bug']}/{entry['reproducer']}" if entry["bug"] else f"pipeline/{entry['reproducer']}"
        raise SnapshotError(f"{published_id}: this database has no reproducer {named}; run load_catalog first")
    version = reproducer.versions.filter(content_hash=entry["content_hash"]).first()
    if version is None:
        fields = _parsed({name: entry[name] for name in VERSION_FIELDS})
        fields["created_at"] = _older_than_every(reproducer.versions.all(), fields["created_at"])
        version = _with_times(ReproducerVersion.objects.create(
            reproducer=reproducer, review_state=ReviewState.APPROVED,
            review_note=f"the version that ran in published evaluation {published_id}", **fields), fields,
            "created_at")
    return version


def _detector_from(entry: dict[str, Any], acting_user: User | None) -> Detector:
    """The Detector row a snapshot names: its code matched by hash (recorded, approved, where missing)."""
    code = entry["code"]
    version = None
    if code is not None:
        code = _parsed(code)
        version, created = DetectorVersion.objects.get_or_create(
            name=code["name"], version=code["version"], code_hash=code["code_hash"],
            defaults={**code, "review_state": ReviewState.APPROVED})
        if created:
            code["created_at"] = _older_than_every(DetectorVersion.objects.filter(name=code["name"]).exclude(
                pk=version.pk), code["created_at"])
            _with_times(version, code, "created_at")
    detector, _ = Detector.objects.get_or_create(
        name=entry["name"], version=entry["version"], config_hash=entry["config_hash"], code=version,
        defaults={"config": entry["config"], "description": entry["description"]})
    return detector


# --- The version matrix and bisections across torch releases (evaluation.versions, runners.bisection) ---

def do_create_version_matrix(environments: Sequence[PythonEnvironment], seeds: Iterable[int], steps: int | None = None,
                             *, acting_user: User | None) -> Campaign:
    """The version-matrix campaign: every CPU bug reproducer, buggy and fixed, ``plain``, over ``seeds`` in each
    of ``environments`` (PythonEnvironments, one per torch release); a reproducer version runs only in the
    environments its ``needs.packages`` allow (runners.plans). Its parameters name the releases, which is what
    makes it a version matrix (evaluation.versions.MATRIX_KEY)."""
    releases = [release_of(environment.torch) for environment in environments]
    plan = CampaignPlan.resolve(bugs=None, detectors=["plain"], variants=(Variant.BUGGY, Variant.FIXED),
                                seeds=seeds, steps=steps, environments=environments)
    with transaction.atomic():
        campaign = do_create_campaign(f"version matrix: torch {', '.join(releases)}, {len(plan.seeds)} seeds", plan,
                                      acting_user=acting_user)
        campaign.parameters = {**campaign.parameters, MATRIX_KEY: {"releases": releases}}
        campaign.save(update_fields=["parameters"])
    return campaign


def bisected_version(bug: Bug, reproducer: str | None = None) -> ReproducerVersion:
    """The latest approved CPU reproducer version of ``bug`` that a bisection runs (the one named ``reproducer``,
    or the first by name); ValidationError when there is none."""
    versions = [version for version in runnable_versions([bug.bug_id])
                if reproducer is None or version.reproducer.name == reproducer]
    if not versions:
        named = f" named {reproducer!r}" if reproducer else ""
        raise ValidationError(f"{bug.bug_id} has no approved CPU reproducer{named} to bisect.")
    return versions[0]


MAX_BISECTION_SEEDS = 10


@transaction.atomic
def do_start_bisection(bug: Bug, good: str, bad: str, *, seeds: Iterable[int], releases: Sequence[str] | None = None,
                       workers: int | None = None, steps: int | None = None, reproducer: str | None = None,
                       acting_user: User | None) -> Bisection:
    """Start a bisection of ``bug`` from release ``good`` to ``bad`` (runners.bisection): the releases between
    them are ``releases`` when given, else those the package index serves, looked up as it first advances (on a
    worker). ``workers``: probes per round (None: the free worker slots then). ``do_advance_bisection`` runs it."""
    version = bisected_version(bug, reproducer)
    seeds = sorted(set(seeds))
    problems = []
    try:
        if final_release(good) == final_release(bad):
            problems.append("The good and the bad release must differ.")
        chosen = releases_between(good, bad, releases) if releases else []
    except ValueError as error:
        problems.append(f"{str(error)[0].upper()}{str(error)[1:]}.")
    if not seeds or len(seeds) > MAX_BISECTION_SEEDS or min(seeds) < 0:
        problems.append(f"Give between 1 and {MAX_BISECTION_SEEDS} seeds, none negative.")
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        problems.append(f"Steps must be between 1 and {MAX_STEPS}.")
    if problems:
        raise ValidationError(problems)
    bisection = Bisection.objects.create(bug=bug, reproducer_version=version, good=good, bad=bad, releases=chosen,
                                         seeds=seeds, steps=steps, workers=workers, started_by=acting_user)
    audit.record(acting_user, AuditAction.CREATE, bisection, f"started bisection #{bisection.pk} of {bug.bug_id} from "
                                                   f"{good} to {bad} over {len(seeds)} seeds")
    return bisection


def do_advance_bisection(bisection: Bisection, *, acting_user: User | None = None,
                         available: Callable[[], Iterable[str]] = index_releases,
                         slots: Callable[[], int] = free_slots) -> Bisection:
    """One step of a bisection, safe to repeat: once the open round's runs have all finished, record each probe's
    outcome; then ask the planner (runners.bisection.next_probes) for the next round, and create its campaign (its
    runs go to the workers), or record the result. A problem (the index unreachable, a release that no live worker
    serves, a plan refused) fails the bisection with the reason; so does any other error of the step, logged with
    its traceback, so that no bisection is left running with nothing to advance it. Returns the bisection as
    stored."""
    bisection.refresh_from_db()
    if bisection.status != BisectionStatus.RUNNING:
        return bisection
    try:
        return _advance_bisection(bisection, acting_user, available, slots)
    except (ValueError, OSError, ValidationError) as error:
        return do_fail_bisection(bisection, error, acting_user=acting_user)
    except Exception as error:  # noqa: BLE001 - the step's driver stops here: the bisection must not stay running
        logger.exception("bisection #%s: unexpected error in a step", bisection.pk)
        return do_fail_bisection(bisection, f"unexpected error: {type(error).__name__}: {error}",
                                 acting_user=acting_user)


def _advance_bisection(bisection: Bisection, acting_user: User | None, available: Callable[[], Iterable[str]],
                       slots: Callable[[], int]) -> Bisection:
    """The step of ``do_advance_bisection``; raises what stops the bisection."""
    if not bisection.releases:
        releases = releases_between(bisection.good, bisection.bad, available())
        Bisection.objects.filter(pk=bisection.pk).update(releases=releases)
        bisection.releases = releases
    open_probes = list(bisection.probes.filter(outcome="").select_related("campaign", "environment"))
    if any(probe.campaign is None for probe in open_probes):
        raise ValueError("the campaign of an open round was deleted, so its probes have no runs to judge")
    if any(probe_runs(probe.campaign, probe.environment).exclude(status__in=FINISHED_STATUSES).exists()
           for probe in open_probes):
        return bisection
    for probe in open_probes:
        probe.outcome, probe.manifested, probe.failed, probe.seconds = probe_outcome(
            probe_runs(probe.campaign, probe.environment))
        probe.runs = probe_runs(probe.campaign, probe.environment).count()
        probe.save(update_fields=["outcome", "manifested", "failed", "seconds", "runs"])
    known = {probe.release: ReleaseOutcome(probe.outcome) for probe in bisection.probes.all()}
    step = next_probes(bisection.releases, known, bisection.workers or slots())
    if step.result is not None:
        return _finish_bisection(bisection, step.result, acting_user)
    environments, missing = served_environments(bisection.reproducer_version, step.probes)
    if missing:
        raise ValueError(not_served_reason(missing))
    plan = probe_plan(bisection.reproducer_version, environments, bisection.seeds, bisection.steps)
    return _start_round(bisection, step.probes, environments, plan, len(known), acting_user)


def _start_round(bisection: Bisection, releases: Sequence[str], environments: Sequence[PythonEnvironment | None],
                 plan: CampaignPlan, known_count: int, acting_user: User | None) -> Bisection:
    with transaction.atomic():
        locked = Bisection.objects.select_for_update().get(pk=bisection.pk)
        if locked.status != BisectionStatus.RUNNING or locked.probes.count() != known_count:
            return locked  # another driver advanced it meanwhile
        number = (locked.probes.aggregate(last=Max("round"))["last"] or 0) + 1
        campaign = do_create_campaign(
            f"bisection #{locked.pk} round {number}: {locked.bug.bug_id} on torch {', '.join(releases)}", plan,
            acting_user=acting_user)
        BisectionProbe.objects.bulk_create([
            BisectionProbe(bisection=locked, round=number, release=release, environment=environment, campaign=campaign)
            for release, environment in zip(releases, environments)])
    return locked


def _finish_bisection(bisection: Bisection, result: BisectionResult, acting_user: User | None) -> Bisection:
    with transaction.atomic():
        updated = Bisection.objects.filter(pk=bisection.pk, status=BisectionStatus.RUNNING).update(
            status=BisectionStatus.FINISHED, first_changed=result.first_changed or "", last_same=result.last_same or "",
            reason=result.reason, finished_at=timezone.now())
        if updated:
            audit.record(acting_user, AuditAction.FINISH, bisection, f"bisection #{bisection.pk}: {result.reason}")
    bisection.refresh_from_db()
    return bisection


def do_fail_bisection(bisection: Bisection, error: BaseException | str, *,
                      acting_user: User | None = None) -> Bisection:
    """End a running bisection with the reason it cannot go on."""
    reason = "; ".join(error.messages) if isinstance(error, ValidationError) else str(error)
    with transaction.atomic():
        if Bisection.objects.filter(pk=bisection.pk, status=BisectionStatus.RUNNING).update(
                status=BisectionStatus.FAILED, reason=reason, finished_at=timezone.now()):
            audit.record(acting_user, AuditAction.FAIL, bisection, f"bisection #{bisection.pk} failed: {reason}")
    bisection.refresh_from_db()
    return bisection
