"""The results page says what it shows (issue 16): which selection (a stored evaluation, a campaign, or every run
when none is stored), how many runs, their seeds and environments; one selection is active at a time; the matrix
outcome narrows the sections it is about and says which; empty sections say what to do."""
import re

import pytest
from django.utils.html import strip_tags

from .factories import CampaignFactory, EnvironmentFactory, EvaluationFactory
from .helpers import make_runs, table

pytestmark = pytest.mark.django_db


def text(response):
    return " ".join(strip_tags(response.content.decode()).split())


def select(page, name):
    """(disabled, [values of the selected options]) of a select of the page."""
    found = re.search(rf'<select name="{name}" id="{name}"([^>]*)>(.*?)</select>', page, re.S)
    return "disabled" in found.group(1), re.findall(r'<option value="([^"]*)" selected>', found.group(2))


@pytest.fixture
def campaign():
    made = CampaignFactory(name="nightly")
    make_runs(campaign=made, environment=EnvironmentFactory(host="box-1", torch="2.13.0"))
    return made


def test_without_a_stored_evaluation_the_page_says_it_shows_every_run(client, campaign):
    assert "No stored evaluation: showing all 8 runs you may see, from every campaign" in text(client.get("/results/"))
    narrowed = text(client.get("/results/", {"detector": "plain"}))
    assert "No stored evaluation: showing all runs you may see, from every campaign, judged now (2 match the filter)" \
        in narrowed
    EvaluationFactory(campaign=campaign)
    stored = text(client.get("/results/"))
    assert "No stored evaluation" not in stored and "Stored tables of evaluation #" in stored


def test_the_page_says_how_many_runs_which_seeds_and_where_they_ran(client, campaign):
    page = text(client.get("/results/", {"campaign": campaign.pk}))
    assert "Live tables of campaign nightly" in page
    assert ("8 runs, 8 of them succeeded (only succeeded runs are judged) · seeds 0, 1 · torch 2.13.0 on 1 host "
            "(box-1)") in page
    assert "it has not finished" in page


def test_one_selection_is_active_at_a_time(client, campaign):
    evaluation = EvaluationFactory(campaign=CampaignFactory(name="evaluation"))
    by_evaluation = client.get("/results/", {"evaluation": evaluation.pk}).content.decode()
    assert select(by_evaluation, "evaluation") == (False, [str(evaluation.pk)])
    assert select(by_evaluation, "campaign") == (False, [])

    by_campaign = client.get("/results/", {"campaign": campaign.pk}).content.decode()
    assert select(by_campaign, "evaluation") == (True, [])
    assert select(by_campaign, "campaign") == (False, [str(campaign.pk)])
    assert "ignored" not in text(client.get("/results/", {"campaign": campaign.pk}))

    both = client.get("/results/", {"campaign": campaign.pk, "evaluation": evaluation.pk})
    assert select(both.content.decode(), "evaluation") == (True, [])
    assert (f"Both evaluation #{evaluation.pk} and a campaign were asked for: the campaign is shown, the evaluation "
            "ignored.") in text(both)


def test_the_outcome_narrows_the_matrix_and_the_latency_and_says_what_it_leaves(client, campaign):
    everything = client.get("/results/").content.decode()
    assert table(everything, "latency")
    missed = client.get("/results/", {"outcome": "missed"})
    page = missed.content.decode()
    assert {row["Bug / reproducer"] for row in table(page, "detection-matrix")} == {"TEST-A cpu"}
    assert [row["Detector"] for row in table(page, "latency")] == [
        'No latency: the matrix outcome "missed" leaves no detected run.']
    assert table(page, "false-positives") == table(everything, "false-positives")  # clean runs: not narrowed
    assert "Not narrowed by the matrix outcome: every clean run of the selection counts." in text(missed)
    assert 'The matrix outcome "missed" is a verdict on a bug\'s buggy runs under a detector' in text(missed)
    assert "showing all 8 runs you may see" in text(missed)  # the outcome selects matrix rows, not runs
    assert client.get("/results/latency.json", {"outcome": "missed"}).json() == []
    detected = client.get("/results/", {"outcome": "detected"}).content.decode()
    assert table(detected, "latency") == table(everything, "latency")


def test_empty_sections_say_what_to_do(client):
    page = text(client.get("/results/"))
    assert "No runs in this selection: queue a campaign" in page
    assert "No clean run has succeeded in this selection: campaigns with the fixed variant or clean pipelines" in page
    assert "no environment recorded (no run has started)" in page
    make_runs()
    filtered = text(client.get("/results/", {"bug": "TEST-A", "outcome": "no data"}))
    assert "No matrix row matches the filter: loosen it or reset it." in filtered


def test_the_matrix_is_shown_once_its_table_one_click_away(client, campaign):
    page = client.get("/results/", {"campaign": campaign.pk}).content.decode()
    assert page.count('id="detection-heatmap"') == 1 and page.count('id="detection-matrix"') == 1
    folded = re.search(r'<details id="matrix-as-table"( open)?><summary>The same matrix as a table', page)
    assert folded and folded.group(1) is None and page.index("matrix-as-table") < page.index('id="detection-matrix"')
    empty = client.get("/results/", {"bug": "TEST-A", "outcome": "no data"}).content.decode()
    assert '<details id="matrix-as-table" open>' in empty  # what to do is said, not folded away
