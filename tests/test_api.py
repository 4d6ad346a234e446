"""REST API: reading is open, triggering runs is a maintainer's right (token or session)."""
import pytest
from django.urls import reverse

from accounts.models import ApiToken
from runners.models import Campaign, Run

from .factories import (
    AlarmFactory,
    BugFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)
from .helpers import client_for

pytestmark = pytest.mark.django_db

CAMPAIGN = {"name": "api campaign", "bugs": ["TEST-API"], "detectors": ["plain", "nan_inf"], "seeds": [0, 1]}


@pytest.fixture
def bug():
    bug = BugFactory(bug_id="TEST-API", framework="deepspeed", multi_rank=True)
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug))
    return bug


def test_anonymous_can_list_and_filter_bugs(bug):
    BugFactory(bug_id="TEST-OTHER", framework="pytorch")
    response = client_for().get("/api/bugs/", {"framework": "deepspeed"})
    assert response.status_code == 200
    assert [b["id"] for b in response.json()["results"]] == ["TEST-API"]
    assert client_for().get("/api/bugs/TEST-API/").json()["reproducers"][0]["name"] == "cpu"


def test_anonymous_cannot_trigger(bug):
    response = client_for().post("/api/campaigns/", CAMPAIGN, format="json")
    assert response.status_code == 401
    assert Campaign.objects.count() == 0 and Run.objects.count() == 0


def test_contributor_cannot_trigger(bug):
    response = client_for(UserFactory()).post("/api/campaigns/", CAMPAIGN, format="json")
    assert response.status_code == 403
    assert Run.objects.count() == 0


def test_maintainer_triggers_a_campaign_with_a_token(bug, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client_for(MaintainerFactory()).post("/api/campaigns/", CAMPAIGN, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["progress"]["total"] == 8  # 1 reproducer x 2 variants x 2 seeds x 2 detectors
    assert Run.objects.filter(status="queued").count() == 8
    assert len(callbacks) == 1  # runs are enqueued only once the transaction commits


def test_unapproved_code_cannot_be_triggered(bug):
    bug.reproducers.get().versions.update(review_state="pending")
    response = client_for(MaintainerFactory()).post("/api/campaigns/", CAMPAIGN, format="json")
    assert response.status_code == 400
    assert "no approved CPU reproducer" in str(response.json())
    assert Run.objects.count() == 0


def test_unknown_detector_is_a_clear_400(bug):
    response = client_for(MaintainerFactory()).post(
        "/api/campaigns/", {**CAMPAIGN, "detectors": ["crystal_ball"]}, format="json")
    assert response.status_code == 400
    assert "unknown detector 'crystal_ball'" in str(response.json())


def test_token_endpoint_issues_tokens():
    user = UserFactory(username="alice")
    response = client_for().post(reverse("api-token"), {"username": "alice", "password": "a-long-test-password"})
    assert response.status_code == 201
    assert ApiToken.hash_secret(response.json()["token"]) == ApiToken.objects.get(user=user).key_hash


def test_schema_and_docs_are_served():
    schema = client_for().get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/campaigns/" in schema.content
    assert client_for().get("/api/docs/").status_code == 200


def test_runs_list_counts_alarms_in_one_query(django_assert_max_num_queries):
    for _ in range(5):
        AlarmFactory(run=RunFactory(), step=1, rule="r", message="m")
    with django_assert_max_num_queries(3):  # what is hidden, the page, its runs not serialized yet: none per run
        runs = client_for().get("/api/runs/").json()["results"]
    assert [run["alarm_count"] for run in runs] == [1] * 5
