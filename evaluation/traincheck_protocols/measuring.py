"""Measuring the three parts through the real pipeline: campaigns, a local worker and the real traincheck package.
``measure_*`` return the records the JSON file stores; ``benchmark_figures`` reads a stored evaluation."""
import re
import time

from core.enums import Variant
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.models import CampaignPurpose, Run, RunStatus
from runners.plans import CampaignPlan, PlannedRun
from runners.selectors import runnable_versions, shown_command
from runners.worker.local import wait_with_local_worker

from ..held_out import public_tables
from ..metrics import AlarmPoint, detected_beyond_clean
from ..overhead import do_measure_overhead
from .protocol import (
    CHECK_SEED,
    DEPLOYED_FOR_OVERHEAD,
    DETECTION_CONFIG,
    DETECTOR,
    FALSE_POSITIVE_CONFIG,
    FOLD_ORDER,
    OVERHEAD_CONFIG,
    OVERHEAD_WORKLOAD,
)
from .relevance import fit_rules, miss_reason, paper_verdict, relevance_of


def failure_line(reason):
    """A run's failure reason as stored here: its first line, without the machine's paths to installed packages."""
    first = reason.splitlines()[0] if reason else ""
    return re.sub(r"/\S*/site-packages/", "", first)[:300]


def _run_summary(run):
    return {"run": run.pk, "status": run.status, "failure_reason": failure_line(run.failure_reason),
            "alarms": run.alarms.count(), "rules_deployed": (run.detector_summary or {}).get("rules_deployed"),
            "rules_failed": (run.detector_summary or {}).get("rules_failed"),
            "models_tracked": (run.detector_summary or {}).get("models_tracked"),
            "processes_traced": (run.detector_summary or {}).get("processes_traced"),
            "wall_seconds": run.wall_seconds, "check_seconds": run.analysis_seconds}


def _plan(runs):
    versions = tuple(dict.fromkeys(run.version for run in runs))
    detectors = tuple(dict.fromkeys(run.detector for run in runs))
    return CampaignPlan(versions, detectors, tuple(dict.fromkeys(run.variant for run in runs)), (CHECK_SEED,), None,
                        tuple(runs))


def _campaign(name, runs, concurrency, write):
    campaign = do_create_campaign(f"traincheck protocols: {name}", _plan(runs), CampaignPurpose.MANUAL,
                                  acting_user=None)
    write(f"Campaign #{campaign.pk} ({name}): {len(runs)} runs.")
    wait_with_local_worker(campaign, write, "traincheck-protocols", concurrency)
    write("")
    return campaign


def measure_runs(bug_ids, folds, concurrency, write):
    """Check the buggy variant of every bug with a relevant relation (each fits on its own fixed variant at another
    seed) and ``folds`` held-out pipelines (each fits on the five others), then the fixed variants against the
    cached per-bug fits. Two campaigns, so that no two runs fit the same thing at once. A bug that no relation can
    state is not run: nothing could count for it. Returns (detection, false positives, campaign IDs)."""
    detection_detector = do_record_detector(DETECTOR, DETECTION_CONFIG)
    fold_detector = do_record_detector(DETECTOR, FALSE_POSITIVE_CONFIG)
    # written to docs/ for everyone: never a held-out bug (evaluation.held_out)
    every_bug = [version for version in (runnable_versions(bug_ids) if bug_ids is None or bug_ids else [])
                 if not version.reproducer.bug.held_out]
    bugs = [version for version in every_bug if relevance_of(version.reproducer.bug.bug_id).matchers]
    pipelines = {version.reproducer.name: version for version in runnable_versions(pipelines=True)}
    held_out = [pipelines[name] for name in FOLD_ORDER if name in pipelines][:folds]
    # the held-out pipelines first: their fits on five pipelines take longest, and two slots finish soonest so
    first = [PlannedRun(version, fold_detector, Variant.FIXED, CHECK_SEED) for version in held_out]
    first += [PlannedRun(version, detection_detector, Variant.BUGGY, CHECK_SEED) for version in bugs]
    unstated = [detection_record(version, None, None) for version in every_bug if version not in bugs]
    if not first:
        return unstated, [], []
    one = _campaign("buggy variants and held-out pipelines", first, concurrency, write)
    campaigns = [one.pk]
    fixed = {}
    if bugs:
        two = _campaign("fixed variants", [PlannedRun(version, detection_detector, Variant.FIXED, CHECK_SEED)
                                           for version in bugs], concurrency, write)
        campaigns.append(two.pk)
        fixed = {run.reproducer_version_id: run for run in two.runs.select_related("fit_artifact")}
    runs = {run.reproducer_version_id: run for run in one.runs.select_related("fit_artifact")}
    detection = [detection_record(version, runs[version.pk], fixed.get(version.pk)) for version in bugs] + unstated
    detection.sort(key=lambda record: record["bug"])
    folds_measured = [fold_record(version, runs[version.pk]) for version in held_out]
    return detection, folds_measured, campaigns


def _alarms(run):
    return [(step, rule) for step, rule in run.alarms.values_list("step", "rule")] if run else []


def detection_record(version, buggy, fixed):
    """One bug under the paper's protocol: the fit, both runs, the relevant alarms and both verdicts (``buggy``
    None: not run)."""
    bug = version.reproducer.bug
    relevance = relevance_of(bug.bug_id)
    measured = (buggy is not None and buggy.status == RunStatus.SUCCEEDED and fixed is not None
                and fixed.status == RunStatus.SUCCEEDED)
    buggy_alarms, fixed_alarms = _alarms(buggy), _alarms(fixed)
    trigger_step = buggy.trigger_step if buggy else None
    detected, rule = paper_verdict(relevance, trigger_step, buggy_alarms, fixed_alarms) if measured else (False, "")
    fixed_rules = {r for _, r in fixed_alarms}
    relevant_buggy = sorted({r for s, r in buggy_alarms if s >= (trigger_step or 0) and relevance.matches(r)})
    relevant_fixed = sorted({r for _, r in fixed_alarms if relevance.matches(r)})
    artifact = buggy.fit_artifact if buggy is not None and buggy.fit_artifact_id else None
    deployed = fit_rules(artifact.content) if artifact else []
    relevant_deployed = [r for r in deployed if relevance.matches(r)]
    record = {
        "bug": bug.bug_id, "reproducer": version.reproducer.name,
        "in_traincheck_evaluation": "TrainCheck" in bug.source,
        "relations": sorted({relation for relation, _ in relevance.matchers}), "about": relevance.about,
        "reason": relevance.reason,
        "status": "measured" if measured else ("not run" if buggy is None else "failed"),
        "trigger_step": trigger_step,
        "fit": {"artifact": artifact.pk if artifact else None, "references": f"{version.reproducer} fixed, seed "
                f"{DETECTION_CONFIG['fit_seed']}", "invariants": len(deployed),
                "by_relation": artifact.summary.get("by_relation", {}) if artifact else {},
                "fit_seconds": artifact.fit_seconds if artifact else None},
        "relevant_in_fit": len(relevant_deployed), "relevant_in_fit_example": relevant_deployed[:1],
        "buggy": _run_summary(buggy) if buggy else None, "fixed": _run_summary(fixed) if fixed else None,
        "relevant_on_buggy": len(relevant_buggy),
        "relevant_on_buggy_not_fixed": len([r for r in relevant_buggy if r not in fixed_rules]),
        "relevant_on_fixed": len(relevant_fixed), "relevant_on_fixed_example": relevant_fixed[:1],
        "detected": detected, "evidence_rule": rule,
        "benchmark_rule_here": measured and detected_beyond_clean(
            trigger_step, [AlarmPoint(step, rule=r) for step, r in buggy_alarms], fixed_rules),
    }
    record["miss_reason"] = miss_reason(record)
    return record


def rejudge(records):
    """The detection records judged again from their runs in this database (after a change of the declared
    relations), running nothing; a record whose runs this database does not hold is kept as it was."""
    judged = []
    for record in records:
        runs = {run.pk: run for run in Run.objects.select_related("fit_artifact", "reproducer_version__reproducer__bug")
                .filter(pk__in=[record[variant]["run"] for variant in ("buggy", "fixed") if record[variant]])}
        buggy = runs.get(record["buggy"]["run"]) if record["buggy"] else None
        if buggy is None:
            judged.append(record)
            continue
        fixed = runs.get(record["fixed"]["run"]) if record["fixed"] else None
        judged.append(detection_record(buggy.reproducer_version, buggy, fixed))
    return judged


def fold_record(version, run):
    """One leave-one-out fold: the held-out pipeline checked against a fit on the other clean pipelines."""
    summary = _run_summary(run)
    failed_rules = sorted({rule for rule in run.alarms.values_list("rule", flat=True)})
    return {"held_out": version.reproducer.name, **summary,
            "references": (run.fit_artifact.summary.get("references", []) if run.fit_artifact_id else []),
            "fit_invariants": (run.fit_artifact.summary.get("invariants") if run.fit_artifact_id else None),
            "fit_seconds": run.fit_artifact.fit_seconds if run.fit_artifact_id else None,
            "deployed": summary["rules_deployed"] or 0, "failed": summary["rules_failed"] or 0,
            "failed_example": failed_rules[:2]}


def measure_overhead(pairs, write):
    """Interleaved plain / TrainCheck pairs on the benchmark's overhead workload (evaluation.overhead), with only
    the 100 best-supported invariants of the workload's leave-one-out fit deployed."""
    workload = next(version for version in runnable_versions(pipelines=True)
                    if version.reproducer.name == OVERHEAD_WORKLOAD)
    detector = do_record_detector(DETECTOR, OVERHEAD_CONFIG)
    write(f"Overhead: {pairs} interleaved pairs on {workload.reproducer}, {DEPLOYED_FOR_OVERHEAD} invariants.")
    campaign, records = do_measure_overhead(workload, [detector], do_record_detector("plain"), pairs, None, write)
    checked = campaign.runs.filter(detector=detector, status=RunStatus.SUCCEEDED).order_by("id")
    deployed = sorted({(run.detector_summary or {}).get("rules_deployed") for run in checked} - {None})
    fitted = next((run.fit_artifact for run in checked if run.fit_artifact_id), None)
    return {**records[0], "campaign": campaign.pk, "workload": str(workload.reproducer), "deployed": deployed,
            "fit_invariants": fitted.summary.get("invariants") if fitted else None,
            "runs": list(checked.values_list("id", flat=True))}


def benchmark_figures(evaluation):
    """TrainCheck's figures in a stored evaluation (the benchmark's protocol), as the third column takes them: written
    to docs/ for everyone, so without the held-out bugs' rows (evaluation.held_out.public_tables)."""
    tables = public_tables(evaluation.tables)
    rows = [row for row in tables.get("detection", []) if row["detector"] == DETECTOR]
    fp = next((row for row in tables.get("false_positives", []) if row["detector"] == DETECTOR), {})
    overhead = next((row for row in tables.get("overhead", []) if row["detector"] == DETECTOR), {})
    fits = [row for row in tables.get("fits", []) if row["detector"] == DETECTOR]
    return {
        "evaluation": evaluation.pk, "stored": evaluation.created_at.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": evaluation.parameters.get("commit", ""),
        "command": shown_command(evaluation.parameters.get("command", ""), None),
        "bugs": len({row["bug"] for row in rows}),
        "beyond_fixed": len({row["bug"] for row in rows if row["detected_beyond_fixed_runs"]}),
        "raw": len({row["bug"] for row in rows if row["detected_runs"]}),
        "per_bug": {row["bug"]: {"buggy_runs": row["buggy_runs"], "detected_runs": row["detected_runs"],
                                 "beyond_fixed_runs": row["detected_beyond_fixed_runs"]} for row in rows},
        "clean_runs": fp.get("clean_runs"), "clean_runs_with_alarm": fp.get("clean_runs_with_alarm"),
        "fp_rate": fp.get("fp_rate"), "per_check_fp_rate": fp.get("per_check_fp_rate"),
        "step_ratio": overhead.get("median_step_time_ratio"),
        "end_to_end_ratio": overhead.get("median_end_to_end_ratio"),
        "overhead_pairs": overhead.get("pairs"),
        "fit_invariants": max((row["invariants"] for row in fits), default=None),
        "fit_references": fits[0]["references"] if fits else "",
    }


def measured_at():
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
