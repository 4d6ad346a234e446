"""The campaign builder (count and estimate before confirming), the live page, cancel and retry."""
import re

import pytest

from runners.actions import campaigns as campaign_actions
from runners.actions.campaigns import do_cancel_campaign, do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.forms import parse_seeds
from runners.models import Campaign, Run, RunStatus
from runners.plans import CampaignPlan

from .factories import (
    BugFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)
from .helpers import HOSTILE, client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def version():
    return ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-C", title=HOSTILE)),
                                    time_limit_seconds=30)


FORM = {"name": "nightly", "bugs": ["TEST-C"], "detectors": ["plain", "nan_inf"], "variants": ["buggy", "fixed"],
        "seeds": "0-2"}


def test_seeds_are_lists_and_ranges():
    assert parse_seeds("0-2, 7") == [0, 1, 2, 7]
    for bad in ("", "a", "5-1", "0-500"):
        with pytest.raises(Exception):
            parse_seeds(bad)


def test_contributors_cannot_open_the_builder(client, version):
    client.force_login(UserFactory())
    assert client.get("/campaigns/new/").status_code == 403
    assert client.post("/campaigns/new/", {**FORM, "confirm": "1"}).status_code == 403
    assert Campaign.objects.count() == 0


def test_preview_shows_the_run_count_and_estimate_then_confirm_queues(client, version,
                                                                      django_capture_on_commit_callbacks):
    RunFactory(reproducer_version=version, detector=do_record_detector("plain"), status="succeeded", wall_seconds=12.0)
    client.force_login(MaintainerFactory())
    page = client.post("/campaigns/new/", {**FORM, "preview": "1"}).content.decode()
    # 2 detectors x 2 variants x 3 seeds; plain from history (12 s), nan_inf from the reproducer's mean (12 s)
    assert "12 runs, about 3 min on one worker slot" in page
    assert Campaign.objects.count() == 0 and Run.objects.count() == 1
    assert HOSTILE not in page
    plan = re.search(r'name="plan" value="(\w+)"', page)[1]
    changed = client.post("/campaigns/new/", {**FORM, "seeds": "0-3", "plan": plan, "confirm": "1"})
    assert "The choices changed since the preview" in changed.content.decode() and Campaign.objects.count() == 0
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/campaigns/new/", {**FORM, "plan": plan, "confirm": "1"})
    campaign = Campaign.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/campaigns/{campaign.pk}/"
    assert campaign.runs.count() == 12 and len(callbacks) == 1


def test_estimate_guesses_without_history(version):
    estimate = CampaignPlan.build([version], [do_record_detector("plain")], ["buggy", "fixed"], [0]).estimate()
    assert estimate == {"runs": 2, "seconds": 20, "guessed_runs": 2}


def test_cancel_and_retry_from_the_campaign_page(client, version, django_capture_on_commit_callbacks):
    maintainer = MaintainerFactory()
    campaign = do_create_campaign("c",
                                  CampaignPlan.build([version], [do_record_detector("plain")], ["buggy", "fixed"],
                                                     [0, 1]), enqueue=False, acting_user=maintainer)
    running, failed, *queued = campaign.runs.order_by("id")
    Run.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING)
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.FAILED, failure_reason=f"Crashed: {HOSTILE}")
    client.force_login(maintainer)
    page = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert 'data-live="true"' in page and "Failures" in page and "Crashed: &lt;script&gt;" in page
    assert HOSTILE not in page
    live = client.get(f"/campaigns/{campaign.pk}/live/?status=failed").content.decode()
    assert live.count("/runs/") == 2  # the failure list and the one failed row

    client.force_login(UserFactory())
    assert client.post(f"/campaigns/{campaign.pk}/cancel/").status_code == 403
    client.force_login(maintainer)
    client.post(f"/campaigns/{campaign.pk}/cancel/")
    statuses = dict(campaign.runs.values_list("id", "status"))
    assert [statuses[r.pk] for r in queued] == ["cancelled", "cancelled"]
    assert statuses[running.pk] == "running"  # executing runs finish
    campaign.refresh_from_db()
    assert campaign.state == "cancelled" and campaign.completed_at is None
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        client.post(f"/campaigns/{campaign.pk}/retry/")
    statuses = dict(campaign.runs.values_list("id", "status"))
    assert sorted(statuses.values()) == ["queued", "queued", "queued", "running"] and len(callbacks) == 1
    campaign.refresh_from_db()
    assert campaign.state == "running"


def test_campaign_api_previews_cancels_and_retries(version):
    maintainer = MaintainerFactory()
    body = {"name": "api", "bugs": ["TEST-C"], "detectors": ["plain"], "seeds": [0, 1]}
    response = client_for(maintainer).post("/api/campaigns/preview/", body, format="json")
    assert response.status_code == 200 and response.json()["runs"] == 4 and Campaign.objects.count() == 0
    assert client_for(UserFactory()).post("/api/campaigns/preview/", body, format="json").status_code == 403
    campaign = do_create_campaign("c", CampaignPlan.build([version], [do_record_detector("plain")]), enqueue=False,
                                  acting_user=maintainer)
    assert client_for(UserFactory()).post(f"/api/campaigns/{campaign.pk}/cancel/").status_code == 403
    response = client_for(maintainer).post(f"/api/campaigns/{campaign.pk}/cancel/")
    assert response.status_code == 200 and len(response.json()["runs"]) == 2
    assert client_for().get(f"/api/campaigns/{campaign.pk}/").json()["state"] == "cancelled"
    response = client_for(maintainer).post(f"/api/campaigns/{campaign.pk}/retry/")
    assert len(response.json()["runs"]) == 2
    assert set(campaign.runs.values_list("status", flat=True)) == {"queued"}


def test_a_cancelled_campaign_completes_when_nothing_runs(version):
    campaign = do_create_campaign("c", CampaignPlan.build([version], [do_record_detector("plain")]), enqueue=False,
                                  acting_user=None)
    do_cancel_campaign(campaign, acting_user=None)
    campaign.refresh_from_db()
    assert campaign.completed_at is not None and campaign.state == "cancelled"
    assert set(campaign.runs.values_list("failure_reason", flat=True)) == {
        "Cancelled by the system before it started."}


def test_cancelling_with_nothing_queued_changes_nothing(version):
    campaign = do_create_campaign("c", CampaignPlan.build([version], [do_record_detector("plain")]), enqueue=False,
                                  acting_user=None)
    Run.objects.filter(campaign=campaign).update(status=RunStatus.RUNNING)
    assert do_cancel_campaign(campaign, acting_user=MaintainerFactory()) == []
    campaign.refresh_from_db()
    assert campaign.cancelled_at is None and campaign.state == "running"


def test_a_retried_verification_replaces_its_stability_check(version):
    from runners.actions.campaigns import do_complete_campaign, do_retry_failed_runs, do_start_verification
    from runners.models import StabilityCheck

    campaign = do_start_verification([version], seeds=1, acting_user=MaintainerFactory())
    buggy, fixed = campaign.runs.order_by("variant")
    Run.objects.filter(pk=buggy.pk).update(status=RunStatus.SUCCEEDED, manifested=True)
    Run.objects.filter(pk=fixed.pk).update(status=RunStatus.FAILED, failure_reason="worker lost")
    assert do_complete_campaign(campaign)
    assert StabilityCheck.objects.get(campaign=campaign).verdict == "flaky"
    do_retry_failed_runs(campaign, acting_user=None)
    Run.objects.filter(pk=fixed.pk).update(status=RunStatus.SUCCEEDED, manifested=False)
    assert do_complete_campaign(campaign)
    assert [check.verdict for check in StabilityCheck.objects.filter(campaign=campaign)] == ["verified"]
    assert version.reproducer.bug.__class__.objects.get(pk=version.reproducer.bug_id).status == "verified"


def test_runs_are_queued_a_column_at_a_time_in_the_plans_order(version, monkeypatch,
                                                                 django_capture_on_commit_callbacks):
    """A seed's matrix, detector by detector, every program under one before the next: the order the queues keep."""
    other = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-D")))
    detectors = [do_record_detector("plain"), do_record_detector("nan_inf")]
    plan = CampaignPlan.build([version, other], detectors, ["buggy", "fixed"], [0, 1])
    sent = []
    monkeypatch.setattr(campaign_actions.current_app, "send_task", lambda name, args, queue: sent.append(args[0]))
    with django_capture_on_commit_callbacks(execute=True):
        campaign = do_create_campaign("ordered", plan, acting_user=MaintainerFactory())
    runs = {run.pk: run for run in campaign.runs.select_related("detector", "reproducer_version__reproducer__bug")}
    order = [(runs[pk].seed, runs[pk].detector.name, runs[pk].reproducer_version.reproducer.bug.bug_id,
              runs[pk].variant) for pk in sent]
    assert sorted(sent) == sent and len(sent) == 16
    assert order[:4] == [(0, "plain", "TEST-C", "buggy"), (0, "plain", "TEST-C", "fixed"),
                         (0, "plain", "TEST-D", "buggy"), (0, "plain", "TEST-D", "fixed")]
    assert [row[:2] for row in order[4:8]] == [(0, "nan_inf")] * 4 and order[8][:2] == (1, "plain")
