"""Verdicts where people look: the one line that leads a run's page, the alarm and detection columns of the
run tables, and which detectors catch a bug. The judging is ``evaluation.metrics``' (``judge_run``,
``detected_beyond_clean``, the detection table): these only put it into words and pick the runs.

A run's page judges its alarms with ``judge_run``. A table of runs cannot read every alarm of its page (up to
2,000 a run), so ``table_verdicts`` counts them in SQL by the same rule; tests/test_verdicts.py checks that
both agree."""
from dataclasses import dataclass

from django.db.models import Count, F, Min, Q
from django.db.models.functions import Coalesce
from django.template.defaultfilters import pluralize, truncatechars

from bugs.selectors import visible_reproducers
from core.caching import cached, digest
from core.enums import Variant
from runners.detectors.bundle import Bundle
from runners.models import Alarm, Campaign, Run, RunStatus
from runners.selectors import visible_campaigns, visible_runs

from .leaderboard import BASELINE
from .metrics import BACKDATING_STEPS, AlarmPoint, RunVerdict, detected_beyond_clean, judge_run
from .models import Device, Evaluation
from .results import cached_for, latest_evaluation, results_viewer, without_nan
from .tables import detection_table, judged_runs


@dataclass(frozen=True)
class Headline:
    """A run's verdict in one line, and the badge class that colours it (those of static/css/site.css)."""

    text: str
    tone: str


def false_alarms_text(count):
    return f"{count} false alarm{pluralize(count)}"


def run_headline(run, alarms, fixed_rules=None):
    """The line that leads a run's page. ``alarms`` are all of its alarms as ``AlarmPoint``s; ``fixed_rules``,
    for a buggy run, the rules its fixed twin (same version, detector, seed and campaign) raised, if it has one."""
    if run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
        return Headline(f"{run.get_status_display().lower()}: no verdict yet", run.status)
    if run.status != RunStatus.SUCCEEDED:
        kind = f" ({run.get_failure_kind_display().lower()})" if run.failure_kind not in ("", run.status) else ""
        reason = f": {truncatechars(run.failure_reason, 200)}" if run.failure_reason else ""
        return Headline(f"{run.get_status_display().lower()}{kind}{reason}", "failed")
    if run.detector.name == BASELINE:
        return _plain_headline(run)
    variant = judged_variant(run)
    verdict = judge_run(variant, run.trigger_step, run.trigger_time, alarms, run.steps - 1)
    if variant != Variant.BUGGY:
        if not verdict.false_alarms:
            return Headline("clean run: no alarm", "succeeded")
        return Headline(f"clean run: {false_alarms_text(verdict.false_alarms)}", "false-alarm")
    trigger = (f"trigger {run.trigger_step}" if run.trigger_step is not None
               else "no trigger step recorded: judged from step 0")
    if verdict.detected:
        first = (run.trigger_step or 0) + verdict.latency_steps
        text = f"detected at step {first} ({trigger}), {false_alarms_text(verdict.false_alarms)}"
        if fixed_rules is not None and not detected_beyond_clean(run.trigger_step, alarms, fixed_rules,
                                                                 run.steps - 1):
            text += "; every qualifying rule also fired on the fixed run of this seed"
        return Headline(text, "detected")
    symptom = "" if run.manifested is not False else "; the symptom did not manifest"
    text = f"missed: no alarm at or after the trigger ({trigger}), {false_alarms_text(verdict.false_alarms)}{symptom}"
    return Headline(text, "false-alarm" if verdict.false_alarms else "missed")


def judged_variant(run):
    """The variant a run is judged as: a clean pipeline's run is clean, whether it was presented as fixed or as buggy
    (a canary: evaluation.integrity)."""
    return Variant.FIXED if run.reproducer_version.reproducer.is_reference_pipeline else run.variant


def _plain_headline(run):
    """The baseline runs the program without a detector: only the oracle speaks."""
    if run.manifested is None:
        return Headline("no detector: the oracle gave no verdict", "missed")
    where = f" (trigger step {run.trigger_step})" if run.trigger_step is not None else ""
    if run.manifested:
        variant = "" if run.variant == Variant.BUGGY else " on the fixed variant"
        return Headline(f"no detector: symptom manifested{variant}{where}", "missed")
    return Headline("no detector: no symptom", "missed")


def headline_of(run, counterpart=None):
    """``run_headline`` with the run's alarms read (two small queries: a run keeps at most 2,000 alarms)."""
    alarms = [AlarmPoint(step, time, rule, arrival) for step, time, rule, arrival
              in run.alarms.values_list("step", "time", "rule", "arrival_step")]
    fixed_rules = None
    if counterpart is not None and run.variant == Variant.BUGGY and counterpart.variant == Variant.FIXED:
        fixed_rules = set(counterpart.alarms.values_list("rule", flat=True).distinct())
    return run_headline(run, alarms, fixed_rules)


def table_verdicts(runs, member=""):
    """{run id: (alarm count, RunVerdict or None)} for the runs of one table page, in one grouped query. The
    verdict, for succeeded runs only, follows ``judge_run``: on a buggy run the alarms at or after the trigger
    step (step 0 without one) received in time detect, the earlier ones are false; on a clean run every alarm is
    false. Latency in seconds and the first rule are left out: the tables do not show them. ``member``: of a
    bundle's run (runners.detectors.bundle), only the alarms of that member count, as the tables count them."""
    runs = list(runs)
    alarms = Alarm.objects.filter(run__in=[run.pk for run in runs])
    if member:  # a bundle's run: its member's alarms; any other run: its own detector's, which name none
        bundled = Q(run__detector__name=Bundle.name)
        alarms = alarms.filter((bundled & Q(detector=member)) | (~bundled & Q(detector="")))
    trigger = Coalesce(F("run__trigger_step"), 0)
    in_time = Q(arrival_step__isnull=True) | (Q(arrival_step__lt=F("run__steps") - 1)
                                              & Q(step__gte=F("arrival_step") - BACKDATING_STEPS))
    qualifying = Q(step__gte=trigger) & in_time
    counts = {row["run"]: row for row in alarms.order_by()
              .values("run").annotate(alarms=Count("id"), qualifying=Count("id", filter=qualifying),
                                      pre_trigger=Count("id", filter=Q(step__lt=trigger)),
                                      first=Min("step", filter=qualifying))}
    found = {}
    for run in runs:
        row = counts.get(run.pk, {"alarms": 0, "qualifying": 0, "pre_trigger": 0, "first": None})
        verdict = None
        if run.status == RunStatus.SUCCEEDED:
            if judged_variant(run) != Variant.BUGGY:
                verdict = RunVerdict(detected=False, false_alarms=row["alarms"])
            else:
                latency = row["first"] - (run.trigger_step or 0) if row["qualifying"] else None
                verdict = RunVerdict(detected=bool(row["qualifying"]), false_alarms=row["pre_trigger"],
                                     latency_steps=latency)
        found[run.pk] = (row["alarms"], verdict)
    return found


@dataclass
class BugDetections:
    """How each detector fares on one bug: the rows of the detection table for it, from ``evaluation`` when the
    latest stored evaluation ran the bug, else judged from the bug's ``runs`` succeeded runs in ``campaign``, the
    latest campaign that ran it under a detector (the same rows as that campaign's results, narrowed to the bug)."""

    rows: list
    evaluation: Evaluation | None = None
    gpu: tuple | None = None  # (the latest GPU evaluation, its rows of the bug) beside a CPU evaluation's rows
    campaign: Campaign | None = None
    runs: int = 0
    baseline_runs: int = 0  # with no rows: its succeeded runs without a detector (its verification's), if any

    @property
    def caught_by(self):
        """Detectors that detected the bug beyond its fixed twin (a qualifying rule the fixed run did not raise)."""
        return sorted({row["detector"] for row in self.rows if row.get("detected_beyond_fixed_runs")})

    @property
    def gpu_caught_by(self):
        """``caught_by`` in the GPU evaluation shown beside the CPU one."""
        return sorted({row["detector"] for row in self.gpu[1] if row.get("detected_beyond_fixed_runs")})

    @property
    def alarmed_alike(self):
        """Detectors that detected it, but only with rules that fired on the fixed twin as well."""
        detected = {row["detector"] for row in self.rows if row.get("detected_runs")}
        return sorted(detected - set(self.caught_by))


def bug_detections(bug, user):
    """``BugDetections`` of ``bug`` as ``user`` may see it (only its reproducers that ``user`` may see). Without a
    stored evaluation of the bug, one campaign's runs are judged, not the bug's whole history: that is bounded by a
    campaign's size, and its seeds and environment belong together."""
    reproducers = set(visible_reproducers(user).filter(bug=bug).values_list("name", flat=True))
    stored = {}  # device -> (evaluation, its rows of the bug): the CPU evaluation's first, the GPU one's apart
    for device in Device.values:
        evaluation = latest_evaluation(results_viewer(user), device)
        if evaluation is None:
            continue
        rows = [row for row in cached_for(evaluation, f"detection:{bug.bug_id}", lambda evaluation=evaluation: [
            row for row in evaluation.tables.get("detection", []) if row.get("bug") == bug.bug_id])
            if row.get("reproducer") in reproducers]
        if rows:
            stored[device] = (evaluation, rows)
    if stored:
        (evaluation, rows), *gpu = stored.values()  # a bug only GPUs run: the GPU evaluation's are its rows
        return BugDetections(rows=rows, evaluation=evaluation, gpu=gpu[0] if gpu else None)
    runs = visible_runs(user, Run.objects.filter(reproducer_version__reproducer__bug=bug, status=RunStatus.SUCCEEDED))
    campaign = (visible_campaigns(user).filter(pk__in=runs.exclude(detector__name=BASELINE).values("campaign"))
                .order_by("-created_at", "-id").first())
    if campaign is None:
        return BugDetections(rows=[], baseline_runs=runs.filter(detector__name=BASELINE).count())
    rows, judged = cached(_judged_key(bug, runs.filter(campaign=campaign)), lambda: _detection_rows(
        judged_runs(runs.filter(campaign=campaign))))
    return BugDetections(rows=[row for row in rows if row["reproducer"] in reproducers], campaign=campaign,
                         runs=judged)


def _judged_key(bug, runs):
    """The cache key of the detection rows of ``runs``, succeeded runs of ``bug``: named by their IDs, attempts and
    finish times (a run's results and alarms are stored as it finishes, and a retry deletes them as it queues the
    run again: runners.actions) and the bug's status, which the judging reads; a campaign still running is judged
    again only when one of its runs of the bug has finished since."""
    state = list(runs.order_by("id").values_list("id", "attempts", "finished_at"))
    return f"bug-detections:{bug.pk}:{bug.status}:{digest(state)}"


def _detection_rows(judged):
    """(the detection table's records over ``judged``, how many runs were judged)."""
    return without_nan(detection_table(judged=judged)).to_dict("records"), len(judged)


def stored_bug_ids(evaluation):
    """The bugs of ``evaluation``'s stored detection table."""
    return sorted({row["bug"] for row in evaluation.tables.get("detection", []) if row.get("bug")})


def caught_by_in(evaluation, bug_ids):
    """{bug ID: [detectors that detected it beyond its fixed twin], or None when the evaluation did not run it}
    from ``evaluation``'s stored detection table."""
    caught = dict.fromkeys(bug_ids)
    for row in evaluation.tables.get("detection", []):
        bug_id = row.get("bug")
        if bug_id in caught and row.get("buggy_runs"):
            caught[bug_id] = caught[bug_id] or set()
            if row.get("detected_beyond_fixed_runs"):
                caught[bug_id].add(row["detector"])
    return {bug_id: None if detectors is None else sorted(detectors) for bug_id, detectors in caught.items()}
