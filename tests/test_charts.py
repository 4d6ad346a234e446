"""The results plots and the stability history: each figure's numbers equal the table beside it."""
import json
import statistics

import pytest

from runners.actions.detectors import do_record_detector
from runners.models import Alarm

from .factories import (
    BugFactory,
    CampaignFactory,
    EnvironmentFactory,
    EvaluationFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    StabilityCheckFactory,
)
from .helpers import HOSTILE, make_runs, table

pytestmark = pytest.mark.django_db


def figure(page, figure_id):
    return json.loads(page.split(f'id="{figure_id}" type="application/json">', 1)[1].split("</script>", 1)[0])


def number(text):
    return None if text == "–" else float(text)


@pytest.fixture
def runs():
    return make_runs()


def test_heatmap_cells_equal_its_table_and_the_detection_export(client, runs):
    page = client.get("/results/").content.decode()
    heatmap, *layers = figure(page, "detection-heatmap-figure")["data"]
    rows = table(page, "detection-heatmap-table")
    exported = client.get("/results/detection.json").json()
    assert len(rows) == len(exported) == 4  # (A, B, B/cuda) x guard + A x plain
    for row in rows:
        x, y = heatmap["x"].index(row["detector"]), heatmap["y"].index(f"{row['bug']} ({row['reproducer']})")
        assert heatmap["z"][y][x] == number(row["detection rate"])
        words = "".join(trace["text"][y][x] for trace in [heatmap, *layers])  # a cell's words are drawn once
        assert words.startswith(f"{row['detected runs']}/{row['buggy runs']}")
        assert row["outcome"] in heatmap["customdata"][y][x]
    cell = {(r["bug"], r["reproducer"], r["detector"]): r for r in exported}[("TEST-A", "cpu", "param_not_updated")]
    assert (cell["detected_runs"], cell["buggy_runs"]) == (2, 2)
    assert heatmap["z"][heatmap["y"].index("TEST-A (cpu)")][heatmap["x"].index("param_not_updated")] == 1.0
    assert heatmap["z"][heatmap["y"].index("TEST-B (cpu)")][heatmap["x"].index("plain")] is None  # not run


def test_false_positive_bars_and_wilson_error_bars_equal_the_table(client, runs):
    page = client.get("/results/").content.decode()
    bars = figure(page, "false-positive-chart-figure")["data"][0]
    rows = table(page, "false-positives")
    assert bars["x"] == [row["Detector"] for row in rows] == ["param_not_updated", "plain"]
    for i, row in enumerate(rows):
        low, high = (float(v) for v in row["Wilson 95% CI"].strip("[]").split(","))
        assert bars["y"][i] == float(row["FP rate"])
        assert bars["y"][i] + bars["error_y"]["array"][i] == pytest.approx(high)
        assert bars["y"][i] - bars["error_y"]["arrayminus"][i] == pytest.approx(low)
    assert bars["y"][0] == 0.5 and bars["y"][1] == 0.0  # 1 of 2 clean runs alarmed; plain never alarms


def test_latency_points_are_the_detected_runs_and_give_the_table_medians(client, runs):
    page = client.get("/results/").content.decode()
    traces = figure(page, "latency-chart-figure")["data"]
    boxes = {trace["name"]: trace for trace in traces if trace["type"] == "box"}
    points = {trace["name"]: trace for trace in traces if trace["type"] == "scatter"}
    rows = table(page, "latency-chart-table")
    assert set(boxes) == set(points) == {"param_not_updated"}
    assert sorted(points["param_not_updated"]["y"]) == sorted(boxes["param_not_updated"]["y"]) \
        == sorted(int(r["latency steps"]) for r in rows) == [0, 2, 4]
    assert {r["run"] for r in rows} == {str(runs[k].pk) for k in ("detected", "detected_seed_1", "cuda")}
    summary = {row["Detector"]: row for row in table(page, "latency")}["param_not_updated"]
    assert float(summary["Median steps"]) == statistics.median(boxes["param_not_updated"]["y"]) == 2
    assert float(summary["Max steps"]) == max(boxes["param_not_updated"]["y"]) == 4


def test_overhead_bars_equal_the_stored_table(client):
    overhead = [{"detector": "nan_inf", "pairs": 5, "pairs_planned": 5, "median_step_time_ratio": 1.07,
                 "median_end_to_end_ratio": 1.2},
                {"detector": "traincheck_full", "pairs": 5, "pairs_planned": 5, "median_step_time_ratio": 73.4,
                 "median_end_to_end_ratio": 80.1}]
    do_record_detector("traincheck_full")  # the filter offers the detectors the database knows
    EvaluationFactory(campaign=CampaignFactory(name="evaluation"), parameters={"runs": 0},
                      tables={"detection": [], "false_positives": [], "latency": [], "overhead": overhead})
    page = client.get("/results/").content.decode()
    chart = figure(page, "overhead-chart-figure")
    step, end_to_end = chart["data"]
    assert chart["layout"]["yaxis"]["type"] == "log"
    rows = table(page, "overhead")
    assert step["x"] == end_to_end["x"] == [row["Detector"] for row in rows]
    assert step["customdata"] == [float(row["Step-time ratio"]) for row in rows] == [1.07, 73.4]
    assert end_to_end["customdata"] == [float(row["End-to-end ratio"]) for row in rows] == [1.2, 80.1]
    for bars in (step, end_to_end):  # each bar runs from 1 to its ratio (tests/test_charts_layout.py)
        assert [base + length for base, length in zip(bars["base"], bars["y"])] == pytest.approx(bars["customdata"])
    detector_only = figure(client.get("/results/", {"detector": "traincheck_full"}).content.decode(),
                           "overhead-chart-figure")
    assert detector_only["data"][0]["x"] == ["traincheck_full"]


def test_plots_follow_the_filter(client, runs):
    page = client.get("/results/", {"bug": "TEST-B"}).content.decode()
    assert figure(page, "detection-heatmap-figure")["data"][0]["y"] == ["TEST-B (cpu)", "TEST-B (cuda)"]
    assert [sorted(trace["y"]) for trace in figure(page, "latency-chart-figure")["data"]] == [[4], [4]]  # box, points
    bars = figure(page, "false-positive-chart-figure")["data"][0]
    assert bars["x"] == ["param_not_updated"] and bars["y"] == [1.0]  # TEST-B's one clean run alarmed
    empty = client.get("/results/", {"outcome": "missed"}).content.decode()
    assert "Nothing to plot for this selection." in empty


def environment(host, torch, gpu=""):
    return EnvironmentFactory(fingerprint=f"{host}-{torch}-{gpu}", host=host, torch=torch, gpu=gpu, python="3.11.7")


def test_stability_history_on_the_bug_page(client):
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-S")))
    old, new = environment("box", "2.1.2"), environment(HOSTILE, "2.4.1", "NVIDIA A100")
    for env, buggy, fixed, verdict in ((old, 5, 0, "verified"), (new, 3, 1, "flaky"), (new, 5, 0, "verified")):
        StabilityCheckFactory(reproducer_version=version, environment=env, seeds=5, buggy_manifested=buggy,
                              fixed_manifested=fixed, verdict=verdict)
    page = client.get("/bugs/TEST-S/").content.decode()
    assert "<script>alert" not in page
    chart = figure(page, "stability-chart-figure")
    traces = {trace["name"]: trace for trace in chart["data"]}
    new_label = "torch 2.4.1 · NVIDIA A100 · &lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;"
    assert set(traces) == {"buggy · torch 2.1.2 · CPU · box", "fixed · torch 2.1.2 · CPU · box",
                           f"buggy · {new_label}", f"fixed · {new_label}"}
    assert traces[f"buggy · {new_label}"]["y"] == [0.6, 1.0]
    assert traces[f"fixed · {new_label}"]["y"] == [0.2, 0.0]
    rows = table(page, "stability-chart-table")
    assert [(r["buggy manifested"], r["fixed manifested"], r["verdict"]) for r in rows] == [
        ("5/5", "0/5", "Verified"), ("3/5", "1/5", "Flaky"), ("5/5", "0/5", "Verified")]
    plotted = sorted(y for name, trace in traces.items() if name.startswith("buggy") for y in trace["y"])
    assert plotted == sorted(int(r["buggy manifested"].split("/")[0]) / 5 for r in rows)
    assert "No stability check yet." in client.get(f"/bugs/{BugFactory().bug_id}/").content.decode()


def test_hostile_text_in_plots_is_text(client):
    make_runs(bug_title=HOSTILE, rule=HOSTILE, environment=environment(HOSTILE, "2.4.1"))
    page = client.get("/results/").content.decode()
    assert "<script>alert" not in page
    box, points = figure(page, "latency-chart-figure")["data"]
    points = points["text"]
    assert all("&lt;script&gt;" in text and "<script>" not in text for text in points)  # plotly shows it literally
    run_page = client.get(f"/runs/{Alarm.objects.first().run_id}/").content.decode()
    assert "<script>alert" not in run_page
    assert "&lt;script&gt;" in figure(run_page, "loss-figure")["data"][1]["text"][0]


def test_a_huge_latency_plot_keeps_every_value_but_draws_and_lists_fewer_points():
    import pandas as pd

    from evaluation.charts import POINTS_SHOWN, latency_chart

    many = POINTS_SHOWN + 500
    frame = pd.DataFrame({"detector": ["d"] * many, "bug": ["B-1"] * many, "reproducer": ["cpu"] * many,
                          "seed": range(many), "run": range(many), "latency_steps": [1] * many,
                          "latency_seconds": [0.1] * many, "rule": ["r"] * many})
    chart = latency_chart(frame)
    [trace] = chart.figure["data"]  # the box alone, no points trace
    assert trace["type"] == "box" and len(trace["y"]) == many and trace["boxpoints"] == "outliers"
    assert len(chart.rows) == POINTS_SHOWN and chart.rows_total == many and chart.rows_cut


def test_the_loss_chart_takes_a_huge_loss_that_the_database_gave_back_as_an_integer():
    """PostgreSQL's jsonb writes 1e36 without an exponent, so it comes back as a Python int past 64 bits, which
    plotly's JSON engine refused (a 500 on the run page of a mutant whose weight's top exponent bit flipped)."""
    from types import SimpleNamespace

    from runners.charts import loss_figure

    run = SimpleNamespace(variant="buggy", trigger_step=1, step_records=[
        {"step": 0, "rank": 0, "loss": 2.0}, {"step": 1, "rank": 0, "loss": 10 ** 36}])
    figure = loss_figure([(run, [])])
    assert figure["data"][0]["y"] == [2.0, 1e36]
