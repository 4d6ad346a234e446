"""Plotly figures, returned as JSON-ready dicts (rendered with json_script, so text stays text)."""
import json

import plotly.graph_objects as go

VARIANT_COLOURS = {"buggy": "#c0392b", "fixed": "#2471a3"}


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
                text=[f"{a.rule}: {a.message}" for a in alarms], hoverinfo="text+x",
            ))
        if run.trigger_step is not None and run.variant == "buggy":
            figure.add_vline(x=run.trigger_step, line_dash="dash", line_color="#888",
                             annotation_text="trigger step")
    figure.update_layout(xaxis_title="step", yaxis_title="loss", height=380, margin={"t": 30, "r": 10},
                         template="plotly_white", legend={"orientation": "h"})
    return json.loads(figure.to_json())
