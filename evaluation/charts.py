"""The results plots, each a ``core.charts.Chart``: a plotly figure (drawn in the browser from
/vendor/plotly.min.js, passed with json_script) and the table of the numbers it shows."""
import plotly.graph_objects as go

from core.charts import LAYOUT, Chart, as_dict, label

from .tables import cell_text


def detection_heatmap(detection):
    """Bug x detector, coloured by the fraction of buggy runs detected; cells read ``detected/buggy``."""
    records = detection.to_dict("records")
    detectors = sorted({r["detector"] for r in records})
    bugs = sorted({(r["bug"], r["reproducer"]) for r in records})
    cells = {(r["bug"], r["reproducer"], r["detector"]): r for r in records}
    z, text, hover = [], [], []
    for bug, reproducer in bugs:
        z.append([]), text.append([]), hover.append([])
        for detector in detectors:
            cell = cells.get((bug, reproducer, detector))
            if cell is None:
                z[-1].append(None), text[-1].append(""), hover[-1].append("not run")
                continue
            false_alarms = (cell["fixed_runs_with_alarm"] or 0) + (cell["pre_trigger_false_alarm_runs"] or 0)
            z[-1].append(cell["detection_rate"])
            text[-1].append(cell_text(cell))
            hover[-1].append(label(f"detected {cell['detected_runs']}/{cell['buggy_runs']} buggy runs; "
                                   f"{cell['outcome']}") + (f"<br>false alarms in {false_alarms} run(s)"
                                                            if false_alarms else ""))
    figure = go.Figure(go.Heatmap(
        z=z, x=detectors, y=[f"{bug} ({reproducer})" for bug, reproducer in bugs], text=text, customdata=hover,
        texttemplate="%{text}", zmin=0, zmax=1, xgap=2, ygap=2,
        colorscale=[[0, "#f2f3f4"], [0.5, "#abebc6"], [1, "#1e8449"]],
        colorbar={"title": {"text": "detected"}, "tickformat": ".0%"},
        hovertemplate="%{y} · %{x}<br>%{customdata}<extra></extra>",
    ))
    figure.update_layout(**LAYOUT, height=max(280, 140 + 24 * len(bugs)), xaxis={"side": "top", "tickangle": -30},
                         yaxis={"autorange": "reversed", "automargin": True})
    rows = [[r["bug"], r["reproducer"], r["detector"], r["detected_runs"], r["buggy_runs"], r["detection_rate"],
             r["outcome"]] for r in sorted(records, key=lambda r: (r["bug"], r["reproducer"], r["detector"]))]
    return Chart("detection-heatmap", as_dict(figure),
                 ["bug", "reproducer", "detector", "detected runs", "buggy runs", "detection rate", "outcome"], rows)


def false_positive_chart(false_positives):
    """FP rate per detector as a dot with its Wilson 95% interval as whiskers (a rate of 0 stays visible);
    the numbers are the FP table's."""
    records = false_positives.to_dict("records")
    figure = go.Figure(go.Scatter(
        x=[r["detector"] for r in records], y=[r["fp_rate"] for r in records], mode="markers",
        marker={"color": "#c0392b", "size": 11},
        error_y={"type": "data", "symmetric": False, "array": [r["fp_ci_high"] - r["fp_rate"] for r in records],
                 "arrayminus": [r["fp_rate"] - r["fp_ci_low"] for r in records]},
        customdata=[[r["clean_runs_with_alarm"], r["clean_runs"], r["fp_ci_low"], r["fp_ci_high"]] for r in records],
        hovertemplate="%{x}: %{y} (%{customdata[0]}/%{customdata[1]} clean runs alarmed)<br>"
                      "Wilson 95%: [%{customdata[2]}, %{customdata[3]}]<extra></extra>",
    ))
    figure.update_layout(**LAYOUT, height=340, yaxis={"title": {"text": "FP rate (clean runs)"}, "range": [0, 1]})
    return Chart("false-positive-chart", as_dict(figure), table_id="false-positives")


POINTS_SHOWN = 1000


def latency_chart(run_latencies):
    """Per detector, the latency in steps of every detected buggy run (box with every run as a point).

    Past POINTS_SHOWN runs the box keeps every value but draws outliers only, without per-point hover
    text, and the table lists the first POINTS_SHOWN runs: a 25,000-run campaign would otherwise make
    a page of megabytes."""
    many = len(run_latencies) > POINTS_SHOWN
    figure = go.Figure()
    for detector, runs in run_latencies.groupby("detector", sort=True):
        records = runs.to_dict("records")
        figure.add_trace(go.Box(
            name=detector, y=[r["latency_steps"] for r in records], boxpoints="outliers" if many else "all",
            jitter=0.4, pointpos=0, marker={"size": 5}, line={"width": 1},
            text=None if many else [label(f"{r['bug']} ({r['reproducer']}) seed {r['seed']}, run {r['run']}, "
                                          f"rule {r['rule']}") for r in records],
            hovertemplate=None if many else "%{text}<br>%{y} steps after the trigger<extra>%{fullData.name}</extra>",
        ))
    longest = run_latencies["latency_steps"].max() if len(run_latencies) else 0
    figure.update_layout(**LAYOUT, height=380, showlegend=False,  # room around 0: most detections are at once
                         yaxis={"title": {"text": "steps from trigger to first alarm"},
                                "range": [-0.5, max(2, float(longest)) + 0.5]})
    rows = [[r["detector"], r["bug"], r["reproducer"], r["seed"], r["run"], r["latency_steps"], r["latency_seconds"],
             r["rule"]] for r in run_latencies.head(POINTS_SHOWN).to_dict("records")]
    return Chart("latency-chart", as_dict(figure),
                 ["detector", "bug", "reproducer", "seed", "run", "latency steps", "latency s", "first alarm rule"],
                 rows, rows_total=len(run_latencies))


def overhead_chart(overhead):
    """Median step-time and end-to-end ratios per detector (log axis: they span 1x to ~100x)."""
    records = overhead.to_dict("records")
    detectors = [r["detector"] for r in records]
    figure = go.Figure([
        go.Bar(name="step-time ratio", x=detectors, y=[r["median_step_time_ratio"] for r in records],
               marker_color="#1f5f99", hovertemplate="%{x}: step time ×%{y}<extra></extra>"),
        go.Bar(name="end-to-end ratio", x=detectors, y=[r["median_end_to_end_ratio"] for r in records],
               marker_color="#b9770e", hovertemplate="%{x}: end to end ×%{y}<extra></extra>"),
    ] if records else [])
    figure.add_hline(y=1, line_dash="dot", line_color="#888")
    figure.update_layout(**LAYOUT, height=360, barmode="group", legend={"orientation": "h"},
                         yaxis={"type": "log", "title": {"text": "instrumented / plain (median over pairs)"}})
    return Chart("overhead-chart", as_dict(figure), table_id="overhead")
