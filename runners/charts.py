"""Plotly figures, returned as JSON-ready dicts (rendered with json_script, so text stays text)."""
import json
from dataclasses import dataclass, field

import plotly.graph_objects as go
from django.utils.html import escape

VARIANT_COLOURS = {"buggy": "#c0392b", "fixed": "#2471a3"}


def label(value):
    """Text for a plotly label or hover: plotly reads a few HTML tags in text (<b>, <a href>...), so
    user text is entity-escaped and shows literally."""
    return escape("" if value is None else str(value))


def as_dict(figure):
    return json.loads(figure.to_json())


@dataclass
class Chart:
    """A figure and its numbers as a table (the same values, one click away under the plot).

    ``table_id`` names a table already on the page that holds the numbers, instead of ``rows``.
    """

    id: str
    figure: dict
    columns: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    rows_total: int = 0  # when more than len(rows): the table lists only the first rows
    table_id: str = ""

    @property
    def figure_id(self):
        return f"{self.id}-figure"

    @property
    def rows_cut(self):
        return self.rows_total > len(self.rows)

    @property
    def empty(self):
        return not self.figure.get("data")


# A loss that explodes on the buggy variant flattens the fixed curve: let the reader switch to a log axis.
LOG_AXIS_MENU = {
    "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.12, "showactive": True,
    "buttons": [{"label": "linear", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                {"label": "log", "method": "relayout", "args": [{"yaxis.type": "log"}]}],
}


def loss_figure(runs_with_alarms):
    """Per-step loss of runs (buggy and fixed overlaid), with their alarms marked on the curve."""
    figure = go.Figure()
    for run, alarms in runs_with_alarms:
        by_rank = {}
        for record in run.step_records:
            if isinstance(record.get("loss"), (int, float)):
                by_rank.setdefault(record["rank"], []).append((record["step"], record["loss"]))
        for rank, points in sorted(by_rank.items()):
            figure.add_trace(go.Scatter(
                x=[p[0] for p in points], y=[p[1] for p in points], mode="lines",
                name=f"{run.variant} (rank {rank})" if len(by_rank) > 1 else run.variant,
                line={"color": VARIANT_COLOURS.get(run.variant), "dash": "solid" if rank == 0 else "dot"},
            ))
        if alarms:
            loss_at = {p[0]: p[1] for p in by_rank.get(0, [])}
            figure.add_trace(go.Scatter(
                x=[a.step for a in alarms], y=[loss_at.get(a.step) for a in alarms], mode="markers",
                name=f"alarms ({run.variant})",
                marker={"symbol": "x", "size": 12, "color": "#000" if run.variant == "buggy" else "#e67e22"},
                text=[label(f"{a.rule}: {a.message}") for a in alarms], hoverinfo="text+x",
            ))
        if run.trigger_step is not None and run.variant == "buggy":
            figure.add_vline(x=run.trigger_step, line_dash="dash", line_color="#888",
                             annotation_text="trigger step")
    figure.update_layout(xaxis_title="step", yaxis_title="loss", height=380, margin={"t": 30, "r": 10},
                         template="plotly_white", legend={"orientation": "h"}, updatemenus=[LOG_AXIS_MENU])
    return as_dict(figure)
