"""Evaluation tables built from the database: the same numbers for the page, the API and exports."""
from collections import defaultdict

import pandas as pd

from bugs.models import BugStatus, Track
from core.caching import per_request
from core.enums import ReviewState, Variant
from runners.detectors import all_plugins
from runners.detectors.base import INTEGRATIONS
from runners.detectors.bundle import Bundle, members_of
from runners.models import Alarm, DetectorVersion, Run, RunStatus

from .integrity import ground_truth
from .metrics import AlarmPoint, cell_outcome, detected_beyond_clean, judge_run, median_or_none, wilson_interval

DETECTION_COLUMNS = [
    "bug", "reproducer", "detector", "buggy_runs", "detected_runs", "detection_rate", "detected_beyond_fixed_runs",
    "pre_trigger_false_alarm_runs", "fixed_runs", "fixed_runs_with_alarm",
    "median_latency_steps", "median_latency_seconds", "outcome", "detected_without_fixed_twin_runs",
]
FALSE_POSITIVE_COLUMNS = [
    "detector", "clean_runs", "clean_runs_with_alarm", "fp_rate", "fp_ci_low", "fp_ci_high",
    "alarms_per_1000_clean_steps", "per_check_fp_rate",
]
LATENCY_COLUMNS = [
    "detector", "bugs_detected", "detected_runs", "median_latency_steps", "max_latency_steps",
    "median_latency_seconds", "max_latency_seconds",
]


UNREGISTERED = "not registered"  # the integration of a detector that runs recorded but the registry no longer holds


def integration_of(detector):
    """Whether the detector named ``detector`` is drop-in or opt-in (``runners.detectors.base.INTEGRATIONS``), as its
    plugin declares now, or a submitted detector's newest approved version (read from its code when submitted):
    stored tables carry no label, so every evaluation, old or new, is labelled alike."""
    plugin = all_plugins().get(detector)
    if plugin:
        return plugin.integration
    return submitted_integrations().get(detector, UNREGISTERED)


@per_request
def submitted_integrations():
    """{name: integration} of the submitted detectors, by their newest approved version: asked once per request."""
    found = {}
    for name, interface in (DetectorVersion.objects.filter(builtin=False, review_state=ReviewState.APPROVED)
                            .order_by("name", "-reviewed_at", "-id").values_list("name", "interface")):
        if interface.get("integration") in INTEGRATIONS:
            found.setdefault(name, interface["integration"])
    return found


def by_integration(detectors):
    """[(integration, [detector names])] of ``detectors``: drop-in first, then opt-in, then any no longer registered."""
    order = [*INTEGRATIONS, UNREGISTERED]
    groups = defaultdict(list)
    for name in detectors:
        groups[integration_of(name)].append(name)
    return [(label, groups[label]) for label in order if groups[label]]


def with_integration(frame):
    """A table with a ``detector`` column, with each detector's ``integration`` as its last column (last, so that
    the columns of downloads made before it keep their places)."""
    if "detector" not in frame or "integration" in frame:
        return frame
    return frame.assign(integration=[integration_of(name) for name in frame["detector"]])


def judged_runs(runs):
    """[(run fields, verdict, alarm count)] for succeeded runs, with two queries in all (three where a submitted
    detector's runs take their trusted twins' ground truth: evaluation.integrity.ground_truth). A clean pipeline's
    run is judged as the clean run it is, whether it was presented as fixed or as buggy (a canary); its
    ``presented_as`` says which. A bundle's run (runners.detectors.bundle) is one row per member, with the alarms that
    member raised, as a run of its own would be (``manage.py evaluate --cuda`` bundles its observers)."""
    succeeded = runs.filter(status=RunStatus.SUCCEEDED)
    rows = list(
        succeeded.values(
            "id", "variant", "seed", "steps", "trigger_step", "trigger_time", "manifested", "detector__name",
            "detector__config", "detector_summary",
            "reproducer_version__reproducer__name", "reproducer_version__reproducer__bug__bug_id",
            "reproducer_version__reproducer__bug__status", "reproducer_version_id", "python_environment_id",
            "detector__code__builtin", "reproducer_version__reproducer__track",
        )
    )
    for row in rows:
        row["presented_as"] = row["variant"]
        if row["reproducer_version__reproducer__bug__bug_id"] is None \
                and row["reproducer_version__reproducer__track"] == Track.CATALOG:  # a clean pipeline, not a mutant
            row["variant"] = Variant.FIXED
    ground_truth(rows)
    alarms = defaultdict(list)
    # A subquery, not a list of ids: PostgreSQL joins it (0.5 s for a campaign of 25k runs among 1M alarms,
    # against several seconds for the same ids as 25k literals), and SQLite has no limit on its size.
    for run_id, member, step, time, rule, arrival in Alarm.objects.filter(run__in=succeeded.values("id")).values_list(
            "run_id", "detector", "step", "time", "rule", "arrival_step"):
        alarms[(run_id, member)].append(AlarmPoint(step, time, rule, arrival))
    watched = []
    for row in rows:
        # a bundle without members (none recorded) is judged as its own detector, like any other
        members = members_of(row["detector__name"], row["detector__config"]) or [""]
        watched.extend({**row, "detector__name": member or row["detector__name"], "alarms": alarms[(row["id"], member)],
                        "in_bundle": bool(member)} for member in members)
    return [
        (row, judge_run(row["variant"], row["trigger_step"], row["trigger_time"], row["alarms"], row["steps"] - 1),
         len(row["alarms"]))
        for row in watched
    ]


def _judged(runs, judged):
    """The judged runs given, or those of ``runs`` (default: all runs)."""
    return judged if judged is not None else judged_runs(runs if runs is not None else Run.objects.all())


def _of_bugs(judged):
    return [item for item in judged if item[0]["reproducer_version__reproducer__bug__bug_id"] is not None]


def detection_table(runs=None, judged=None):
    cells = defaultdict(list)
    for row, verdict, _ in _of_bugs(_judged(runs, judged)):
        key = (row["reproducer_version__reproducer__bug__bug_id"], row["reproducer_version__reproducer__name"],
               row["detector__name"])
        cells[key].append((row, verdict))
    records = []
    for (bug, reproducer, detector), judged in sorted(cells.items()):
        buggy = [(row, verdict) for row, verdict in judged if row["variant"] == Variant.BUGGY]
        fixed = [(row, verdict) for row, verdict in judged if row["variant"] == Variant.FIXED]
        detected = [verdict for _, verdict in buggy if verdict.detected]
        fixed_rules = {row["seed"]: {alarm.rule for alarm in row["alarms"]} for row, _ in fixed}
        beyond_fixed = sum(1 for row, _ in buggy if row["seed"] in fixed_rules
                           and detected_beyond_clean(row["trigger_step"], row["alarms"], fixed_rules[row["seed"]],
                                                     row["steps"] - 1))
        # detections that cannot be told from the fix either way: no fixed run of their seed succeeded
        without_twin = sum(1 for row, verdict in buggy if verdict.detected and row["seed"] not in fixed_rules)
        pre_trigger = sum(1 for _, verdict in buggy if verdict.any_false_alarm)
        fixed_alarmed = sum(1 for _, verdict in fixed if verdict.any_false_alarm)
        records.append({
            "bug": bug, "reproducer": reproducer, "detector": detector,
            "buggy_runs": len(buggy), "detected_runs": len(detected),
            "detection_rate": round(len(detected) / len(buggy), 3) if buggy else None,
            "detected_beyond_fixed_runs": beyond_fixed,
            "pre_trigger_false_alarm_runs": pre_trigger,
            "fixed_runs": len(fixed), "fixed_runs_with_alarm": fixed_alarmed,
            "median_latency_steps": median_or_none(v.latency_steps for v in detected),
            "median_latency_seconds": _round(median_or_none(v.latency_seconds for v in detected)),
            "outcome": cell_outcome(len(buggy), len(detected), pre_trigger + fixed_alarmed),
            "detected_without_fixed_twin_runs": without_twin,
        })
    return pd.DataFrame.from_records(records, columns=DETECTION_COLUMNS)


def false_positive_table(runs=None, judged=None):
    """Per detector, over clean runs: fixed variants of bugs and clean reference pipelines (presented as fixed: a
    canary, the same pipeline presented as buggy, serves the integrity check alone, evaluation.integrity, so that
    every detector's rate counts the same runs).

    A fitted detector never runs on a pipeline it was fitted on (runners.detector_versions.fitting), so every clean run
    here is a program not used to fit. ``per_check_fp_rate`` is TrainCheck's per-check rate, for
    detectors that report the rules they deploy: rules failed on clean runs / rules deployed, pooled.
    """
    totals = defaultdict(lambda: {"runs": 0, "alarmed": 0, "alarms": 0, "steps": 0, "deployed": 0, "failed": 0})
    for row, verdict, alarm_count in _judged(runs, judged):
        if row["variant"] != Variant.FIXED or row["presented_as"] != Variant.FIXED:
            continue
        total = totals[row["detector__name"]]
        total["runs"] += 1
        total["alarmed"] += int(verdict.any_false_alarm)
        total["alarms"] += alarm_count
        total["steps"] += row["steps"]
        summary = row["detector_summary"] or {}
        if summary.get("rules_deployed"):
            total["deployed"] += summary["rules_deployed"]
            total["failed"] += summary.get("rules_failed", 0)
    records = []
    for detector, total in sorted(totals.items()):
        low, high = wilson_interval(total["alarmed"], total["runs"])
        records.append({
            "detector": detector, "clean_runs": total["runs"], "clean_runs_with_alarm": total["alarmed"],
            "fp_rate": round(total["alarmed"] / total["runs"], 3), "fp_ci_low": round(low, 3),
            "fp_ci_high": round(high, 3),
            "alarms_per_1000_clean_steps": (round(1000 * total["alarms"] / total["steps"], 2)
                                            if total["steps"] else None),
            "per_check_fp_rate": round(total["failed"] / total["deployed"], 4) if total["deployed"] else None,
        })
    return pd.DataFrame.from_records(records, columns=FALSE_POSITIVE_COLUMNS)


def latency_table(runs=None, judged=None):
    """Per detector, over detected buggy runs: steps and seconds from the trigger to the first alarm."""
    by_detector = defaultdict(lambda: {"bugs": set(), "steps": [], "seconds": []})
    for row, verdict, _ in _of_bugs(_judged(runs, judged)):
        if row["variant"] == Variant.BUGGY and verdict.detected:
            entry = by_detector[row["detector__name"]]
            entry["bugs"].add(row["reproducer_version__reproducer__bug__bug_id"])
            entry["steps"].append(verdict.latency_steps)
            if verdict.latency_seconds is not None:
                entry["seconds"].append(verdict.latency_seconds)
    records = [{
        "detector": detector, "bugs_detected": len(entry["bugs"]), "detected_runs": len(entry["steps"]),
        "median_latency_steps": median_or_none(entry["steps"]), "max_latency_steps": max(entry["steps"]),
        "median_latency_seconds": _round(median_or_none(entry["seconds"])),
        "max_latency_seconds": _round(max(entry["seconds"], default=None)),
    } for detector, entry in sorted(by_detector.items())]
    return pd.DataFrame.from_records(records, columns=LATENCY_COLUMNS)


FLAKINESS_COLUMNS = [
    "bug", "reproducer", "variant", "detector", "seed", "run", "manifested", "expected", "seeds_manifested",
    "verdict", "disagrees_with", "members",  # members: a bundle's (its row's detector is "bundle"), else ""
]
# What a bug's verification verdict says each variant's oracle finds on every seed (bugs.models.BugStatus); a bug
# with another status (flaky, under review, deprecated) expects nothing, and only its seeds are compared.
EXPECTED_MANIFESTED = {
    BugStatus.VERIFIED: {Variant.BUGGY: True, Variant.FIXED: False},
    BugStatus.UNREPRODUCIBLE: {Variant.BUGGY: False},
}


def flakiness_table(runs=None, judged=None):
    """Runs of a bug whose oracle verdict (manifested or not) disagrees with what the bug's verification verdict
    expects, or with its other seeds. A verified bug's buggy variant manifests on every seed and its fixed variant on
    none, an unreproducible bug's buggy variant on none: a run that does otherwise is listed (`disagrees_with`
    "verdict"). For a bug whose verdict expects nothing (flaky, not verified yet, deprecated), every run is listed
    whose reproducer, variant and detector gave different verdicts on different seeds ("seeds").
    `seeds_manifested` counts the runs of that group that manifested; `verdict` is the bug's status when the table
    was made."""
    groups, members = defaultdict(dict), defaultdict(set)
    for row, _, _ in _of_bugs(_judged(runs, judged)):
        if row["manifested"] is not None:  # a bundle's run once, not once per member: its oracle is the run's
            detector = Bundle.name if row.get("in_bundle") else row["detector__name"]
            groups[(row["reproducer_version__reproducer__bug__bug_id"], row["reproducer_version__reproducer__name"],
                    row["variant"], detector)][row["id"]] = row
            if row.get("in_bundle"):
                members[row["id"]].add(row["detector__name"])
    records = []
    for (bug, reproducer, variant, detector), by_run in sorted(groups.items()):
        rows = list(by_run.values())
        verdict = rows[0]["reproducer_version__reproducer__bug__status"]
        expected = EXPECTED_MANIFESTED.get(verdict, {}).get(variant)
        manifested = sum(1 for row in rows if row["manifested"])
        seeds_disagree = 0 < manifested < len(rows)
        for row in sorted(rows, key=lambda r: (r["seed"], r["id"])):
            if expected is None and not seeds_disagree or row["manifested"] == expected:
                continue
            records.append({
                "bug": bug, "reproducer": reproducer, "variant": variant, "detector": detector, "seed": row["seed"],
                "run": row["id"], "manifested": row["manifested"], "expected": expected,
                "seeds_manifested": f"{manifested}/{len(rows)}", "verdict": verdict,
                "disagrees_with": "seeds" if expected is None else "verdict",
                "members": ", ".join(sorted(members[row["id"]])),
            })
    return pd.DataFrame.from_records(records, columns=FLAKINESS_COLUMNS)


RUN_LATENCY_COLUMNS = ["detector", "bug", "reproducer", "seed", "run", "latency_steps", "latency_seconds", "rule"]


def run_latencies(judged):
    """One record per detected buggy run: the points of the latency plot (the latency table's medians
    and maxima are taken over the same runs)."""
    records = [{
        "detector": row["detector__name"], "bug": row["reproducer_version__reproducer__bug__bug_id"],
        "reproducer": row["reproducer_version__reproducer__name"], "seed": row["seed"], "run": row["id"],
        "latency_steps": verdict.latency_steps, "latency_seconds": _round(verdict.latency_seconds),
        "rule": verdict.first_rule,
    } for row, verdict, _ in _of_bugs(judged) if row["variant"] == Variant.BUGGY and verdict.detected]
    records.sort(key=lambda r: (r["detector"], r["bug"], r["reproducer"], r["seed"], r["run"]))
    return pd.DataFrame.from_records(records, columns=RUN_LATENCY_COLUMNS)


def cell_text(cell):
    """A detection matrix cell in words, the same in every table and plot: detected buggy runs / buggy runs,
    "(=fixed)" when no detection is beyond the fixed twin and every qualifying alarm also fired on the fixed twin of a
    detected run, "(no fixed twin)" when no detection is beyond it because no detected run's fixed twin succeeded
    (the detection cannot be told from the fix either way), "(k beyond fixed)" when only k of the detections are,
    "FA" when the detector raised a false alarm on this bug
    (before the trigger step, or on the fixed variant)."""
    text = f"{cell['detected_runs']}/{cell['buggy_runs']}"
    beyond = cell.get("detected_beyond_fixed_runs")
    if cell["detected_runs"] and not beyond:
        text += " (no fixed twin)" if cell.get("detected_without_fixed_twin_runs") == cell["detected_runs"] else (
            " (=fixed)")
    elif beyond is not None and beyond < cell["detected_runs"]:
        text += f" ({beyond} beyond fixed)"  # "3/3 FA" read as three detections where one told the bug from its fix
    if (cell.get("fixed_runs_with_alarm") or 0) + (cell.get("pre_trigger_false_alarm_runs") or 0):
        text += " FA"
    return text


def matrix(detection):
    """Bug x detector pivot of the outcome labels, for the results page."""
    if detection.empty:
        return [], []
    detectors = sorted(detection["detector"].unique())
    rows = []
    for (bug, reproducer), group in detection.groupby(["bug", "reproducer"], sort=True):
        by_detector = {record["detector"]: record for record in group.to_dict("records")}
        rows.append({"bug": bug, "reproducer": reproducer, "cells": [by_detector.get(d) for d in detectors]})
    return detectors, rows


def _round(value, digits=3):
    return None if value is None else round(value, digits)
