"""The runs behind a count, as a readable page (/results/runs/, issue 33): exactly the runs a number counts (the
detections, the misses, the false alarms), judged as the tables judge them, 50 to a page; bad input is a clear 400
or a 404, never a 500."""
import pytest
from django.utils import timezone

from evaluation import run_lists
from evaluation.tables import judged_runs
from runners.actions.detectors import do_record_detector
from runners.models import Campaign

from .factories import CampaignFactory, RunFactory
from .helpers import stored_evaluation, table

pytestmark = pytest.mark.django_db


def listed(client, **query):
    page = client.get("/results/runs/", query).content.decode()
    if 'id="no-runs"' in page:
        return page, []
    return page, [(row["Bug"].split("/")[0], row["Variant"], row["Detector"]) for row in table(page, "runs")]


def test_each_verdict_lists_exactly_the_runs_it_counts(client):
    evaluation = stored_evaluation()
    selection = {"evaluation": evaluation.pk, "detector": "grad_health"}
    page, runs = listed(client, **selection, variant="buggy", verdict="detected")
    assert runs == [("PUB-1", "buggy", "grad_health")] and "Detected buggy runs of grad_health" in page
    assert listed(client, **selection, variant="buggy", verdict="missed")[1] == [("PUB-2", "buggy", "grad_health")]
    alarmed = listed(client, **selection, variant="fixed", verdict="false-alarm")[1]
    assert alarmed == [("PUB-1", "fixed", "grad_health"), ("PUB-2", "fixed", "grad_health")]
    assert listed(client, evaluation=evaluation.pk, detector="nan_inf", verdict="false-alarm")[1] == []
    on_one_bug = listed(client, evaluation=evaluation.pk, bug="PUB-2", verdict="detected")[1]
    assert on_one_bug == [("PUB-2", "buggy", "nan_inf"), ("PUB-2", "buggy", "differential")]
    # the leaderboard's counts and their lists agree
    leaderboard = client.get("/leaderboard/", {"evaluation": evaluation.pk}).content.decode()
    row = next(row for row in table(leaderboard, "leaderboard") if row["Detector"] == "nan_inf")
    assert row["Bugs caught beyond the fixed twin"] == "2/2" and len(listed(
        client, evaluation=evaluation.pk, detector="nan_inf", verdict="detected")[1]) == 2


@pytest.mark.parametrize("query, status, said", [
    ({"detector": "nan_inf", "variant": "sideways"}, 400, "Invalid run list: variant is one of buggy, fixed."),
    ({"bug": "PUB-1", "verdict": "maybe"}, 400, "Invalid run list: verdict is one of detected, missed, false-alarm."),
    ({"verdict": "missed"}, 400, "judged for one detector or one bug: name either"),
    ({"detector": "a.b"}, 400, "detector is a detector's name"),
    ({"detector": "<script>"}, 400, "detector is a detector's name"),
    ({"evaluation": "999999"}, 404, ""),
    ({"campaign": "not-a-number"}, 404, ""),
    ({"page": "9999"}, 200, ""),
])
def test_bad_input_is_a_clear_error(client, query, status, said):
    stored_evaluation()
    response = client.get("/results/runs/", query)
    assert response.status_code == status and said in response.content.decode()


def test_a_selection_that_cannot_change_is_judged_once_and_an_open_one_at_each_request(client, monkeypatch):
    """The judged runs' IDs are kept while the selection cannot change (a stored evaluation, a completed campaign):
    with 25,000 runs judging them was most of a list's time. An open campaign's are judged anew each time."""
    judged = []
    monkeypatch.setattr(run_lists, "judged_runs", lambda runs: judged.append(1) or judged_runs(runs))
    evaluation = stored_evaluation()
    Campaign.objects.filter(pk=evaluation.campaign_id).update(completed_at=timezone.now())
    query = {"evaluation": evaluation.pk, "detector": "grad_health", "variant": "buggy", "verdict": "detected"}
    assert listed(client, **query)[1] == listed(client, **query)[1] == [("PUB-1", "buggy", "grad_health")]
    assert len(judged) == 1
    open_campaign = CampaignFactory(name="still running")
    RunFactory(campaign=open_campaign, detector=do_record_detector("grad_health"), status="succeeded", steps=10,
               trigger_step=3, trigger_time=100.0)
    RunFactory(campaign=open_campaign, detector=do_record_detector("grad_health"), status="queued", steps=10)
    for _ in range(2):
        listed(client, campaign=open_campaign.pk, detector="grad_health", verdict="missed")
    assert len(judged) == 3
