"""The front door (issue 33): what SilentBench measures in two sentences, the top of the latest stored evaluation's
leaderboard with Wilson intervals for detection and false alarms, one plot of detection against false alarms, a
citation, and the way on; the catalog at /catalog/."""
import json
import re

import pytest
from django.urls import reverse

from evaluation.actions import do_publish_evaluation

from .helpers import stored_evaluation, table

pytestmark = pytest.mark.django_db


def figure(page, figure_id):
    return json.loads(re.search(rf'<script id="{figure_id}" type="application/json">(.*?)</script>', page,
                                re.S).group(1))


def test_a_newcomer_reads_what_is_measured_and_the_ranked_top_with_intervals(client, tmp_path):
    evaluation = stored_evaluation()
    do_publish_evaluation(evaluation, tmp_path, acting_user=None)
    page = client.get("/").content.decode()
    intro = " ".join(re.search(r'<section id="intro">(.*?)</section>', page, re.S).group(1).split())
    assert "measures how well error detectors catch <em>silent training errors</em>" in intro
    for url in (reverse("bugs:list"), reverse("methodology"), reverse("bugs:submit"),
                reverse("runners:submit_detector")):
        assert f'href="{url}"' in intro
    rows = table(page, "headline-leaderboard")
    # nan_inf caught both bugs (2/2: Wilson [0.342, 1.0]); grad_health one of two, with a false alarm on every
    # fixed run. The opt-in differential is not in the drop-in headline.
    assert [(row["Rank"], row["Detector"], row["Bugs caught beyond the fixed twin"],
             row["Detection rate [Wilson 95%]"]) for row in rows] == [
        ("1", "nan_inf", "2/2", "1.0 [0.342, 1.0]"), ("2", "grad_health", "1/2", "0.5 [0.095, 0.905]")]
    assert rows[1]["FP rate per clean run [Wilson 95%]"] == "1.0 [0.342, 1.0]"
    source = " ".join(re.search(r'id="headline-source">(.*?)</p>', page, re.S).group(1).split())
    assert f"Published evaluation <a href=\"{evaluation.get_absolute_url()}\">{evaluation.published_id}</a>" in source
    assert "commit <code>abc123</code>" in source and "on eval-host" in source
    assert f"title = {{SilentBench evaluation {evaluation.published_id}}}" in page


def test_the_plot_puts_each_detector_at_its_detection_and_false_alarm_rate(client):
    stored_evaluation()
    plot = figure(client.get("/").content.decode(), "detection-against-false-positives-figure")
    points = {trace["name"]: dict(zip(trace["hovertext"], zip(trace["x"], trace["y"], strict=True), strict=True))
              for trace in plot["data"]}
    assert points == {"drop-in": {"nan_inf": (0.0, 1.0), "grad_health": (1.0, 0.5)},
                      "opt-in (ranked apart)": {"differential": (0.0, 1.0)}}
    whiskers = plot["data"][0]["error_y"]
    assert whiskers["array"][1] == pytest.approx(0.405) and whiskers["arrayminus"][1] == pytest.approx(0.405)
    # named from left to right, above and below their points in turn; the height reaches the highest whisker's top
    assert plot["data"][0]["textposition"] == ["top center", "bottom center"]
    assert plot["layout"]["yaxis"]["range"] == [-0.03, 1.03]


def test_with_nothing_stored_the_front_door_says_how_to_get_numbers(client):
    page = client.get("/").content.decode()
    assert "No evaluation is stored yet" in page and "<code>manage.py load_results</code>" in page
    assert 'id="headline-leaderboard"' not in page and "detection-against-false-positives" not in page
    assert client.get("/catalog/").status_code == 200


def test_the_citation_names_the_address_each_reader_used(client):
    stored_evaluation()
    first = client.get("/", HTTP_HOST="127.0.0.1").content.decode()
    second = client.get("/", HTTP_HOST="localhost").content.decode()
    assert "howpublished = {http://127.0.0.1/results/" in first
    assert "howpublished = {http://localhost/results/" in second  # not the first reader's, kept
