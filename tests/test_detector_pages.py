"""Detector pages (issue 33): /detectors/<name>/ says what the detector is, how it fares in the latest stored
evaluation with intervals, which bugs it caught and missed, its false alarms, its standing over the stored
evaluations and its code; the leaderboard links each name to it."""
import json
import re

import pytest

from evaluation.actions import do_store_evaluation
from runners.models import Run

from .helpers import stored_evaluation, table

pytestmark = pytest.mark.django_db


def test_a_detector_page_gives_its_standing_its_bugs_and_its_code(client):
    evaluation = stored_evaluation()
    page = client.get("/detectors/grad_health/").content.decode()
    about = " ".join(re.search(r'<section id="about".*?</section>', page, re.S).group(0).split())
    assert "<strong>drop-in</strong>" in about and 'href="/docs/detectors/"' in about
    standing = " ".join(re.search(r'<section id="standing".*?</section>', page, re.S).group(0).split())
    assert f"Evaluation <a href=\"{evaluation.get_absolute_url()}\">#{evaluation.pk}</a>" in standing
    assert "rank 2 among the drop-in detectors" in standing
    assert "1/2</a> (0.5, Wilson 95% [0.095, 0.905]); raw detections 1/2" in standing
    assert "2/2 clean runs</a> alarmed: 1.0 [0.342, 1.0]" in standing
    assert [row["Bug"] for row in table(page, "caught")] == ["PUB-1"]
    assert [row["Bug"] for row in table(page, "missed")] == ["PUB-2"]
    assert [(row["Bug"], row["False alarms"]) for row in table(page, "false-alarms")] == [
        ("PUB-1", "1/1 fixed"), ("PUB-2", "1/1 fixed")]
    versions = table(page, "detector-history")
    assert len(versions) == 1 and versions[0]["Submitted by"] == "SilentBench (built-in)"
    assert Run.objects.filter(detector__name="grad_health").first().detector.code_hash[:12] in page
    assert "One stored evaluation so far" in page


def test_the_history_plot_follows_the_stored_evaluations(client):
    first = stored_evaluation()
    do_store_evaluation(first.campaign, None, [], [], {"seeds": 1}, 1.0, acting_user=None)  # the same runs again
    page = client.get("/detectors/nan_inf/").content.decode()
    figure = json.loads(re.search(r'<script id="detector-history-chart-figure" type="application/json">(.*?)</script>',
                                  page, re.S).group(1))
    assert figure["data"][0]["y"] == [1.0, 1.0] and len(figure["data"][0]["x"]) == 2


def test_unknown_detectors_are_a_404_and_the_old_address_redirects(client):
    assert client.get("/detectors/no_such_detector/").status_code == 404
    response = client.get("/leaderboard/detectors/nan_inf/")
    assert response.status_code == 301 and response["Location"] == "/detectors/nan_inf/"
    assert client.get("/detectors/nan_inf/").status_code == 200  # registered: a page before any run


def test_the_leaderboard_links_each_detector_to_its_page(client):
    stored_evaluation()
    page = client.get("/leaderboard/").content.decode()
    assert '<a href="/detectors/nan_inf/" title="Its page' in page
