"""The plots drawn by a real browser from the gzipped plotly.js, under the Content-Security-Policy (the page
fixture fails the test on anything it refused), and no request of the pages answered 404 (the favicon)."""
import pytest

from ..factories import BugFactory, CampaignFactory, EvaluationFactory, ReproducerVersionFactory, StabilityCheckFactory
from ..helpers import make_runs
from .helpers import wait_for_plot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OVERHEAD = [{"detector": "nan_inf", "pairs": 5, "pairs_planned": 5, "median_step_time_ratio": 0.886,
             "median_end_to_end_ratio": 1.02}]


def test_plots_draw_from_compressed_plotly_and_no_request_is_missing(page):
    make_runs()  # a heatmap cell never run, FP rates of 0 and 0.5, latencies from 0 steps
    version = ReproducerVersionFactory(reproducer__bug=BugFactory(bug_id="TEST-S"))
    StabilityCheckFactory(reproducer_version=version)
    statuses = []
    page.on("response", lambda response: statuses.append((response.status, response.url)))

    with page.expect_response(lambda response: "/vendor/plotly-" in response.url) as plotly:
        page.goto("/results/")
    assert plotly.value.headers["content-encoding"] == "gzip"
    assert "immutable" in plotly.value.headers["cache-control"]
    assert plotly.value.request.sizes()["responseBodySize"] < 2_000_000  # the whole plotly.min.js is 4.8 MB
    for chart in ("#detection-heatmap", "#false-positive-chart", "#latency-chart"):
        wait_for_plot(page, chart)
    assert "no data (not run)" in page.locator("#detection-heatmap .legendtext").all_text_contents()
    assert page.locator("#latency-chart .scatterlayer .point").count() == 3  # every detected run, none cut off

    EvaluationFactory(campaign=CampaignFactory(name="evaluation"), parameters={"runs": 0},
                      tables={"detection": [], "false_positives": [], "latency": [], "overhead": OVERHEAD})
    page.goto("/results/")  # now the stored evaluation's tables
    wait_for_plot(page, "#overhead-chart")
    assert "×0.886" in page.locator("#overhead-chart .bartext").all_text_contents()
    page.goto("/bugs/TEST-S/")
    wait_for_plot(page, "#stability-chart")
    ticks = page.locator("#stability-chart .xtick text").all_text_contents()
    assert ticks and not any("." in tick for tick in ticks)  # whole minutes, no fractions of a second

    page.wait_for_load_state("load")
    assert [url for status, url in statuses if status == 404] == []
    assert page.request.get("/favicon.ico").status == 200
