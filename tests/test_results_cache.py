"""The live tables of a completed campaign are cached until it is reopened; a running one is always live."""
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runners.actions.campaigns import do_complete_campaign, do_create_campaign, do_retry_failed_runs
from runners.actions.detectors import do_record_detector
from runners.models import Run, RunStatus
from runners.plans import CampaignPlan

from .factories import AlarmFactory, BugFactory, ReproducerFactory, ReproducerVersionFactory

pytestmark = pytest.mark.django_db


def queries(client, url):
    """(queries made, the page without its per-response CSP nonces)."""
    with CaptureQueriesContext(connection) as captured:
        body = client.get(url).content.decode()
    return len(captured), re.sub(r'nonce="[^"]*"', 'nonce=""', body)


def test_completed_campaign_tables_are_cached_until_a_retry_reopens_it(client):
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-CACHE")))
    campaign = do_create_campaign("c", CampaignPlan.build([version], [do_record_detector("param_not_updated")]),
                                  enqueue=False, acting_user=None)
    buggy = campaign.runs.get(variant="buggy")
    Run.objects.filter(campaign=campaign).update(status=RunStatus.SUCCEEDED, trigger_step=1, steps=3)
    Run.objects.filter(pk=buggy.pk).update(status=RunStatus.FAILED)
    url = f"/results/?campaign={campaign.pk}"

    live, _ = queries(client, url)
    assert queries(client, url)[0] == live  # not completed yet: computed at every request
    assert do_complete_campaign(campaign)
    first, body = queries(client, url)
    cached, cached_body = queries(client, url)
    assert cached < first and cached_body == body  # the judged runs and alarms are not read again

    do_retry_failed_runs(campaign, acting_user=None)  # reopens it: live again, and the new result shows
    Run.objects.filter(pk=buggy.pk).update(status=RunStatus.SUCCEEDED)
    AlarmFactory(run=buggy, step=2, rule="no_parameter_updated", message="m")
    assert do_complete_campaign(campaign)
    _, after = queries(client, url)
    badge = 'class="badge detected">detected</span>'
    assert badge in after and badge not in body
