"""A real Celery worker process executes real reproducers; the database holds the result.

Under bin/test this runs twice: on SQLite with the filesystem broker (the embedded default),
and on PostgreSQL with Redis.
"""
import pytest
from django.core.management import call_command

from benchmark_site.celery import app
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.models import RunStatus
from runners.plans import CampaignPlan
from runners.progress import wait_for_campaign
from runners.selectors import runnable_versions
from runners.worker.local import log_tail, start_worker, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(tmp_path):
    """A real `celery worker` process on the configured broker, pointed at the test database."""
    app.control.purge()  # stale messages of an earlier session name runs that do not exist here
    log = tmp_path / "worker.log"
    process = start_worker(log, name="integration")
    yield process, log
    stop_process(process)


def test_real_worker_runs_a_real_reproducer(worker):
    process, log = worker
    call_command("load_catalog")
    versions = runnable_versions(["PT-FORUM-84911"])
    detectors = [do_record_detector("plain"), do_record_detector("param_not_updated")]
    campaign = do_create_campaign("integration", CampaignPlan.build(versions, detectors, ["buggy", "fixed"], [0]),
                                  acting_user=None)

    progress = wait_for_campaign(campaign, lambda line: None, timeout=240)
    assert progress["done"] == progress["total"] == 4, log_tail(log)
    assert process.poll() is None, "the worker died"

    runs = {(run.variant, run.detector.name): run for run in campaign.runs.select_related("detector")}
    for run in runs.values():
        assert run.status == RunStatus.SUCCEEDED, run.failure_reason
        assert run.environment is not None and run.environment.torch.startswith("2.13")
        assert run.worker.hostname and run.attempts == 1
        assert run.started_at >= run.queued_at
        assert len(run.step_records) == run.steps
    assert runs[("buggy", "plain")].manifested and not runs[("fixed", "plain")].manifested
    assert runs[("buggy", "param_not_updated")].alarms.filter(rule="no_parameter_updated").exists()
    assert not runs[("fixed", "param_not_updated")].alarms.exists()
    assert not runs[("buggy", "plain")].alarms.exists()
