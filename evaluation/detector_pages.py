"""A detector's page (/detectors/<name>/): what it is (description, integration, default config, where it is
documented), its code (the versions the reader may see, with their hashes), how it fares in the latest stored
evaluation (its leaderboard row, the bugs it caught and missed, its false alarms) and its standing over every stored
evaluation the reader may see (a history plot)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

from core.charts import LAYOUT, PALETTE, Chart, as_dict, label
from runners.detectors import all_plugins
from runners.models import Detector

from .entries import detector_history
from .leaderboard import Leaderboard, Standing, build_leaderboard
from .models import Device
from .results import evaluations_for, latest_evaluation, results_viewer

HISTORY_EVALUATIONS = 20  # the newest stored evaluations its history plot reads


@dataclass
class DetectorPage:
    name: str
    plugin: Any  # the registered plugin class, or None for a detector that is no longer (or never was) built in
    versions: list  # [(DetectorVersion, open-leaderboard entry or None)], newest first
    board: Leaderboard | None = None  # the latest stored CPU evaluation's leaderboard
    standing: Standing | None = None  # its row there
    gpu_board: Leaderboard | None = None  # the latest GPU evaluation's, shown apart
    gpu_standing: Standing | None = None  # its row there
    caught: list = field(default_factory=list)  # detection rows of the bugs caught beyond the fixed twin
    only_as_fixed: list = field(default_factory=list)  # detected, but never beyond the fixed twin
    missed: list = field(default_factory=list)  # rows with buggy runs and no detection
    false_alarms: list = field(default_factory=list)  # rows with a false alarm (before the trigger, or on fixed)
    history: list = field(default_factory=list)  # [(evaluation, Standing)], oldest first
    chart: Chart | None = None

    @property
    def evaluation(self):
        return self.board.evaluation if self.board else None


def standing_in(board, name):
    """``name``'s row of ``board`` (ranked, opt-in or baseline), or None."""
    rows = [*board.ranked, *board.opt_in, *([board.baseline] if board.baseline else [])]
    return next((row for row in rows if row.detector == name), None)


def detector_page(name, user):
    """The page of detector ``name`` as ``user`` may see it, or None when there is no such detector."""
    plugin = all_plugins().get(name)
    versions = detector_history(name, user)
    if plugin is None and not versions and not Detector.objects.filter(name=name).exists():
        return None  # (a Detector row without code is one recorded before detector versions existed)
    page = DetectorPage(name=name, plugin=plugin, versions=versions)
    viewer = results_viewer(user)
    # the CPU evaluations, whose history is of one catalog; the GPU track's bugs are others, shown apart
    for evaluation in reversed(list(evaluations_for(viewer).filter(device=Device.CPU)[:HISTORY_EVALUATIONS])):
        board = build_leaderboard({"evaluation": str(evaluation.pk)}, user)
        standing = standing_in(board, name)
        if standing is not None and standing.bugs:
            page.history.append((evaluation, standing))
        page.board = board  # the newest, once the loop ends
    if page.board is not None:
        page.standing = standing_in(page.board, name)
        detection = page.board.results.table("detection")  # as the reader may see it: no held-out bug's row
        rows = sorted((row for row in detection.to_dict("records") if row.get("detector") == name),
                      key=lambda row: (row["bug"], row["reproducer"]))
        page.caught = [row for row in rows if row.get("detected_beyond_fixed_runs")]
        page.only_as_fixed = [row for row in rows if row.get("detected_runs") and not
                              row.get("detected_beyond_fixed_runs")]
        page.missed = [row for row in rows if row.get("buggy_runs") and not row.get("detected_runs")]
        page.false_alarms = [row for row in rows if row.get("pre_trigger_false_alarm_runs")
                             or row.get("fixed_runs_with_alarm")]
    gpu = latest_evaluation(viewer, Device.GPU)
    if gpu is not None:
        page.gpu_board = build_leaderboard({"evaluation": str(gpu.pk)}, user)
        page.gpu_standing = standing_in(page.gpu_board, name)
    page.chart = history_chart(page.history) if len(page.history) > 1 else None
    return page


def history_chart(history):
    """The share of bugs caught beyond the fixed twin in each stored evaluation, with its Wilson interval, and the
    false-positive rate beside it."""
    figure = go.Figure()
    dates = [f"{evaluation.created_at:%Y-%m-%d %H:%M}" for evaluation, _ in history]
    labels = [label(evaluation.label) for evaluation, _ in history]
    shares = [standing.beyond_fixed_interval for _, standing in history]
    figure.add_trace(go.Scatter(
        name="bugs caught beyond the fixed twin", x=dates, y=[share[0] for share in shares], mode="lines+markers",
        marker={"color": PALETTE[0]}, text=labels,
        error_y={"type": "data", "symmetric": False, "array": [share[2] - share[0] for share in shares],
                 "arrayminus": [share[0] - share[1] for share in shares]},
        customdata=[[standing.beyond_fixed, standing.bugs] for _, standing in history],
        hovertemplate="evaluation %{text}: %{customdata[0]}/%{customdata[1]} bugs<extra></extra>"))
    fp = [standing.false_positives or {} for _, standing in history]
    figure.add_trace(go.Scatter(name="FP rate on clean runs", x=dates, y=[row.get("fp_rate") for row in fp],
                                mode="lines+markers", marker={"color": PALETTE[1]}, text=labels,
                                hovertemplate="evaluation %{text}: FP rate %{y:.1%}<extra></extra>"))
    figure.update_layout(**LAYOUT, height=320, legend={"orientation": "h", "y": -0.25},
                         yaxis={"tickformat": ".0%", "range": [-0.03, 1.03]}, xaxis={"type": "category"})
    rows = [[evaluation.label, f"{evaluation.created_at:%Y-%m-%d}", f"{standing.beyond_fixed}/{standing.bugs}",
             (standing.false_positives or {}).get("fp_rate")] for evaluation, standing in history]
    return Chart("detector-history-chart", as_dict(figure), columns=["evaluation", "date", "beyond the fixed twin",
                                                                     "FP rate"], rows=rows, rows_total=len(rows))
