"""The results as downloads and ``manage.py export``: the tables of ``evaluation.results`` in long form, the bug x
detector matrix as the results page shows it (``tables.matrix``, ``tables.cell_text``) and the leaderboard
(``leaderboard.build_leaderboard``). Each carries its LaTeX layout and a caption that says what it shows and which
runs are behind it: the evaluation or campaign, the seeds and the environment."""
import pandas as pd

from core.exports import Table
from runners.detectors.base import DROP_IN

from .citation import caption_citation
from .leaderboard import SELECTION, build_leaderboard
from .results import TABLES, Results
from .tables import cell_text, matrix

PAPER_TABLES = ("matrix", "leaderboard")
EXPORT_TABLES = (*TABLES, *PAPER_TABLES)


class InvalidFilter(ValueError):
    """The query's filter does not validate, or filters a table that takes none."""


# What each table shows (the start of its caption) and its LaTeX headers: column -> header (the Wilson interval's
# columns keep their names: LaTeX prints them as one cell, WILSON).
ABOUT = {
    "detection": "Detection per bug, reproducer and detector: buggy runs, those detected (an alarm at or after the "
                 "trigger step) and their rate, detections whose alarm rule did not also fire on the fixed variant of "
                 "the same seed (beyond fixed), buggy runs with a false alarm before the trigger, fixed runs and those "
                 "with an alarm, the median latency from the trigger to the first alarm, the matrix outcome, and "
                 "(but in LaTeX, where the matrix says it) the detected runs without a fixed twin (no fixed run of "
                 "their seed succeeded, so they cannot be told from the fix).",
    "false-positives": "False positives per detector on clean runs (fixed variants of the bugs and held-out clean "
                       "pipelines): runs with an alarm, their rate with its Wilson 95% interval, alarms per 1,000 "
                       "clean steps, and the per-check rate of detectors that report their rules (rules failed on "
                       "clean runs / rules deployed).",
    "latency": "Detection latency per detector over its detected buggy runs: steps and seconds from the trigger step "
               "to the first alarm, median and maximum.",
    "overhead": "Overhead per detector on one clean workload: median ratios of instrumented to plain over interleaved "
                "pairs, per training step and end to end (the offline check included), the median step times, the "
                "offline check and the fit.",
    "matrix": "Detection per bug and detector: buggy runs detected / buggy runs. FA: a false alarm on this bug (before "
              "the trigger step, or on its fixed variant). (=fixed): every qualifying alarm rule also fired on the "
              "fixed variant of the same seed, so the detection does not tell the bug from its fix. (no fixed twin): "
              "no detected run's fixed variant of the same seed succeeded, so the detection cannot be told from the "
              "fix either way. --: not run.",
    "leaderboard": "Detectors ranked by the bugs they caught beyond the fixed twin (an alarm at or after the trigger "
                   "step whose rule did not also fire on the fixed variant of the same seed), of the bugs they ran "
                   "on; then the bugs caught at all, the false-positive rate per clean run with its Wilson 95% "
                   "interval, the per-check rate (rules failed on clean runs / rules deployed), the median latency "
                   "in steps and the median step-time ratio to plain. Of the detected runs not detected beyond the "
                   "fixed twin, same rule on fixed: its rules all fired on the fixed run of the same seed, which "
                   "succeeded (the detection does not tell the bug from its fix); no fixed twin: no fixed run of "
                   "that seed succeeded (it cannot be told from the fix either way); each of the detected runs, "
                   "blank when a stored evaluation predates the split. Drop-in detectors observe the unmodified "
                   "program and are ranked first; opt-in detectors need the program's cooperation (the reproducer "
                   "computes a reference for them) and are ranked apart, below.",
    "flakiness": "Runs of a bug whose oracle verdict (manifested or not) disagrees with the bug's verification verdict "
                 "(a verified bug manifests on every buggy run and on no fixed one; an unreproducible bug on no buggy "
                 "run), or, for a bug whose verdict expects nothing, with other seeds of the same reproducer, variant "
                 "and detector; the seeds of that group that manifested.",
}
# The caption's first words: what the table is, in one line (the definitions go in the note under it, ABOUT).
CAPTIONS = {
    "detection": "Detection per bug, reproducer and detector.",
    "false-positives": "False positives per detector on clean runs.",
    "latency": "Detection latency per detector.",
    "overhead": "Overhead per detector.",
    "matrix": "Detection matrix: buggy runs detected / buggy runs, per bug and detector.",
    "leaderboard": "Detectors ranked by the bugs they caught beyond the fixed twin.",
    "flakiness": "Runs that disagree with the verification verdict of their bug.",
}
# The leaderboard's blocks in LaTeX, as on the page: every detector that is not drop-in (opt-in, or no longer
# registered) is ranked apart, below (evaluation.leaderboard.grouped).
LEADERBOARD_GROUPS = {"drop-in": "Drop-in detectors (they observe the unmodified program)",
                      "apart": "Ranked apart: opt-in detectors (the reproducer computes their reference) and any no "
                               "longer registered",
                      "baseline": "Baseline: plain, no detector (not ranked)"}
HEADERS = {
    "detection": {
        "bug": "bug", "reproducer": "reproducer", "detector": "detector", "buggy_runs": "buggy runs",
        "detected_runs": "detected runs", "detection_rate": "rate", "detected_beyond_fixed_runs": "beyond fixed",
        "pre_trigger_false_alarm_runs": "FA before trigger", "fixed_runs": "fixed runs",
        "fixed_runs_with_alarm": "fixed with alarm", "median_latency_steps": "latency (steps)",
        "median_latency_seconds": "latency (s)", "outcome": "outcome",
    },
    "false-positives": {
        "detector": "detector", "clean_runs": "clean runs", "clean_runs_with_alarm": "with alarm", "fp_rate": "FP rate",
        "alarms_per_1000_clean_steps": "alarms / 1,000 steps", "per_check_fp_rate": "per-check FP rate",
    },
    "latency": {
        "detector": "detector", "bugs_detected": "bugs detected", "detected_runs": "detected runs",
        "median_latency_steps": "median steps", "max_latency_steps": "max steps",
        "median_latency_seconds": "median (s)", "max_latency_seconds": "max (s)",
    },
    "overhead": {
        "detector": "detector", "pairs": "pairs", "pairs_planned": "planned", "median_step_time_ratio": "step ratio",
        "median_end_to_end_ratio": "end-to-end ratio", "median_plain_step_ms": "plain step (ms)",
        "median_step_ms": "step (ms)", "median_check_seconds": "check (s)", "fit_seconds": "fit (s)",
    },
}
WILSON = {"Wilson 95% CI": ("fp_ci_low", "fp_ci_high")}
# LaTeX layouts other than the default (core.exports.Table): a long bug ID breaks at its hyphens
LAYOUTS = {
    "detection": {"align": {"bug": "p{2.4cm}"}, "turned": ("reproducer",)},
    "flakiness": {"align": {"bug": "p{3.2cm}"}},
    "false-positives": {"intervals": WILSON},
}


def results_export(name, query, user=None):
    """The export ``name`` (one of EXPORT_TABLES) of the runs ``query`` selects, as ``user`` may see them: NotFound
    (evaluation.results) for an evaluation or campaign that does not exist, InvalidFilter for a bad filter."""
    if name == "leaderboard":
        filters = sorted(key for key, value in query.items() if value and key not in SELECTION)
        if filters:
            raise InvalidFilter(f"the leaderboard takes only {' or '.join(SELECTION)}, not {', '.join(filters)}.")
        return leaderboard_export(build_leaderboard(query, user))
    results = Results(query, user)
    if results.errors:
        raise InvalidFilter(results.errors.as_text())
    runs = runs_described(results)
    if name == "matrix":
        return matrix_export(results.table("detection"), f"{CAPTIONS['matrix']} {source_of(results)}", runs)
    frame = results.table(name)
    # the paper's page has no room for the integration column (the leaderboard's groups say it) nor, in the detection
    # table, for the runs without a fixed twin (the matrix's "(no fixed twin)" and the leaderboard count them)
    paper = (flakiness_paper(frame) if name == "flakiness"
             else frame.drop(columns=["integration", "detected_without_fixed_twin_runs"], errors="ignore")
             .rename(columns=HEADERS[name]))
    return Table(name, frame, caption=f"{CAPTIONS[name]} {source_of(results)}", note=f"{ABOUT[name]} {runs}",
                 paper=paper, **LAYOUTS.get(name, {}))


def flakiness_paper(frame):
    """The flakiness table narrow enough for a paper's page: one column per question."""
    return pd.DataFrame({
        "bug": [f"{bug} ({reproducer})" for bug, reproducer in zip(frame["bug"], frame["reproducer"])],
        "detector": frame["detector"], "variant": frame["variant"], "seed": frame["seed"], "run": frame["run"],
        "manifested / expected": [f"{_yes_no(got)} / {_yes_no(want)}"
                                  for got, want in zip(frame["manifested"], frame["expected"])],
        "disagrees with": [f"verdict ({verdict})" if why == "verdict" else f"seeds ({seeds})"
                           for why, verdict, seeds in zip(frame["disagrees_with"], frame["verdict"],
                                                          frame["seeds_manifested"])],
    }, dtype=object)


def _yes_no(value):
    return "--" if value is None else "yes" if value else "no"


def matrix_export(detection, caption, runs):
    """The results page's matrix: a row per bug and reproducer, a column per detector, ``cell_text`` in each cell."""
    detectors, rows = matrix(detection)
    frame = pd.DataFrame([[row["bug"], row["reproducer"], *(cell and cell_text(cell) for cell in row["cells"])]
                          for row in rows], columns=["bug", "reproducer", *detectors], dtype=object)
    return Table("matrix", frame, caption=caption, note=f"{ABOUT['matrix']} {runs}", paper=frame,
                 align=dict.fromkeys(detectors, "c"), turned=("reproducer", *detectors))


LEADERBOARD_COLUMNS = [
    "rank", "detector", "integration", "bugs", "beyond_fixed", "caught", "detected_runs", "same_rule_as_fixed_runs",
    "no_fixed_twin_runs", "fp_rate", "fp_ci_low", "fp_ci_high", "per_check_fp_rate",
    "median_latency_steps", "median_latency_seconds", "median_step_time_ratio", "median_end_to_end_ratio",
]


def leaderboard_export(board):
    """The leaderboard page's tables in the page's order: the drop-in detectors, the opt-in ones (ranked apart), then
    the baseline (rank "baseline")."""
    baseline = board.baseline
    # the baseline's row when the selection ran it on bugs or clean programs (an evaluation runs plain only for the
    # overhead pairs, which make no row of their own)
    shown = [("baseline", baseline)] if baseline and (baseline.bugs or baseline.false_positives) else []
    standings = [*((standing.rank, standing) for standing in [*board.ranked, *board.opt_in]), *shown]
    frame = pd.DataFrame([[
        rank, standing.detector, standing.integration, standing.bugs, standing.beyond_fixed, standing.caught,
        standing.detected_runs, standing.same_rule_as_fixed_runs, standing.no_fixed_twin_runs,
        *(standing.false_positives.get(key) for key in ("fp_rate", "fp_ci_low", "fp_ci_high", "per_check_fp_rate")),
        *(standing.latency.get(key) for key in ("median_latency_steps", "median_latency_seconds")),
        *(standing.overhead.get(key) for key in ("median_step_time_ratio", "median_end_to_end_ratio")),
    ] for rank, standing in standings], columns=LEADERBOARD_COLUMNS, dtype=object)

    def of_bugs(column):
        return [f"{count}/{bugs}" if bugs else None for count, bugs in zip(frame[column], frame["bugs"])]

    def of_detected_runs(column):
        return [f"{count}/{detected}" if detected and count is not None else None
                for count, detected in zip(frame[column], frame["detected_runs"])]

    paper = pd.DataFrame({
        "rank": frame["rank"], "detector": frame["detector"], "integration": frame["integration"],
        "beyond fixed": of_bugs("beyond_fixed"), "caught": of_bugs("caught"),
        "same rule on fixed": of_detected_runs("same_rule_as_fixed_runs"),
        "no fixed twin": of_detected_runs("no_fixed_twin_runs"),
        "FP rate": frame["fp_rate"], "fp_ci_low": frame["fp_ci_low"],
        "fp_ci_high": frame["fp_ci_high"], "per-check FP": frame["per_check_fp_rate"],
        "latency (steps)": frame["median_latency_steps"], "step-time ratio": frame["median_step_time_ratio"],
    })
    groups = [LEADERBOARD_GROUPS["baseline" if rank == "baseline" else "drop-in" if integration == DROP_IN else "apart"]
              for rank, integration in zip(frame["rank"], frame["integration"])]
    return Table("leaderboard", frame, paper=paper.drop(columns=["integration"]), intervals=WILSON, groups=groups,
                 align={"rank": "r", "beyond fixed": "r", "caught": "r", "same rule on fixed": "r",
                        "no fixed twin": "r"},
                 caption=f"{CAPTIONS['leaderboard']} {source_of(board.results)}",
                 note=" ".join([ABOUT["leaderboard"], *(["plain runs without a detector: the baseline, not ranked."]
                                                        if shown else []), runs_described(board.results)]))


def source_of(results):
    """The caption's second line: the evaluation cited (ID, date, commit, environment, tables digest), or that the
    numbers are live."""
    if results.evaluation is not None:
        return caption_citation(results.evaluation) + "."
    if results.campaign_id is not None:
        return f"Live tables of SilentBench campaign #{results.campaign_id}, not a stored evaluation."
    return "Live numbers over every SilentBench run: no evaluation is stored, not a result to cite."


def runs_described(results):
    """Which runs a table covers, for its caption: the evaluation or campaign, the filter, seeds and environment."""
    summary = results.runs_summary()
    if results.evaluation is not None:
        evaluation = results.evaluation
        selection = (f"SilentBench evaluation {evaluation.label} of {evaluation.created_at:%Y-%m-%d} "
                     f"(campaign #{evaluation.campaign_id}; tables digest {evaluation.tables_digest[:8]})")
    elif results.campaign_id is not None:
        selection = f"the runs of SilentBench campaign #{results.campaign_id} (live tables, not a stored evaluation)"
    else:
        selection = "every SilentBench run (no evaluation is stored: live numbers, not a result to cite)"
    criteria = results.criteria
    narrowed = [
        *([f"detectors {', '.join(criteria.detectors)}"] if criteria.detectors else []),
        *([f"bugs {', '.join(criteria.bugs)}"] if criteria.bugs else []),
        *([f"framework {criteria.framework}"] if criteria.framework else []),
        *([f"fault in {criteria.fault_location}"] if criteria.fault_location else []),
        *([f"matrix outcome {criteria.outcome}"] if criteria.outcome else []),
    ]
    seeds = ", ".join(map(str, summary["seeds"])) or "none"
    environment = [f"torch {', '.join(summary['torch']) or 'not recorded'}"]
    if results.evaluation is not None and results.evaluation.parameters.get("traincheck"):
        environment.append(f"traincheck {results.evaluation.parameters['traincheck']}")
    return (f"Runs: {selection}{'; only ' + '; '.join(narrowed) if narrowed else ''}; "
            f"seed{'s' if len(summary['seeds']) != 1 else ''} {seeds}; "
            f"{', '.join(environment)}.")
