"""How the plots draw their numbers (axes, baselines, colours, intervals), how plotly.js reaches the browser
(compressed, cached for a year under a versioned URL) and the favicon. tests/test_charts.py checks that
the numbers equal the tables."""
import gzip
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from django.urls import reverse
from plotly.offline import get_plotlyjs_version

from evaluation.charts import (
    DETECTED_COLOURS,
    FALSE_ALARM_COLOUR,
    FALSE_ALARM_ONLY,
    LABEL_LINE,
    NO_DATA,
    NO_DATA_COLOUR,
    ROW_HEIGHT,
    detection_heatmap,
    false_positive_chart,
    latency_chart,
    overhead_chart,
    wrapped,
)
from evaluation.results import without_nan
from evaluation.tables import DETECTION_COLUMNS, FALSE_POSITIVE_COLUMNS
from runners.charts import SHORTEST_TIME_AXIS, stability_chart

from .factories import ReproducerVersionFactory, StabilityCheckFactory
from .helpers import make_runs
from .test_charts import figure

pytestmark = pytest.mark.django_db

ONE_YEAR = 365 * 24 * 3600


def test_heatmap_draws_cells_without_runs_in_a_colour_of_their_own_named_in_the_legend(client):
    make_runs()
    page = client.get("/results/").content.decode()
    rates, no_data, false_alarms = figure(page, "detection-heatmap-figure")["data"]
    plain, bug_b = rates["x"].index("plain"), rates["y"].index("TEST-B (cpu)")
    assert rates["z"][bug_b][plain] is None and rates["hoverongaps"] is False  # no rate: the second trace's cell
    assert no_data["z"][bug_b][plain] == 1
    assert sum(cell == 1 for row in no_data["z"] for cell in row) == 2  # TEST-B's cpu and cuda, never run plainly
    assert no_data["showlegend"] is True and no_data["name"] == NO_DATA
    assert no_data["customdata"][bug_b][plain] == NO_DATA and "not run" in NO_DATA
    assert false_alarms["name"] == FALSE_ALARM_ONLY  # TEST-B under param_not_updated: the next test
    assert {colour for _, colour in no_data["colorscale"]} == {NO_DATA_COLOUR}
    assert NO_DATA_COLOUR not in {colour for _, colour in DETECTED_COLOURS}
    assert rates["colorscale"][0] == [0, DETECTED_COLOURS[0][1]] != [0, NO_DATA_COLOUR]  # 0 % is not "no data"
    assert rates["zmin"] == 0 and rates["zmax"] == 1
    assert dict(zip(rates["colorbar"]["tickvals"], rates["colorbar"]["ticktext"])) == {0: "0%", 0.5: "50% detected",
                                                                                       1: "100%"}


def test_a_cell_with_false_alarms_and_no_detection_has_a_colour_of_its_own(client):
    """A false alarm with nothing detected is neither a miss (pale red) nor a detection: it is drawn apart."""
    make_runs()
    page = client.get("/results/", {"detector": "param_not_updated"}).content.decode()
    rates, false_alarms = figure(page, "detection-heatmap-figure")["data"]
    bug_a, bug_b = rates["y"].index("TEST-A (cpu)"), rates["y"].index("TEST-B (cpu)")
    assert false_alarms["z"][bug_b][0] == 1 and rates["z"][bug_b][0] == 0.0  # TEST-B: 0/1, a false alarm, on top
    assert false_alarms["z"][bug_a][0] is None and rates["z"][bug_a][0] == 1.0  # TEST-A: detected
    assert "FA" in false_alarms["text"][bug_b][0] and rates["text"][bug_b][0] == ""  # its words drawn once
    assert false_alarms["text"][bug_a][0] == "" and rates["text"][bug_a][0] == "2/2 (1 beyond fixed)"
    assert "false alarms in" in false_alarms["customdata"][bug_b][0]
    assert false_alarms["showlegend"] is True and {colour for _, colour in false_alarms["colorscale"]} == {
        FALSE_ALARM_COLOUR}
    assert FALSE_ALARM_COLOUR not in {colour for _, colour in DETECTED_COLOURS} | {NO_DATA_COLOUR}


def test_a_heatmap_with_every_cell_run_has_no_no_data_trace(client):
    make_runs()
    page = client.get("/results/", {"detector": "param_not_updated"}).content.decode()
    rates, false_alarms = figure(page, "detection-heatmap-figure")["data"]
    assert false_alarms["name"] == FALSE_ALARM_ONLY  # the only other trace: TEST-B's false alarm, no "no data"
    assert None not in [cell for row in rates["z"] for cell in row]


def detection(bugs, detectors):
    """A detection table in which each bug (reproducer cpu) was detected by each detector in 1 of 1 runs."""
    return pd.DataFrame.from_records(
        [{column: 0 for column in DETECTION_COLUMNS} | {"bug": bug, "reproducer": "cpu", "detector": detector,
                                                        "buggy_runs": 1, "detected_runs": 1, "detection_rate": 1.0,
                                                        "outcome": "detected"}
         for bug in bugs for detector in detectors], columns=DETECTION_COLUMNS)


def test_long_row_labels_wrap_after_a_hyphen_and_nowhere_else():
    assert wrapped("PT-115607 (cpu)") == "PT-115607 (cpu)"
    assert wrapped("VERDICT-INCONSISTENT-SCALING (cpu)") == "VERDICT-INCONSISTENT-<br>SCALING (cpu)"
    assert wrapped("VERDICT-CONST-MUTATED-ONE-RANK (cuda)") == "VERDICT-CONST-MUTATED-<br>ONE-RANK (cuda)"
    assert wrapped("A-VERY-LONG-IDENTIFIER-WITHOUT-A-BREAK") == "A-VERY-LONG-<br>IDENTIFIER-WITHOUT-A-<br>BREAK"
    assert wrapped("ONEPARTLONGERTHANANYLINEOFLABEL (cpu)") == "ONEPARTLONGERTHANANYLINEOFLABEL<br>(cpu)"
    assert wrapped("<b>X</b>-Y") == "&lt;b&gt;X&lt;/b&gt;-Y"  # text, not plotly's markup


def test_heatmap_leaves_a_phone_room_for_its_cells_and_labels():
    """At 390 px the row labels took the width, only some detectors were named (overlapping) and the colour bar
    beside the cells was cut: labels wrap, every detector is named (upright when names would collide), the
    colour bar lies under the cells, and the height grows with the labels' lines."""
    detectors = ["cross_rank_consistency", "detect_anomaly", "differential", "grad_health", "loss_spike_megatron",
                 "loss_spike_zscore", "nan_inf", "param_not_updated", "plain", "traincheck", "traincheck_full"]
    bugs = ["DS-1801", "VERDICT-INCONSISTENT-SCALING", "VERDICT-ALLGATHER-AS-ALLREDUCE"]
    figure = detection_heatmap(detection(bugs, detectors)).figure
    layout, [rates] = figure["layout"], figure["data"]
    assert layout["xaxis"]["tickvals"] == detectors == rates["x"]  # plotly would skip some names on a phone
    assert layout["xaxis"]["autotickangles"][-1] == -90 and "tickangle" not in layout["xaxis"]
    assert layout["yaxis"]["tickvals"] == rates["y"] == ["DS-1801 (cpu)", "VERDICT-ALLGATHER-AS-ALLREDUCE (cpu)",
                                                         "VERDICT-INCONSISTENT-SCALING (cpu)"]
    lines = [line for text in layout["yaxis"]["ticktext"] for line in text.split("<br>")]
    assert len(lines) == 5 and max(len(line) for line in lines) <= LABEL_LINE
    assert layout["yaxis"]["automargin"] is True and layout["xaxis"]["automargin"] is True
    bar = rates["colorbar"]
    assert bar["orientation"] == "h" and bar["yref"] == "container" and bar["y"] == 0 and bar["len"] == 1
    assert "title" not in bar  # it overlapped the bar: the ticks say "detected"
    assert layout["margin"]["b"] >= bar["thickness"] + 30  # room for the bar and its ticks
    short = [f"PT-{number}" for number in range(10)]
    taller, one_line = (detection_heatmap(detection(short + more, detectors)).figure["layout"]["height"]
                        for more in (bugs[1:], ["PT-10", "PT-11"]))
    assert taller - one_line == 2 * ROW_HEIGHT  # two labels took a second line each


def false_positives(*rows):
    return pd.DataFrame.from_records([dict(zip(FALSE_POSITIVE_COLUMNS, row)) for row in rows],
                                     columns=FALSE_POSITIVE_COLUMNS)


def test_fp_rates_of_zero_are_dots_on_the_axis_with_their_upper_bound_as_whisker():
    chart = false_positive_chart(false_positives(("nan_inf", 40, 0, 0.0, 0.0, 0.088, None, None),
                                                 ("plain", 40, 0, 0.0, 0.0, 0.088, None, None)))
    [dots] = chart.figure["data"]
    layout = chart.figure["layout"]
    assert dots["y"] == [0.0, 0.0] and dots["cliponaxis"] is False  # drawn whole on the axis line
    assert dots["error_y"]["arrayminus"] == [0.0, 0.0] and dots["error_y"]["array"] == [0.088, 0.088]
    assert dots["text"] == ["0/40", "0/40"] and "markers" in dots["mode"] and "text" in dots["mode"]
    assert layout["yaxis"]["range"][0] == 0 and 0.088 < layout["yaxis"]["range"][1] < 0.2  # not up to 100 %
    assert "Wilson 95% interval" in layout["yaxis"]["title"]["text"] and layout["yaxis"]["tickformat"] == ".0%"


def test_fp_axis_reaches_the_highest_interval_bound_and_no_further_than_100_percent(client):
    make_runs()  # param_not_updated: 1 of 2 clean runs alarmed, Wilson [0.095, 0.905]; plain 0 of 1
    layout = figure(client.get("/results/").content.decode(), "false-positive-chart-figure")["layout"]
    assert layout["yaxis"]["range"][0] == 0 and 0.905 < layout["yaxis"]["range"][1] <= 1
    chart = false_positive_chart(false_positives(("guard", 100, 2, 0.02, 0.006, 0.07, None, None)))
    assert chart.figure["layout"]["yaxis"]["range"] == [0, pytest.approx(0.077)]


def test_latency_axis_starts_at_zero_steps_with_the_points_there_drawn_whole(client):
    make_runs()  # latencies 0, 2 and 4 steps
    chart = figure(client.get("/results/").content.decode(), "latency-chart-figure")
    layout, (box, points) = chart["layout"], chart["data"]
    low, high = layout["yaxis"]["range"]
    assert low == 0 and 4 < high < 5
    assert layout["yaxis"]["dtick"] == 1 and layout["yaxis"]["tick0"] == 0
    assert box["boxpoints"] is False and points["cliponaxis"] is False  # a box's points are cut at the axis
    assert layout["xaxis"]["ticktext"] == ["param_not_updated"] and layout["xaxis"]["tickvals"] == [0]
    assert box["x0"] == 0 and all(-0.3 < x < 0.3 for x in points["x"]) and len(set(points["x"])) == 3
    frame = pd.DataFrame({"detector": ["d", "d"], "bug": ["B-1"] * 2, "reproducer": ["cpu"] * 2, "seed": [0, 1],
                          "run": [1, 2], "latency_steps": [0, 300], "latency_seconds": [0.0, 3.0], "rule": ["r"] * 2})
    yaxis = latency_chart(frame).figure["layout"]["yaxis"]
    assert yaxis["range"][0] == 0 and 300 < yaxis["range"][1] < 330 and "dtick" not in yaxis  # plotly ticks it


def overhead(*ratios):
    """The overhead table as the results page reads it (None where a ratio is missing)."""
    return without_nan(pd.DataFrame.from_records([{"detector": name, "median_step_time_ratio": step,
                                                   "median_end_to_end_ratio": end_to_end}
                                                  for name, step, end_to_end in ratios]))


def test_overhead_bars_start_at_the_1x_line_so_a_faster_detector_hangs_below_it():
    chart = overhead_chart(overhead(("nan_inf", 0.886, 1.02), ("traincheck", 73.4, "<b>n/a</b>"),
                                    ("slow", 1234.5, 410.0)))
    step, end_to_end = chart.figure["data"]
    layout = chart.figure["layout"]
    assert layout["yaxis"]["type"] == "log"
    assert step["base"] == end_to_end["base"] == [1, 1, 1]
    assert [base + length for base, length in zip(step["base"], step["y"])] == pytest.approx([0.886, 73.4, 1234.5])
    assert step["y"][0] < 0 < step["y"][1]  # 0.886 is drawn from 1 down, 73.4 from 1 up
    assert step["customdata"] == [0.886, 73.4, 1234.5] and step["text"] == ["×0.886", "×73.4", "×1234"]
    assert end_to_end["y"][1] is None and end_to_end["text"][1] == ""  # not a number: no bar
    [baseline] = layout["shapes"]
    assert baseline["y0"] == baseline["y1"] == 1 and baseline["xref"] == "x domain"
    assert "faster" in layout["yaxis"]["title"]["text"]
    ticks = dict(zip(layout["yaxis"]["tickvals"], layout["yaxis"]["ticktext"]))
    assert ticks[0.5] == "×0.5" and ticks[1] == "×1" and ticks[100] == "×100"  # not plotly's bare "5" for 0.5


def test_stability_time_axis_spans_at_least_an_hour_in_utc_seconds(client):
    version = ReproducerVersionFactory()
    start = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    checks = [StabilityCheckFactory(reproducer_version=version) for _ in range(2)]
    for offset, check in enumerate(checks):  # seconds apart: plotly ticked this in fractions of a millisecond
        check.checked_at = start + timedelta(seconds=offset)
    chart = stability_chart(checks)
    xaxis = chart.figure["layout"]["xaxis"]
    assert chart.figure["data"][0]["x"] == ["2026-03-01 12:00:00", "2026-03-01 12:00:01"]
    first, last = (datetime.fromisoformat(moment) for moment in xaxis["range"])
    assert last - first >= SHORTEST_TIME_AXIS - timedelta(seconds=1)
    assert first < datetime(2026, 3, 1, 12, 0, 0) and last > datetime(2026, 3, 1, 12, 0, 1)
    assert xaxis["type"] == "date" and "UTC" in xaxis["title"]["text"]
    checks[1].checked_at = start + timedelta(days=10)  # a long history keeps its own span, with 5 % margins
    first, last = (datetime.fromisoformat(moment) for moment in stability_chart(checks).figure["layout"]["xaxis"]
                   ["range"])
    assert last - first == timedelta(days=11)


def test_plotly_is_served_gzipped_under_a_versioned_url_cached_for_a_year(client):
    url = reverse("plotly-js")
    assert get_plotlyjs_version() in url
    make_runs()
    assert f'<script src="{url}"></script>' in client.get("/results/").content.decode()

    compressed = client.get(url, headers={"accept-encoding": "gzip, deflate, br"})
    plain = client.get(url)
    assert compressed.status_code == plain.status_code == 200
    assert compressed["Content-Encoding"] == "gzip" and not plain.has_header("Content-Encoding")
    assert gzip.decompress(compressed.content) == plain.content
    assert len(compressed.content) < len(plain.content) / 3
    for response in (compressed, plain):
        assert response["Content-Type"] == "application/javascript"
        assert "Accept-Encoding" in response["Vary"]
        directives = {d.strip() for d in response["Cache-Control"].split(",")}
        assert {"public", "immutable", f"max-age={ONE_YEAR}"} <= directives


def test_every_page_has_a_favicon(client):
    page = client.get("/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
    icon = client.get("/static/favicon.svg")
    assert icon.status_code == 200 and b"<svg" in b"".join(icon.streaming_content)
    fallback = client.get("/favicon.ico")  # what a browser asks for on a page that names no icon
    assert fallback.status_code == 200 and b"".join(fallback.streaming_content)[:4] == b"\x00\x00\x01\x00"
