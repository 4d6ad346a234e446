"""The runs behind a count, as a readable page (/results/runs/, issue 33): exactly the runs a number counts (the
detections, the misses, the false alarms), judged as the tables judge them, 50 to a page; bad input is a clear 400
or a 404, never a 500."""
import pytest

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
