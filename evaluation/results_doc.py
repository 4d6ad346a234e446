"""docs/results.md, rendered from an Evaluation row of the database (never edited by hand)."""
import pandas as pd
from django.utils import timezone

from core.exports import export

from .leaderboard import BASELINE, ranking, standings
from .overhead import OVERHEAD_COLUMNS
from .tables import DETECTION_COLUMNS, FALSE_POSITIVE_COLUMNS, LATENCY_COLUMNS, cell_text

FIT_COLUMNS = ["detector", "references", "invariants", "collect_seconds", "infer_seconds", "fit_seconds", "cached"]


def _table(records, columns=None):
    frame = pd.DataFrame.from_records(records, columns=columns)
    return export(frame, "md") if not frame.empty else "_(none)_\n"


def detection_matrix(records):
    """Bug x detector cells ``detected/buggy`` (plus ``FA`` when the fixed runs alarmed)."""
    detectors = sorted({r["detector"] for r in records})
    cells = {(r["bug"], r["reproducer"], r["detector"]): r for r in records}
    rows = []
    for bug, reproducer in sorted({(r["bug"], r["reproducer"]) for r in records}):
        row = {"bug": f"{bug} ({reproducer})"}
        for detector in detectors:
            cell = cells.get((bug, reproducer, detector))
            if cell is None:
                row[detector] = "–"
                continue
            row[detector] = cell_text(cell)
        rows.append(row)
    return _table(rows, ["bug", *detectors])


def headline(tables):
    """One row per detector, ranked as the leaderboard ranks them (evaluation.leaderboard): by the bugs caught
    beyond the fixed twin, with the raw detections beside it."""
    bugs = len({r["bug"] for r in tables["detection"]})
    found = standings(tables["detection"], tables["false_positives"], tables.get("latency", []), tables["overhead"])
    if not any(r["detector"] == BASELINE for r in tables["detection"]):
        found.pop(BASELINE)
    rows = []
    for standing in ranking(found.values()):
        fp, overhead = standing.false_positives, standing.overhead
        rows.append({
            "rank": standing.rank, "detector": standing.detector,
            "beyond_fixed": f"{standing.beyond_fixed}/{bugs}", "bugs_caught": f"{standing.caught}/{bugs}",
            "fp_rate": fp.get("fp_rate"),
            "fp_95_ci": f"[{fp['fp_ci_low']}, {fp['fp_ci_high']}]" if fp else None,
            "per_check_fp_rate": fp.get("per_check_fp_rate"),
            "median_step_time_ratio": overhead.get("median_step_time_ratio"),
            "median_end_to_end_ratio": overhead.get("median_end_to_end_ratio"),
        })
    return _table(rows)


def render(evaluation):
    tables, parameters = evaluation.tables, evaluation.parameters
    minutes = (evaluation.wall_seconds or 0) / 60
    parts = [
        "# SilentBench results\n",
        f"Generated from evaluation #{evaluation.pk} of {timezone.localtime(evaluation.created_at):%Y-%m-%d %H:%M %Z} "
        f"by `{parameters.get('command', 'manage.py evaluate')}`; do not edit by hand. "
        f"Total wall time {minutes:.1f} min on {parameters.get('host', '?')}; "
        f"campaign #{evaluation.campaign_id}, overhead campaign #{evaluation.overhead_campaign_id}.\n",
        f"Seeds {parameters.get('seeds')}; detectors {', '.join(parameters.get('detectors', []))}; "
        f"{parameters.get('runs', '?')} runs ({parameters.get('failed_runs', '?')} failed, "
        f"{parameters.get('retried_runs', 0)} retried with `manage.py retry_failed`); "
        f"torch {parameters.get('torch', '?')}, traincheck {parameters.get('traincheck', '?')}; "
        f"commit {parameters.get('commit') or 'not recorded'}.\n",
        "Definitions (evaluation/metrics.py): a buggy run is detected by an alarm at or after its trigger step; "
        "earlier alarms and any alarm on a clean run (fixed variants and held-out clean pipelines) are false "
        "alarms. FP intervals are Wilson 95%. Overhead is the median over interleaved plain/instrumented pairs.\n",
        "## Summary\n",
        "Ranked by the bugs caught beyond the fixed twin (a detection whose alarm rule did not also fire on the "
        "fixed variant of the same seed), as on the dashboard's /leaderboard/; `bugs_caught` counts raw detections.\n",
        headline(tables),
        "\n## Detection matrix\n",
        "Cells: detected buggy runs / buggy runs. FA: false alarms on this bug (before the trigger step, or on "
        "its fixed variant). (=fixed): every qualifying alarm's rule also fired on the fixed variant of the same "
        "seed, so the detection does not tell the bug from its fix. `beyond_fixed` in the summary counts the bugs "
        "with at least one alarm rule that the fixed twin did not raise.\n",
        detection_matrix(tables["detection"]),
        "\n## False positives on clean runs\n", _table(tables["false_positives"], FALSE_POSITIVE_COLUMNS),
        "\n## Detection latency\n", _table(tables["latency"], LATENCY_COLUMNS),
        f"\n## Overhead ({parameters.get('overhead_workload', '?')}, {parameters.get('pairs', '?')} pairs)\n",
        _table(tables["overhead"], OVERHEAD_COLUMNS),
        "\n## Fit phase\n", _table(tables.get("fits", []), FIT_COLUMNS),
        "\n## Detection per bug and detector\n", _table(tables["detection"], DETECTION_COLUMNS),
    ]
    return "\n".join(parts)
