"""The sensitivity evaluation's tables (sensitivity/__init__.py defines the terms): the mutants' runs labelled by the
noise-calibrated oracle, then each detector's detection rate per operator and per class, its dose-response over
severity with the 50 % and 90 % severities, its latency over severity, and its false alarms on the clean twins.

A mutant's label on a seed comes from its run under ``plain`` (no detector) against the clean pipeline's run of the
same seed under ``plain``; the pipeline's noise from its clean runs under ``plain`` over the calibration seeds. A
detector's run of a mutant counts only where that label says manifested: benign runs are counted apart."""
from collections import defaultdict
from typing import Any

from django.db.models import QuerySet

from core.enums import Variant
from runners.detectors.bundle import Bundle, members_of
from runners.models import Alarm, Run, RunStatus
from sensitivity.oracle import DEFAULT_QUANTILE, Calibration, calibrate, judge, outcomes, tolerances

from .metrics import AlarmPoint, detected_beyond_clean, judge_run, median_or_none, wilson_interval

BASELINE = "plain"
MUTANT = "reproducer_version__reproducer__mutant__"
TABLES = ("labels", "by_operator", "by_class", "dose_response", "thresholds", "latency", "clean_false_alarms",
          "calibration", "failed_runs")


def detector_label(name: str, builtin: bool | None) -> str:
    """A detector's name in the tables: a submitted one is marked, since it may share a built-in's name."""
    return name if builtin in (True, None) else f"{name} (submitted)"


def run_rows(runs: QuerySet[Run]) -> list[dict[str, Any]]:
    """The succeeded runs of a sensitivity campaign as plain rows, with their alarms and outcomes: a bundle's run
    (runners.detectors.bundle) as one row per member, with the alarms that member raised."""
    succeeded = runs.filter(status=RunStatus.SUCCEEDED)
    rows = list(succeeded.values(
        "id", "variant", "seed", "steps", "trigger_step", "oracle_evidence", "detector__name", "detector__config",
        "detector__code__builtin",
        "reproducer_version__reproducer__name", f"{MUTANT}mutant_id", f"{MUTANT}operator", f"{MUTANT}fault_class",
        f"{MUTANT}severity", f"{MUTANT}severity_level", f"{MUTANT}persistence", f"{MUTANT}pipeline__name"))
    alarms = defaultdict(list)
    for run_id, member, step, time, rule, arrival in Alarm.objects.filter(run__in=succeeded.values("id")).values_list(
            "run_id", "detector", "step", "time", "rule", "arrival_step"):
        alarms[(run_id, member)].append(AlarmPoint(step, time, rule, arrival))
    plain = []
    for row in rows:
        mutant = row[f"{MUTANT}mutant_id"]
        plain.extend({
            "mutant": mutant, "pipeline": row[f"{MUTANT}pipeline__name"] if mutant
            else row["reproducer_version__reproducer__name"],
            "operator": row[f"{MUTANT}operator"], "fault_class": row[f"{MUTANT}fault_class"],
            "severity": row[f"{MUTANT}severity"], "severity_level": row[f"{MUTANT}severity_level"],
            "persistence": row[f"{MUTANT}persistence"], "detector": detector, "seed": row["seed"],
            "variant": Variant.BUGGY if mutant and row["variant"] == Variant.BUGGY else Variant.FIXED,
            "trigger_step": row["trigger_step"], "last_step": row["steps"] - 1, "alarms": alarms[(row["id"], member)],
            "outcomes": outcomes(row["oracle_evidence"] or {}), "tolerances": tolerances(row["oracle_evidence"] or {}),
        } for detector, member in watchers(row))
    return plain


def watchers(row: dict[str, Any]) -> list[tuple[str, str]]:
    """[(the detector's name in the tables, the name its alarms carry)] of a run's row: a bundle's members, or the
    run's own detector (whose alarms carry none)."""
    if row["detector__name"] == Bundle.name:
        return [(member, member) for member in members_of(row["detector__name"], row["detector__config"])]
    return [(detector_label(row["detector__name"], row["detector__code__builtin"]), "")]


def failed_runs(runs: QuerySet[Run]) -> list[dict[str, Any]]:
    """The runs that failed, per detector (each member of a failed bundle's run) and kind of failure: they count in
    no other table, so a detector that crashes the program it watches (detect_anomaly on DDP, after a NaN) is seen
    here, not as missed faults."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in runs.filter(status=RunStatus.FAILED).values(
            "detector__name", "detector__config", "detector__code__builtin", "failure_kind", f"{MUTANT}mutant_id"):
        for detector, _ in watchers(row):
            counted = counts[(detector, row["failure_kind"] or "unknown")]
            counted[0] += 1
            counted[1] += bool(row[f"{MUTANT}mutant_id"])
    return [{"detector": detector, "failure_kind": kind, "runs": total, "mutant_runs": mutant_runs}
            for (detector, kind), (total, mutant_runs) in sorted(counts.items())]


def calibrations(rows: list[dict[str, Any]], quantile: float = DEFAULT_QUANTILE) -> dict[str, Calibration]:
    """Each pipeline's noise, from its clean runs under ``plain`` (one per seed)."""
    clean, floors = defaultdict(dict), defaultdict(dict)
    for row in rows:
        if row["mutant"] is None and row["detector"] == BASELINE:
            clean[row["pipeline"]][row["seed"]] = row["outcomes"]
            floors[row["pipeline"]].update(row["tolerances"])
    return {pipeline: calibrate(by_seed, quantile, floors[pipeline]) for pipeline, by_seed in sorted(clean.items())
            if len(by_seed) >= 3}


def labels(rows: list[dict[str, Any]], calibration: dict[str, Calibration]) -> dict[tuple[str, int], Any]:
    """{(mutant, seed): Verdict} from the mutant's buggy run under ``plain`` and its twin's."""
    twins = {(row["pipeline"], row["seed"]): row["outcomes"] for row in rows
             if row["mutant"] is None and row["detector"] == BASELINE}
    found = {}
    for row in rows:
        if row["mutant"] and row["detector"] == BASELINE and row["variant"] == Variant.BUGGY:
            twin = twins.get((row["pipeline"], row["seed"]))
            if twin is not None and row["pipeline"] in calibration:
                found[(row["mutant"], row["seed"])] = judge(row["outcomes"], twin, calibration[row["pipeline"]])
    return found


def _rate(caught: int, manifested: int) -> dict[str, Any]:
    low, high = wilson_interval(caught, manifested)
    return {"manifested": manifested, "caught": caught, "rate": round(caught / manifested, 4) if manifested else None,
            "ci_low": round(low, 4), "ci_high": round(high, 4)}


def judged_mutant_runs(rows: list[dict[str, Any]], verdicts: dict[tuple[str, int], Any]) -> list[dict[str, Any]]:
    """Every detector's run of a mutant (``plain`` aside), with its label and whether it caught the fault in time."""
    twin_rules = {(row["pipeline"], row["detector"], row["seed"]): {alarm.rule for alarm in row["alarms"]}
                  for row in rows if row["mutant"] is None}
    judged = []
    for row in rows:
        if not row["mutant"] or row["variant"] != Variant.BUGGY or row["detector"] == BASELINE:
            continue
        verdict = verdicts.get((row["mutant"], row["seed"]))
        run = judge_run(Variant.BUGGY, row["trigger_step"], None, row["alarms"], row["last_step"])
        # caught beyond the clean twin: an alarm whose rule the detector also raised on the clean twin of the same
        # seed tells the fault from nothing (evaluation.metrics.detected_beyond_clean)
        caught = run.detected and detected_beyond_clean(
            row["trigger_step"], row["alarms"], twin_rules.get((row["pipeline"], row["detector"], row["seed"]), set()),
            row["last_step"])
        judged.append({**row, "label": None if verdict is None else "manifested" if verdict.manifested else "benign",
                       "caught": caught, "latency_steps": run.latency_steps})
    return judged


def grouped_rates(judged: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    groups: dict[tuple, dict[str, int]] = defaultdict(lambda: {"manifested": 0, "caught": 0, "benign": 0})
    for row in judged:
        counts = groups[tuple(row[key] for key in keys)]
        if row["label"] == "benign":
            counts["benign"] += 1
        elif row["label"] == "manifested":
            counts["manifested"] += 1
            counts["caught"] += row["caught"]
    return [{**dict(zip(keys, key)), **_rate(counts["caught"], counts["manifested"]), "benign_runs": counts["benign"]}
            for key, counts in sorted(groups.items(), key=lambda item: tuple(str(part) for part in item[0]))]


def severity_thresholds(dose: list[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """For each detector and ``group`` (an operator or a class): the lowest severity level whose detection rate
    reaches 0.5 and 0.9 (None where it never does)."""
    curves = defaultdict(list)
    for row in dose:
        curves[(row["detector"], row[group])].append(row)
    found = []
    for (detector, name), points in sorted(curves.items()):
        levels = sorted((point for point in points if point["manifested"]), key=lambda point: point["severity_level"])

        def first(share, levels=levels):
            return next((point["severity_level"] for point in levels if point["rate"] >= share), None)

        found.append({"detector": detector, group: name, "severity_50": first(0.5), "severity_90": first(0.9)})
    return found


def sensitivity_tables(runs: QuerySet[Run], quantile: float = DEFAULT_QUANTILE) -> dict[str, list[dict[str, Any]]]:
    """Every table of the sensitivity evaluation, as lists of rows (TABLES)."""
    rows = run_rows(runs)
    calibration = calibrations(rows, quantile)
    verdicts = labels(rows, calibration)
    judged = judged_mutant_runs(rows, verdicts)
    dose = grouped_rates(judged, ("detector", "fault_class", "severity_level"))
    latency: dict[tuple, list[int]] = defaultdict(list)
    for row in judged:
        if row["label"] == "manifested" and row["caught"]:
            latency[(row["detector"], row["fault_class"], row["severity_level"])].append(row["latency_steps"])
    clean: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        if row["mutant"] is None and row["detector"] != BASELINE:
            counts = clean[(row["detector"], row["pipeline"])]
            counts[0] += 1
            counts[1] += bool(row["alarms"])
    return {
        "labels": [{"mutant": mutant, "seed": seed, "manifested": verdict.manifested, "summary": verdict.summary,
                    "moved": [item["outcome"] for item in verdict.moved]}
                   for (mutant, seed), verdict in sorted(verdicts.items())],
        "by_operator": grouped_rates(judged, ("detector", "fault_class", "operator")),
        "by_class": grouped_rates(judged, ("detector", "fault_class")),
        "dose_response": dose,
        "thresholds": severity_thresholds(dose, "fault_class"),
        "latency": [{"detector": detector, "fault_class": fault_class, "severity_level": level,
                     "caught_runs": len(steps), "median_latency_steps": median_or_none(steps)}
                    for (detector, fault_class, level), steps in sorted(latency.items())],
        "clean_false_alarms": [{"detector": detector, "pipeline": pipeline, "clean_runs": total,
                                "runs_with_alarm": alarmed, **dict(zip(("ci_low", "ci_high"), (
                                    round(bound, 4) for bound in wilson_interval(alarmed, total))))}
                               for (detector, pipeline), (total, alarmed) in sorted(clean.items())],
        "calibration": [{"pipeline": pipeline, **entry.as_dict()} for pipeline, entry in calibration.items()],
        "failed_runs": failed_runs(runs),
    }


NEVER_REACHED = {"severity_50", "severity_90"}  # None there: the rate never reached the share
WHOLE_NUMBERS = {"severity_level", "manifested", "caught", "benign_runs", "caught_runs",
                 "clean_runs", "runs_with_alarm", "seed", "pairs", "runs", "mutant_runs"}
EXPORTED = {  # table -> what its caption says
    "by_class": "Detection per detector and fault class: manifested mutant runs caught in time, Wilson 95 % interval",
    "by_operator": "Detection per detector and fault operator: manifested mutant runs caught in time",
    "dose_response": "Dose-response: detection per detector, fault class and severity level",
    "thresholds": "The lowest severity level at which each detector catches 50 % and 90 % of the manifested runs",
    "latency": "Median latency in steps from the trigger step, per detector, fault class and severity level",
    "clean_false_alarms": "Clean twins: runs with an alarm per detector and pipeline",
    "labels": "Each mutant run's label by the noise-calibrated oracle, and which outcome moved",
    "failed_runs": "Runs that failed, per detector and kind of failure (counted in no other table)",
}


def sensitivity_export(evaluation: Any, table: str) -> Any:
    """One stored table of a sensitivity evaluation as a ``core.exports.Table`` (CSV, Markdown, LaTeX, JSON)."""
    import pandas as pd

    from core.exports import Table

    rows = [{name: "never" if name in NEVER_REACHED and value is None else value for name, value in row.items()}
            for row in evaluation.tables.get(table) or []]
    frame = pd.DataFrame(rows)
    if table == "labels" and not frame.empty:
        frame["moved"] = frame["moved"].map(", ".join)
    for column in WHOLE_NUMBERS.intersection(frame.columns):  # whole beside a missing one (a severity never reached)
        frame[column] = frame[column].astype("Int64")
    return Table(f"sensitivity-{table}", frame,
                 caption=f"{EXPORTED[table]} (SilentBench sensitivity evaluation #{evaluation.pk}).",
                 note="Mutants are not real bugs; benign runs (no outcome moved beyond the clean seed-to-seed "
                      "spread) count neither as caught nor as missed.")


def markdown_report(evaluation: Any) -> str:
    """docs/results-sensitivity.md: the stored evaluation's parameters and every table, as Markdown."""
    parameters, tables = evaluation.parameters, evaluation.tables
    benign = sum(not label["manifested"] for label in tables["labels"])
    lines = [
        "# SilentBench sensitivity results\n",
        f"Generated by `manage.py evaluate_sensitivity` from sensitivity evaluation #{evaluation.pk} "
        f"({evaluation.created_at:%Y-%m-%d %H:%M} UTC); do not edit by hand. The definitions are in "
        "[methodology.md](methodology.md#the-sensitivity-track), the operators in "
        "[writing-a-fault-operator.md](writing-a-fault-operator.md). Mutants are not real bugs: the real-bug results "
        "([results.md](results.md)) stay the headline.\n",
        f"- command: `{parameters.get('command', '')}`",
        f"- {parameters.get('mutants')} mutants, {parameters.get('seeds')} seeds, "
        f"{parameters.get('calibration_seeds')} calibration seeds, quantile {parameters.get('quantile')}, "
        f"{parameters.get('steps')} steps a run",
        f"- {parameters.get('runs')} runs ({parameters.get('failed_runs', 0)} failed), wall time "
        f"{(evaluation.wall_seconds or 0) / 60:.1f} min; host {parameters.get('host')}, "
        f"torch {parameters.get('torch')}, commit {parameters.get('commit')}",
        f"- {len(tables['labels'])} mutant runs labelled under `plain`: {benign} benign, "
        f"{len(tables['labels']) - benign} manifested\n",
    ]
    for table, caption in EXPORTED.items():
        if table == "labels":
            continue
        rows = tables.get(table) or []
        lines += [f"## {caption}\n",
                  sensitivity_export(evaluation, table).text("md") + "\n" if rows else "No rows.\n"]
    return "\n".join(lines)


def leaderboard_sensitivity() -> tuple[Any, dict[str, dict[str, Any]]]:
    """(the latest sensitivity evaluation or None, {detector: its leaderboard cell}): the share of manifested mutant
    runs it caught, over every class, and the bit flip it catches half of (the hardware class's 50 % severity, named
    by the bit), kept apart from the real-bug ranking."""
    from sensitivity.mutants import load_operator

    from .models import SensitivityEvaluation

    evaluation = SensitivityEvaluation.objects.only("pk", "tables", "parameters").first()
    if evaluation is None:
        return None, {}
    bits = [label for label, _ in load_operator("bitflip_weight").severities]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in evaluation.tables.get("by_class", []):
        totals[row["detector"]][0] += row["caught"]
        totals[row["detector"]][1] += row["manifested"]
    half = {row["detector"]: row["severity_50"] for row in evaluation.tables.get("thresholds", [])
            if row["fault_class"] == "hardware"}
    cells = {}
    for detector, (caught, manifested) in totals.items():
        level = half.get(detector)
        cells[detector] = {**_rate(caught, manifested),
                           "bitflip_50": bits[level - 1] if level and level <= len(bits) else None}
    return evaluation, cells


def entry_sensitivity(version: Any, evaluation: Any, cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sensitivity cell of one detector version on the open leaderboard ({} when the track did not run it): a
    built-in's if the evaluation ran its code, a submitted version's only if it ran that very version, marked unverified
    (its code could read the mutant's files, and the track has no canaries: sensitivity/__init__.py)."""
    if evaluation is None:
        return {}
    if version.builtin:
        ran = evaluation.parameters.get("code", {}).get(version.name)
        return cells.get(version.name, {}) if ran in (None, version.code_hash) else {}
    if f"{version.name} {version.version}" in evaluation.parameters.get("submitted", []):
        cell = cells.get(detector_label(version.name, False))
        return {**cell, "unverified": True} if cell else {}
    return {}
