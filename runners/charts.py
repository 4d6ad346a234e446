"""The run page's loss chart and a bug's stability history."""
from datetime import UTC, timedelta

import plotly.graph_objects as go

from core.charts import LAYOUT, PALETTE, VARIANT_COLOURS, Chart, as_dict, label
from core.enums import Variant

# A loss that explodes on the buggy variant flattens the fixed curve: let the reader switch to a log axis.
LOG_AXIS_MENU = {
    "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.12, "showactive": True,
    "buttons": [{"label": "linear", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                {"label": "log", "method": "relayout", "args": [{"yaxis.type": "log"}]}],
}


LEGEND_MARGIN = 110  # px under the loss plot: its ticks, its axis title and two rows of legend


def loss_figure(runs_with_alarms):
    """Per-step loss of runs (buggy and fixed overlaid), with their alarms marked on the curve."""
    figure = go.Figure()
    for run, alarms in runs_with_alarms:
        by_rank = {}
        for record in run.step_records:
            if isinstance(record.get("loss"), (int, float)):
                # as a float: PostgreSQL's jsonb gives a loss of 1e36 back as an integer, past plotly's JSON engine
                by_rank.setdefault(record["rank"], []).append((record["step"], float(record["loss"])))
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
                marker={"symbol": "x", "size": 12, "color": "#000" if run.variant == Variant.BUGGY else "#e67e22"},
                text=[label(f"{a.rule}: {a.message}") for a in alarms], hoverinfo="text+x",
            ))
        if run.trigger_step is not None and run.variant == Variant.BUGGY:
            figure.add_vline(x=run.trigger_step, line_dash="dash", line_color="#888",
                             annotation_text="trigger step")
    # The legend lies in the bottom margin, under the axis title: at a phone's width it wraps onto a second row,
    # which plotly's default place for it (just under the axis) drew over the title.
    figure.update_layout(xaxis_title="step", yaxis_title="loss", height=400,
                         margin={"t": 30, "r": 10, "b": LEGEND_MARGIN}, template="plotly_white",
                         legend={"orientation": "h", "x": 0, "y": 0, "yref": "container", "yanchor": "bottom"},
                         updatemenus=[LOG_AXIS_MENU])
    return as_dict(figure)


def environment_label(environment):
    if environment is None:
        return "environment not recorded"
    return f"torch {environment.torch or '?'} · {environment.gpu or 'CPU'} · {environment.host}"


# Plotly ticks a date axis as finely as its span asks: checks seconds apart got ticks in fractions of a
# millisecond. The time axis spans at least this, so ticks fall on whole minutes.
SHORTEST_TIME_AXIS = timedelta(hours=1)


def plot_time(moment):
    """A moment as plotly reads a date (it ignores time zones): UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def time_axis_range(moments):
    """The moments, 5 % of their span on each side, widened around their middle to SHORTEST_TIME_AXIS."""
    first, last = min(moments), max(moments)
    margin = max((last - first) / 20, (SHORTEST_TIME_AXIS - (last - first)) / 2)
    return [plot_time(first - margin), plot_time(last + margin)]


def stability_chart(checks):
    """A bug's stability checks over time: the fraction of seeds whose buggy (●) and fixed (✕) variants
    manifested, one colour per environment (torch version, GPU or CPU, host)."""
    checks = sorted(checks, key=lambda c: (c.checked_at, c.pk))
    environments = list(dict.fromkeys(environment_label(c.environment) for c in checks))
    figure = go.Figure()
    for index, environment in enumerate(environments):
        mine = [c for c in checks if environment_label(c.environment) == environment]
        for variant, symbol in ((Variant.BUGGY, "circle"), (Variant.FIXED, "x")):
            counts = [c.buggy_manifested if variant == Variant.BUGGY else c.fixed_manifested for c in mine]
            figure.add_trace(go.Scatter(
                x=[plot_time(c.checked_at) for c in mine], y=[n / c.seeds if c.seeds else None
                                                                for n, c in zip(counts, mine)],
                mode="lines+markers", name=label(f"{variant} · {environment}"),
                legendgroup=str(index), line={"color": PALETTE[index % len(PALETTE)],
                                              "dash": "solid" if variant == Variant.BUGGY else "dot"},
                marker={"symbol": symbol, "size": 10},
                text=[label(f"{c.reproducer_version.reproducer.name} @ {c.reproducer_version.short_hash}: "
                            f"{variant} {n}/{c.seeds}, {c.get_verdict_display().lower()}"
                            + (f", {c.failed_runs} failed" if c.failed_runs else "")) for n, c in zip(counts, mine)],
                hovertemplate="%{x|%Y-%m-%d %H:%M:%S} UTC<br>%{text}<extra></extra>",
            ))
    figure.update_layout(**LAYOUT, height=320 + 22 * len(environments), legend={"orientation": "h", "y": -0.3,
                                                                               "yanchor": "top"},
                         xaxis={"type": "date", "title": {"text": "checked at (UTC)"},
                                "range": time_axis_range([c.checked_at for c in checks]) if checks else None},
                         yaxis={"title": {"text": "seeds manifesting"}, "range": [-0.05, 1.05], "tickformat": ".0%"})
    rows = [[f"{c.checked_at:%Y-%m-%d %H:%M} UTC", c.reproducer_version.reproducer.name,
             c.reproducer_version.short_hash,
             environment_label(c.environment), f"{c.buggy_manifested}/{c.seeds}", f"{c.fixed_manifested}/{c.seeds}",
             c.failed_runs, c.get_verdict_display()] for c in checks]
    return Chart("stability-chart", as_dict(figure),
                 ["checked at", "reproducer", "version", "environment", "buggy manifested", "fixed manifested",
                  "failed runs", "verdict"], rows)
