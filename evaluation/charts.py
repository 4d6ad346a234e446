"""The results plots, each a ``core.charts.Chart``: a plotly figure (drawn in the browser by the plotly.js that
``runners.views.plotly_js`` serves, passed with json_script) and the table of the numbers it shows."""
import re

import plotly.graph_objects as go

from core.charts import LAYOUT, PALETTE, Chart, as_dict, label

from .tables import cell_text

# 0 % detected is a result (pale red, a miss); a cell never run is no result and has a colour of its own.
DETECTED_COLOURS = [[0, "#fdedec"], [0.5, "#abebc6"], [1, "#1e8449"]]
NO_DATA_COLOUR = "#566573"
NO_DATA = "no data (not run)"
# A cell where the detector detected nothing but raised false alarms: neither a plain miss nor a detection.
FALSE_ALARM_COLOUR = "#f0b27a"
FALSE_ALARM_ONLY = "false alarms, nothing detected"
# Characters of a heatmap row label's line: a longer label wraps after a hyphen, so that on a phone the labels
# leave room for the cells and the detectors' names above them.
LABEL_LINE = 22
ROW_HEIGHT = 24  # px per heatmap row, a line of label; a row whose label wraps takes two
FEWEST_ROWS = 4  # of height kept for the cells: with less, a phone's upright names leave plotly no plot area
COLOUR_BAR_HEIGHT = 60  # px under the cells: the colour bar and its ticks
LEGEND_HEIGHT = 48  # px under the colour bar, when a cell needs the legend: its swatches, on two rows on a phone
NAMES_HEIGHT = 170  # px above the cells: the detectors' names, upright on a phone (at least)
NAME_CHARACTER = 7  # px of an upright detector name's character, at the axis font
COLUMN_WIDTH = 18  # px a column needs at the least: an upright name's line, and the gap beside it
ROW_LABELS_WIDTH = 170  # px the wrapped row labels and the margins take beside the cells


def wrapped(text, width=LABEL_LINE):
    """``text`` escaped, on lines of at most ``width`` characters joined by <br> (a plotly label's line break),
    broken only after a hyphen or before a space: a part longer than a line stays whole."""
    lines = [""]
    for part in re.split(r"(?<=-)|(?= )", text):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append(part.lstrip())
        else:
            lines[-1] += part
    return "<br>".join(label(line) for line in lines)


def detection_heatmap(detection):
    """Bug x detector, coloured by the fraction of buggy runs detected; cells read ``detected/buggy``.

    Cells with no runs, and cells with false alarms but no detection (which the rate alone would show as a plain
    miss), are drawn by one-colour traces of their own, named in the legend. The layout reads at a
    phone's width as at a desktop's: long row labels wrap, the detectors' names turn upright when they would
    overlap, a plot too wide for the screen scrolls sideways inside its figure (``meta.min_width``), and the colour
    bar lies under the cells rather than beside them."""
    records = detection.to_dict("records")
    detectors = sorted({r["detector"] for r in records})
    bugs = sorted({(r["bug"], r["reproducer"]) for r in records})
    cells = {(r["bug"], r["reproducer"], r["detector"]): r for r in records}
    z, text, hover, missing, false_alarm_only = [], [], [], [], []
    for bug, reproducer in bugs:
        for row in (z, text, hover, missing, false_alarm_only):
            row.append([])
        for detector in detectors:
            cell = cells.get((bug, reproducer, detector))
            missing[-1].append(None if cell else 1)
            if cell is None:
                z[-1].append(None), text[-1].append(""), hover[-1].append(NO_DATA), false_alarm_only[-1].append(None)
                continue
            false_alarms = (cell["fixed_runs_with_alarm"] or 0) + (cell["pre_trigger_false_alarm_runs"] or 0)
            only_false_alarms = false_alarms and not cell["detected_runs"]
            false_alarm_only[-1].append(1 if only_false_alarms else None)
            z[-1].append(cell["detection_rate"])  # under the false-alarm layer's cell, where that is drawn
            text[-1].append(cell_text(cell))
            hover[-1].append(label(f"detected {cell['detected_runs']}/{cell['buggy_runs']} buggy runs; "
                                   f"{cell['outcome']}") + (f"<br>false alarms in {false_alarms} run(s)"
                                                            if false_alarms else ""))
    rows_shown = [f"{bug} ({reproducer})" for bug, reproducer in bugs]
    figure = go.Figure(go.Heatmap(
        z=z, x=detectors, y=rows_shown, text=text, customdata=hover, hoverongaps=False,
        texttemplate="%{text}", zmin=0, zmax=1, xgap=2, ygap=2, colorscale=DETECTED_COLOURS,
        # (a colour bar's title would overlap it when the bar lies under the cells: its ticks name it)
        colorbar={"tickvals": [0, 0.5, 1], "ticktext": ["0%", "50% detected", "100%"], "orientation": "h",
                  "thickness": 12, "len": 1, "x": 0, "xanchor": "left", "y": 0, "yref": "container",
                  "yanchor": "bottom"},
        hovertemplate="%{y} · %{x}<br>%{customdata}<extra></extra>",
    ))
    if any(any(row) for row in missing):
        figure.add_trace(_one_colour_cells(
            missing, detectors, rows_shown, NO_DATA, NO_DATA_COLOUR,
            text=[["no data" if cell else "" for cell in row] for row in missing], text_colour="#ffffff",
            hover=[[NO_DATA] * len(row) for row in missing]))
    if any(any(row) for row in false_alarm_only):
        layer_text = [[label if marked else "" for label, marked in zip(*rows)] for rows in zip(text, false_alarm_only)]
        figure.data[0].text = [[label if not marked else "" for label, marked in zip(*rows)]
                               for rows in zip(text, false_alarm_only)]  # each cell's words drawn once
        figure.add_trace(_one_colour_cells(false_alarm_only, detectors, rows_shown, FALSE_ALARM_ONLY,
                                           FALSE_ALARM_COLOUR, text=layer_text, text_colour="#000000", hover=hover))
    labels = [wrapped(row) for row in rows_shown]
    rows_height = sum(ROW_HEIGHT * (1 + row.count("<br>")) for row in labels)
    names_height = max(NAMES_HEIGHT, NAME_CHARACTER * max(map(len, detectors), default=0) + 10)
    # The legend has a row of its own under the colour bar: beside it, "false alarms, nothing detected" ran into
    # the bar's "0%".
    legend_height = LEGEND_HEIGHT if len(figure.data) > 1 else 0
    height = names_height + COLOUR_BAR_HEIGHT + legend_height + max(rows_height, FEWEST_ROWS * ROW_HEIGHT)
    figure.data[0].colorbar.y = legend_height / height
    figure.update_layout(
        **{**LAYOUT, "margin": {**LAYOUT["margin"], "b": COLOUR_BAR_HEIGHT + legend_height}},
        height=height,
        # charts.js: the plot is never narrower, and scrolls inside its figure rather than crowd the names
        meta={"min_width": ROW_LABELS_WIDTH + COLUMN_WIDTH * len(detectors)},
        xaxis={"side": "top", "automargin": True, "tickvals": detectors, "autotickangles": [-30, -90]},
        yaxis={"autorange": "reversed", "automargin": True, "tickvals": rows_shown, "ticktext": labels},
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 0, "yref": "container", "yanchor": "bottom"})
    rows = [[r["bug"], r["reproducer"], r["detector"], r["detected_runs"], r["buggy_runs"], r["detection_rate"],
             r["outcome"]] for r in sorted(records, key=lambda r: (r["bug"], r["reproducer"], r["detector"]))]
    return Chart("detection-heatmap", as_dict(figure),
                 ["bug", "reproducer", "detector", "detected runs", "buggy runs", "detection rate", "outcome"], rows)


def _one_colour_cells(cells, detectors, rows_shown, name, colour, text, text_colour, hover):
    """A heatmap layer drawing the cells marked 1 in ``cells`` in one colour, named in the legend."""
    return go.Heatmap(
        z=cells, x=detectors, y=rows_shown, name=name, showlegend=True, showscale=False, hoverongaps=False,
        colorscale=[[0, colour], [1, colour]], xgap=2, ygap=2, text=text, texttemplate="%{text}",
        textfont={"color": text_colour}, customdata=hover, hovertemplate="%{y} · %{x}<br>%{customdata}<extra></extra>")


def false_positive_chart(false_positives):
    """FP rate per detector as a dot with its Wilson 95% interval as whiskers; the numbers are the FP table's.

    A rate of 0 stays readable: the dot sits on the axis, drawn whole, labelled ``0/n``, with only an upper
    whisker (the interval's upper bound). The axis ends just above the highest bound."""
    records = false_positives.to_dict("records")
    highest = max((r["fp_ci_high"] for r in records), default=1)
    figure = go.Figure(go.Scatter(
        x=[r["detector"] for r in records], y=[r["fp_rate"] for r in records], mode="markers+text",
        marker={"color": "#c0392b", "size": 11}, cliponaxis=False,
        text=[f"{r['clean_runs_with_alarm']}/{r['clean_runs']}" for r in records], textposition="middle right",
        error_y={"type": "data", "symmetric": False, "array": [r["fp_ci_high"] - r["fp_rate"] for r in records],
                 "arrayminus": [r["fp_rate"] - r["fp_ci_low"] for r in records], "width": 8},
        customdata=[[r["clean_runs_with_alarm"], r["clean_runs"], r["fp_ci_low"], r["fp_ci_high"]] for r in records],
        hovertemplate="%{x}: %{y:.1%} (%{customdata[0]}/%{customdata[1]} clean runs alarmed)<br>"
                      "Wilson 95% interval: %{customdata[2]:.1%} to %{customdata[3]:.1%}<extra></extra>",
    ))
    figure.update_layout(**LAYOUT, height=340, xaxis={"ticklabelstandoff": 8}, yaxis={
        "title": {"text": "FP rate on clean runs<br>whisker: Wilson 95% interval"}, "tickformat": ".0%",
        "range": [0, min(1, max(highest, 0.05) * 1.1)], "zeroline": True, "zerolinecolor": "#566573"})
    return Chart("false-positive-chart", as_dict(figure), table_id="false-positives")


POINTS_SHOWN = 1000


def spread(count, width=0.5):
    """Horizontal offsets of ``count`` points around their box's centre, scattered evenly by the golden ratio
    (the same offsets on every render), so that runs with the same latency do not hide each other."""
    return [round((index * 0.6180339887 % 1 - 0.5) * width, 3) for index in range(count)]


def latency_chart(run_latencies):
    """Per detector, the latency in steps of every detected buggy run: a box, and every run as a point.

    The axis starts at 0 steps, where most detections are: the points are a scatter trace drawn whole on
    the axis line (a box's own points would be cut in half there), on a numeric x axis labelled with the
    detectors. Past POINTS_SHOWN runs the box keeps every value but draws outliers only, with no points
    trace, and the table lists the first POINTS_SHOWN runs: a 25,000-run campaign would otherwise make
    a page of megabytes."""
    many = len(run_latencies) > POINTS_SHOWN
    figure = go.Figure()
    detectors = []
    for position, (detector, runs) in enumerate(run_latencies.groupby("detector", sort=True)):
        records, colour = runs.to_dict("records"), PALETTE[position % len(PALETTE)]
        latencies = [r["latency_steps"] for r in records]
        detectors.append(detector)
        figure.add_trace(go.Box(
            name=detector, x0=position, y=latencies, width=0.6, boxpoints="outliers" if many else False,
            marker={"size": 5, "color": colour}, line={"width": 1, "color": colour},
        ))
        if not many:
            figure.add_trace(go.Scatter(
                name=detector, x=[position + offset for offset in spread(len(records))], y=latencies,
                mode="markers", cliponaxis=False,
                marker={"size": 7, "color": colour, "line": {"width": 1, "color": "#ffffff"}},
                text=[label(f"{r['bug']} ({r['reproducer']}) seed {r['seed']}, run {r['run']}, rule {r['rule']}")
                      for r in records],
                hovertemplate="%{text}<br>%{y} steps after the trigger<extra>%{fullData.name}</extra>",
            ))
    longest = float(run_latencies["latency_steps"].max()) if len(run_latencies) else 0
    top = max(2, longest) * 1.05 + 0.2  # room above the highest point
    figure.update_layout(
        **LAYOUT, height=380, showlegend=False,
        xaxis={"tickvals": list(range(len(detectors))), "ticktext": detectors, "range": [-0.5, len(detectors) - 0.5],
               "showgrid": False, "zeroline": False},
        yaxis={"title": {"text": "steps from trigger to first alarm"}, "range": [0, top], "zeroline": True,
               "zerolinecolor": "#566573", **({"tick0": 0, "dtick": 1} if top <= 10 else {})})
    rows = [[r["detector"], r["bug"], r["reproducer"], r["seed"], r["run"], r["latency_steps"], r["latency_seconds"],
             r["rule"]] for r in run_latencies.head(POINTS_SHOWN).to_dict("records")]
    return Chart("latency-chart", as_dict(figure),
                 ["detector", "bug", "reproducer", "seed", "run", "latency steps", "latency s", "first alarm rule"],
                 rows, rows_total=len(run_latencies))


RATIO_TICKS = [k * 10.0 ** e for e in range(-2, 4) for k in (1, 2, 5)]


def overhead_chart(overhead):
    """Median step-time and end-to-end ratios per detector as bars from the 1× line (plain's speed) on a log
    axis: the ratios span 1x to ~100x, and a ratio below 1 (faster than plain) hangs below the line.

    Plotly draws a bar from ``base`` to ``base + y``, so ``y`` is ratio - 1; the ratio is in ``customdata``
    and on the bar."""
    records = overhead.to_dict("records")
    detectors = [r["detector"] for r in records]

    def ratio_bars(name, key, colour, what):
        # a stored table is data: anything but a number is drawn as no bar (the table shows it, escaped)
        ratios = [r[key] if isinstance(r[key], (int, float)) and not isinstance(r[key], bool) else None
                  for r in records]
        return go.Bar(name=name, x=detectors, base=[1] * len(ratios), customdata=ratios,
                      y=[None if ratio is None else ratio - 1 for ratio in ratios],
                      text=["" if ratio is None else f"×{ratio:.3g}" if ratio < 100 else f"×{ratio:.0f}"
                            for ratio in ratios], textposition="outside",
                      cliponaxis=False, marker_color=colour,
                      hovertemplate=f"%{{x}}: {what} ×%{{customdata}}<extra></extra>")

    figure = go.Figure([
        ratio_bars("step-time ratio", "median_step_time_ratio", "#1f5f99", "step time"),
        ratio_bars("end-to-end ratio", "median_end_to_end_ratio", "#b9770e", "end to end"),
    ] if records else [])
    figure.add_hline(y=1, line_color="#566573")
    figure.update_layout(**LAYOUT, height=360, barmode="group", legend={"orientation": "h"}, yaxis={
        "type": "log", "title": {"text": "instrumented / plain (median over pairs)<br>below ×1: faster than plain"},
        # plotly labels a log axis's 2s and 5s with the digit alone: "5" below the 1 would read as 5, not 0.5
        "tickvals": RATIO_TICKS, "ticktext": [f"×{tick:g}" for tick in RATIO_TICKS]})
    return Chart("overhead-chart", as_dict(figure), table_id="overhead")


LABELLED = 3  # drop-in points named on the plot: the top three of the leaderboard (ties included)


def detection_against_false_positives(board):
    """One point per ranked detector: the share of bugs it caught beyond the fixed twin against its false-positive
    rate on clean runs, each with its Wilson 95% interval as whiskers; drop-in and opt-in detectors as two traces.
    The best corner is top left. ``board``: an ``evaluation.leaderboard.Leaderboard``."""
    figure = go.Figure()
    rows, highest = [], 0.0
    for name, standings, colour, symbol in (("drop-in", board.ranked, PALETTE[0], "circle"),
                                            ("opt-in (ranked apart)", board.opt_in, "#7f8c8d", "diamond")):
        points = [(s, s.beyond_fixed_interval, s.false_positives) for s in standings
                  if s.beyond_fixed_interval and s.false_positives]
        if not points:
            continue
        # names written beside the leaders and the opt-in points only: the rest crowd the origin (their names are in
        # the hover and the table); from left to right, above and below their points in turn, so that neighbours'
        # names do not overlap
        text = [label(s.detector) if name != "drop-in" or (s.rank or LABELLED + 1) <= LABELLED else ""
                for s, _, _ in points]
        named = sorted((fp["fp_rate"], index) for index, (_, _, fp) in enumerate(points) if text[index])
        above = {index: turn % 2 == 0 for turn, (_, index) in enumerate(named)}
        figure.add_trace(go.Scatter(
            name=name, mode="markers+text", cliponaxis=False,
            textposition=["top center" if above.get(index, True) else "bottom center" for index in range(len(points))],
            x=[fp["fp_rate"] for _, _, fp in points], y=[share[0] for _, share, _ in points],
            text=text, marker={"color": colour, "size": 10, "symbol": symbol},
            error_x={"type": "data", "symmetric": False, "width": 0, "thickness": 1,
                     "array": [fp["fp_ci_high"] - fp["fp_rate"] for *_, fp in points],
                     "arrayminus": [fp["fp_rate"] - fp["fp_ci_low"] for *_, fp in points]},
            error_y={"type": "data", "symmetric": False, "array": [share[2] - share[0] for _, share, _ in points],
                     "arrayminus": [share[0] - share[1] for _, share, _ in points], "width": 0, "thickness": 1},
            customdata=[[s.beyond_fixed, s.bugs, fp["clean_runs_with_alarm"], fp["clean_runs"]]
                        for s, _, fp in points],
            hovertext=[label(s.detector) for s, _, _ in points],
            hovertemplate="%{hovertext}: caught %{customdata[0]}/%{customdata[1]} bugs beyond the fixed twin, "
                          "false alarms on %{customdata[2]}/%{customdata[3]} clean runs<extra></extra>"))
        highest = max([highest, *(share[2] for _, share, _ in points)])
        rows += [[s.detector, name, f"{s.beyond_fixed}/{s.bugs}", f"{share[0]} [{share[1]}, {share[2]}]",
                  f"{fp['fp_rate']} [{fp['fp_ci_low']}, {fp['fp_ci_high']}]"] for s, share, fp in points]
    figure.update_layout(**LAYOUT, height=420, legend={"orientation": "h", "y": -0.2},
                         xaxis={"title": {"text": "false-positive rate on clean runs"}, "tickformat": ".0%",
                                "range": [-0.03, 1.03]},
                         # up to the highest interval's top: the points, most of them near the origin, spread out
                         yaxis={"title": {"text": "bugs caught beyond the fixed twin"}, "tickformat": ".0%",
                                "range": [-0.03, min(1.03, highest + 0.08)]})
    return Chart("detection-against-false-positives", as_dict(figure),
                 columns=["detector", "integration", "bugs caught beyond the fixed twin", "detection [Wilson 95%]",
                          "FP rate [Wilson 95%]"], rows=rows, rows_total=len(rows))


def dose_response_chart(dose, fault_class):
    """Detection rate against severity level, one line per detector, its Wilson 95 % interval as a band; only the
    levels where some mutant run manifested (a benign level has no rate)."""
    rows = sorted((row for row in dose if row["fault_class"] == fault_class and row["manifested"]),
                  key=lambda row: (row["detector"], row["severity_level"]))
    figure = go.Figure()
    detectors = sorted({row["detector"] for row in rows})
    for index, detector in enumerate(detectors):
        points = [row for row in rows if row["detector"] == detector]
        levels = [row["severity_level"] for row in points]
        colour = PALETTE[index % len(PALETTE)]
        figure.add_trace(go.Scatter(x=levels + levels[::-1],
                                    y=[row["ci_high"] for row in points] + [row["ci_low"] for row in points][::-1],
                                    fill="toself", fillcolor=colour, opacity=0.15, line={"width": 0},
                                    hoverinfo="skip", showlegend=False, legendgroup=detector))
        figure.add_trace(go.Scatter(
            x=levels, y=[row["rate"] for row in points], mode="lines+markers", name=label(detector),
            line={"color": colour}, legendgroup=detector,
            customdata=[[row["caught"], row["manifested"], row["ci_low"], row["ci_high"]] for row in points],
            hovertemplate=f"{label(detector)}: severity %{{x}}: %{{y:.0%}} (%{{customdata[0]}}/%{{customdata[1]}} "
                          "manifested runs caught)<br>Wilson 95% interval %{customdata[2]:.0%} to "
                          "%{customdata[3]:.0%}<extra></extra>"))
    figure.update_layout(**LAYOUT, height=420,
                         xaxis={"title": "severity level (1 = the operator's mildest)", "dtick": 1},
                         yaxis={"title": "detected", "range": [0, 1.02], "tickformat": ".0%"},
                         legend={"orientation": "h", "y": -0.25})
    table = [[row["detector"], row["severity_level"], row["caught"], row["manifested"], row["rate"], row["ci_low"],
              row["ci_high"], row["benign_runs"]] for row in rows]
    return Chart(f"dose-response-{fault_class}", as_dict(figure),
                 ["detector", "severity level", "caught", "manifested", "rate", "ci low", "ci high", "benign runs"],
                 table)
