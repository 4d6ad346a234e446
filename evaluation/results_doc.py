"""docs/results.md (and docs/results-gpu.md for a GPU evaluation), rendered from an Evaluation row of the database
(never edited by hand)."""
import json

import pandas as pd
from django.conf import settings
from django.utils import timezone

from core.exports import export
from runners.detectors.base import DROP_IN
from runners.selectors import shown_command

from .held_out import public_tables
from .leaderboard import BASELINE, grouped, standings
from .models import Device
from .overhead import OVERHEAD_COLUMNS
from .tables import (
    DETECTION_COLUMNS,
    FALSE_POSITIVE_COLUMNS,
    FLAKINESS_COLUMNS,
    LATENCY_COLUMNS,
    cell_text,
    flakiness_table,
    integration_of,
    with_integration,
)
from .traincheck_protocols.protocol import DATA_FILE as TRAINCHECK_PROTOCOLS_DATA
from .traincheck_protocols.rendering import comparison_table

NO_FLAKINESS = "_No run disagreed: every oracle verdict matched its bug's verification verdict and its other seeds._"
FIT_COLUMNS = ["detector", "references", "invariants", "collect_seconds", "infer_seconds", "fit_seconds", "cached"]


def _table(records, columns=None, empty="_(none)_"):
    frame = with_integration(pd.DataFrame.from_records(records, columns=columns))
    return export(frame, "md") if not frame.empty else f"{empty}\n"


def detection_matrix(records):
    """Bug x detector cells ``detected/buggy`` (plus ``FA`` when the fixed runs alarmed); the header of a detector
    that is not drop-in names its integration."""
    detectors = sorted({r["detector"] for r in records})
    headers = {detector: detector if integration_of(detector) == DROP_IN else f"{detector} ({integration_of(detector)})"
               for detector in detectors}
    cells = {(r["bug"], r["reproducer"], r["detector"]): r for r in records}
    rows = []
    for bug, reproducer in sorted({(r["bug"], r["reproducer"]) for r in records}):
        row = {"bug": f"{bug} ({reproducer})"}
        for detector in detectors:
            cell = cells.get((bug, reproducer, detector))
            row[headers[detector]] = "–" if cell is None else cell_text(cell)
        rows.append(row)
    return _table(rows, ["bug", *headers.values()])


def headline(tables):
    """(drop-in, opt-in): one row per detector, ranked as the leaderboard ranks them (evaluation.leaderboard): by
    the bugs caught beyond the fixed twin, with the raw detections beside it, the opt-in detectors apart. Each count
    is of the bugs with a succeeded buggy run under that detector, as on the leaderboard (a detector whose runs of
    a bug all failed is not scored on it: traincheck's 9/31)."""
    found = standings(tables["detection"], tables["false_positives"], tables.get("latency", []), tables["overhead"])
    found.pop(BASELINE, None)  # the baseline, never ranked (as on the leaderboard)
    return tuple(_headline_rows(group) for group in grouped(found.values()))


def _headline_rows(ranked):
    rows = []
    for standing in ranked:
        fp, overhead = standing.false_positives, standing.overhead
        rows.append({
            "rank": standing.rank, "detector": standing.detector, "integration": standing.integration,
            "beyond_fixed": f"{standing.beyond_fixed}/{standing.bugs}",
            "bugs_caught": f"{standing.caught}/{standing.bugs}",
            "same_rule_as_fixed": _of_detected_runs(standing.same_rule_as_fixed_runs, standing),
            "no_fixed_twin": _of_detected_runs(standing.no_fixed_twin_runs, standing),
            "fp_rate": fp.get("fp_rate"),
            "fp_95_ci": f"[{fp['fp_ci_low']}, {fp['fp_ci_high']}]" if fp else None,
            "per_check_fp_rate": fp.get("per_check_fp_rate"),
            "median_step_time_ratio": overhead.get("median_step_time_ratio"),
            "median_end_to_end_ratio": overhead.get("median_end_to_end_ratio"),
        })
    return _table(rows)


def _of_detected_runs(count, standing):
    """A part of a detector's detected runs, "count/detected runs", or "not split" for an evaluation stored before
    the detection table counted the runs without a fixed twin."""
    return "not split" if count is None else f"{count}/{standing.detected_runs} runs"


def flakiness(evaluation, tables):
    """The flakiness table as stored (``tables``: the evaluation's, held-out bugs left out), or computed from the runs
    for an evaluation that predates it."""
    if "flakiness" in tables:
        return _table(tables["flakiness"], FLAKINESS_COLUMNS, empty=NO_FLAKINESS)
    computed = public_tables({"flakiness": flakiness_table(evaluation.campaign.runs.all()).to_dict("records")})
    return (f"Evaluation #{evaluation.pk} predates this table: computed from its runs as this page was written.\n\n"
            + _table(computed["flakiness"], FLAKINESS_COLUMNS, empty=NO_FLAKINESS))


def traincheck_beside_its_paper():
    """The three-way table of docs/traincheck-paper.md, from the figures ``manage.py traincheck_protocols`` stored."""
    if not TRAINCHECK_PROTOCOLS_DATA.is_file():
        return "_Not measured yet: `manage.py traincheck_protocols` measures it._\n"
    data = json.loads(TRAINCHECK_PROTOCOLS_DATA.read_text(encoding="utf-8"))
    benchmark = data.get("benchmark") or {}
    return (f"Measured by `manage.py traincheck_protocols` on {data.get('measured_at', '?')}; its benchmark column "
            f"reads evaluation #{benchmark.get('evaluation', '?')}. How each column is measured, and every gap with "
            f"its evidence (runs, invariants): [traincheck-paper.md](traincheck-paper.md).\n\n"
            + comparison_table(data))


def results_page(device):
    """Where an evaluation of ``device`` is written by default: docs/results.md, or docs/results-gpu.md."""
    return settings.BASE_DIR / "docs" / ("results-gpu.md" if device == Device.GPU else "results.md")


def render(evaluation):
    """docs/results.md of ``evaluation``: written for everyone, so without the rows of held-out bugs (their runs still
    count in the aggregate tables, as on the results page)."""
    tables, parameters = public_tables(evaluation.tables), evaluation.parameters
    drop_in, opt_in = headline(tables)
    minutes = (evaluation.wall_seconds or 0) / 60
    gpu = evaluation.device == Device.GPU
    parts = [
        "# SilentBench results on a GPU\n" if gpu else "# SilentBench results\n",
        *([f"Where the runs ran: **{evaluation.environment}**, {parameters.get('gpus', '?')} GPU(s), "
           f"{parameters.get('runs_per_gpu', 1)} run(s) at a time on each. The CUDA reproducers of the catalog, "
           "buggy and fixed (the fixed variants are the clean runs), under every detector without a fit phase; "
           + ("every detector in runs of its own (`--apart`). " if parameters.get("apart") else
              "the detectors that only observe watched each run together, in one bundle (each member's alarms kept "
              "apart; for a bug that is a race, a member that waits for the GPU closes the window for all, and the "
              "flakiness table lists such a run under `bundle`), the others in runs of their own. ")
           + "The overhead runs ran one at a time, each detector alone, each timed once against the shared plain "
           f"runs on either side of it (one before every {parameters.get('baseline_every', '?')} detectors and one at "
           "the end). The CPU evaluation is "
           "[results.md](results.md).\n"] if gpu else []),
        (f"Published evaluation **{evaluation.published_id}** (tables digest `{evaluation.tables_digest}`; its "
         f"snapshot `evaluation/published/{evaluation.published_id}.json.gz` ships with the app and "
         "`manage.py load_results` loads it). " if evaluation.published_id else "")
        + f"Generated from evaluation #{evaluation.pk} of "
        f"{timezone.localtime(evaluation.created_at):%Y-%m-%d %H:%M %Z} "
        f"by `{shown_command(parameters.get('command', 'manage.py evaluate'), None)}`; do not edit by hand. "
        f"Total wall time {minutes:.1f} min on {parameters.get('host', '?')}; "
        f"campaign #{evaluation.campaign_id}, overhead campaign #{evaluation.overhead_campaign_id}.\n",
        f"Seeds {parameters.get('seeds')}; detectors {', '.join(parameters.get('detectors', []))}; "
        f"{parameters.get('runs', '?')} runs ({parameters.get('failed_runs', '?')} failed, "
        + (f"{parameters['cancelled_runs']} cancelled, not finished by `--timeout`, "
           if parameters.get("cancelled_runs") else "") +
        f"{parameters.get('retried_runs', 0)} retried with `manage.py retry_failed`); "
        f"torch {parameters.get('torch', '?')}, traincheck {parameters.get('traincheck', '?')}; "
        f"commit {parameters.get('commit') or 'not recorded'}.\n",
        "Definitions (evaluation/metrics.py): a buggy run is detected by an alarm at or after its trigger step; "
        "earlier alarms and any alarm on a clean run (fixed variants and held-out clean pipelines) are false "
        "alarms. FP intervals are Wilson 95%. Overhead is the median over interleaved plain/instrumented pairs.\n",
        "## Summary\n",
        "Drop-in detectors (they observe the unmodified program), ranked by the bugs caught beyond the fixed twin "
        "(a detection whose alarm rule did not also fire on the fixed variant of the same seed), as on the "
        "dashboard's /leaderboard/; `bugs_caught` counts raw detections. Of the detected runs not detected beyond "
        "the fixed twin, `same_rule_as_fixed` counts those whose rules all fired on the fixed run of the same seed, "
        "which succeeded (the detection does not tell the bug from its fix), and `no_fixed_twin` those whose seed "
        "has no successful fixed run (they cannot be told from the fix either way), each of all detected runs.\n",
        drop_in,
        "\n### Opt-in detectors, ranked apart\n",
        "They need the program to cooperate: the reproducer computes a reference and reports it (`compare` "
        "records), so what they catch is the reproducer's help as much as detection, and it is never ranked "
        "against the drop-in detectors above.\n",
        opt_in,
        "\n## Detection matrix\n",
        "Cells: detected buggy runs / buggy runs. FA: false alarms on this bug (before the trigger step, or on "
        "its fixed variant). (=fixed): every qualifying alarm's rule also fired on the fixed variant of the same "
        "seed, so the detection does not tell the bug from its fix. (no fixed twin): no detected run's fixed "
        "variant of the same seed succeeded, so it cannot be told from the fix either way. `beyond_fixed` in the "
        "summary counts the bugs with at least one alarm rule that the fixed twin did not raise.\n",
        detection_matrix(tables["detection"]),
        "\n## False positives on clean runs\n", _table(tables["false_positives"], FALSE_POSITIVE_COLUMNS),
        "\n## Detection latency\n", _table(tables["latency"], LATENCY_COLUMNS),
        f"\n## Overhead ({parameters.get('overhead_workload', '?')}, "
        + (f"each detector once, a shared plain run every {parameters['baseline_every']})\n"
           if parameters.get("baseline_every") else f"{parameters.get('pairs', '?')} pairs)\n"),
        _table(tables["overhead"], OVERHEAD_COLUMNS),
        "\n## Fit phase\n", _table(tables.get("fits", []), FIT_COLUMNS),
        *([] if gpu else ["\n## TrainCheck beside its paper\n", traincheck_beside_its_paper()]),
        "\n## Flakiness\n",
        "Runs whose oracle verdict (manifested or not) disagrees with the bug's verification verdict (a verified "
        "bug manifests on every buggy run and on no fixed one), or, for a bug whose verdict expects nothing, with "
        "the other seeds of the same reproducer, variant and detector (`disagrees_with`: verdict or seeds). A "
        "detector that changes the program can change its verdict too (`detect_anomaly` stops a backward pass that "
        "raised), which is why each run is listed with its detector.\n",
        flakiness(evaluation, tables),
        "\n## Detection per bug and detector\n", _table(tables["detection"], DETECTION_COLUMNS),
    ]
    return "\n".join(parts)
