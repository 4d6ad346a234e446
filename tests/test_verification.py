"""Stability and lifecycle: verification through the real pipeline, and deprecation."""
import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from rest_framework.test import APIClient

from bugs.actions import do_deprecate_bug
from bugs.models import Bug, BugStatus
from core.enums import VerificationVerdict
from runners.actions.campaigns import do_record_stability
from runners.models import StabilityCheck

from .factories import (
    BugFactory,
    CampaignFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("buggy, fixed, failed, verdict", [
    (3, 0, 0, VerificationVerdict.VERIFIED),
    (2, 0, 0, VerificationVerdict.FLAKY),
    (3, 1, 0, VerificationVerdict.FLAKY),  # a fixed variant with the symptom is a bug in the benchmark
    (3, 0, 1, VerificationVerdict.FLAKY),
    (0, 0, 0, VerificationVerdict.UNREPRODUCIBLE),
])
def test_verdict_definition(buggy, fixed, failed, verdict):
    assert StabilityCheck.verdict_for(3, buggy, fixed, failed) == verdict


def campaign_with(bug, buggy_manifested, fixed_manifested, seeds=3):
    campaign = CampaignFactory(name="verification")
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug))
    for seed in range(seeds):
        RunFactory(campaign=campaign, reproducer_version=version, variant="buggy", seed=seed, status="succeeded",
                   manifested=seed < buggy_manifested)
        RunFactory(campaign=campaign, reproducer_version=version, variant="fixed", seed=seed, status="succeeded",
                   manifested=seed < fixed_manifested)
    return campaign


def test_recording_stability_sets_the_bug_status():
    good, flaky, gone = BugFactory(), BugFactory(), BugFactory()
    for bug, a, b in ((good, 3, 0), (flaky, 2, 0), (gone, 0, 0)):
        [check] = do_record_stability(campaign_with(bug, a, b))
        assert (check.buggy_manifested, check.fixed_manifested, check.seeds) == (a, b, 3)
    statuses = {bug.pk: Bug.objects.get(pk=bug.pk).status for bug in (good, flaky, gone)}
    assert statuses == {good.pk: "verified", flaky.pk: "flaky", gone.pk: "unreproducible"}


def test_a_deprecated_bug_stays_deprecated_after_verification():
    bug = BugFactory(status=BugStatus.DEPRECATED, deprecation_reason="superseded")
    do_record_stability(campaign_with(bug, 3, 0))
    assert Bug.objects.get(pk=bug.pk).status == BugStatus.DEPRECATED


def test_bug_page_shows_the_stability_badge(client):
    bug = BugFactory(bug_id="TEST-STABLE")
    do_record_stability(campaign_with(bug, 3, 0))
    page = client.get("/bugs/TEST-STABLE/").content.decode()
    assert "buggy 3/3, fixed 0/3" in page and 'class="badge verified"' in page


def test_deprecation_keeps_the_bug_and_needs_a_reason():
    bug = BugFactory()
    with pytest.raises(ValidationError):
        do_deprecate_bug(bug, "  ", acting_user=None)
    call_command("deprecate_bug", bug.bug_id, "--reason", "duplicate of TEST-9")
    bug.refresh_from_db()
    assert bug.status == "deprecated" and bug.deprecation_reason == "duplicate of TEST-9"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_verification_command_through_the_pipeline(capsys):
    """A fast subset of the corpus verification (k=2), through a real local worker."""
    call_command("verify_bugs", "--bugs", "PT-FORUM-84911,PT-5801", "--seeds", "2")
    out = capsys.readouterr().out
    assert "verified" in out
    assert {b.bug_id: b.status for b in Bug.objects.filter(bug_id__in=["PT-FORUM-84911", "PT-5801"])} == {
        "PT-FORUM-84911": "verified", "PT-5801": "verified"}
    checks = StabilityCheck.objects.all()
    assert sorted((c.buggy_manifested, c.fixed_manifested, c.seeds) for c in checks) == [(2, 0, 2), (2, 0, 2)]


def test_only_a_maintainer_approves_an_exact_version_and_a_rejection_needs_a_reason():
    from bugs.actions import do_review_version

    from .factories import MaintainerFactory

    version = ReproducerVersionFactory(review_state="pending", reproducer=ReproducerFactory(
        bug=BugFactory(status=BugStatus.SUBMITTED)))
    api = APIClient()
    api.force_authenticate(UserFactory())
    response = api.post(f"/api/reproducer-versions/{version.pk}/review/", {"decision": "approve"}, format="json")
    assert response.status_code == 403 and "maintainers" in response.json()["detail"]
    version.refresh_from_db()
    assert version.review_state == "pending"
    with pytest.raises(ValidationError):
        do_review_version(version, approve=False, note=" ", acting_user=MaintainerFactory())
    maintainer = MaintainerFactory()
    approved = do_review_version(version, approve=True, note="read it", acting_user=maintainer)
    assert approved.is_approved and approved.reviewed_by == maintainer
    assert Bug.objects.get(pk=version.reproducer.bug_id).status == BugStatus.APPROVED
