"""Pages and API lists cost the same number of queries whatever the size of the history (issue 5),
and the synthetic history used to measure them (manage.py seed_history). Timings live in
``manage.py bench_pages``, never here."""
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runners.actions.detectors import do_record_detector
from runners.models import Alarm, Campaign, Environment, Run, StabilityCheck

from .factories import (
    BugFactory,
    CampaignFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    StabilityCheckFactory,
)

pytestmark = pytest.mark.django_db


def grow(bug, campaign, reproducers, runs_per_version):
    """Add reproducers (two versions each, a stability check, runs with alarms) to ``bug``'s history."""
    environment = Environment.objects.get_or_create(fingerprint="scale-test", defaults={"host": "h", "python": "3"})[0]
    detectors = [do_record_detector("plain"), do_record_detector("nan_inf")]
    start = bug.reproducers.count()
    for index in range(start, start + reproducers):
        reproducer = ReproducerFactory(bug=bug, name=f"cpu{index}")
        ReproducerVersionFactory(reproducer=reproducer, files={"repro.py": f"# old {index}\n"})
        version = ReproducerVersionFactory(reproducer=reproducer, files={"repro.py": f"# <script>{index}\n"})
        StabilityCheckFactory(reproducer_version=version, environment=environment, seeds=3,
                              buggy_manifested=3, fixed_manifested=0, verdict="verified")
        for seed in range(runs_per_version):
            run = RunFactory(reproducer_version=version, campaign=campaign, detector=detectors[seed % 2],
                             variant=("buggy", "fixed")[seed % 2], seed=seed, status="succeeded", trigger_step=1,
                             environment=environment,
                             step_records=[{"step": s, "rank": 0, "loss": 1.0, "time": s, "metrics": {}}
                                           for s in range(3)])
            Alarm.objects.bulk_create([Alarm(run=run, step=step, rule="r", message="m") for step in range(3)])


def queries(client, url):
    with CaptureQueriesContext(connection) as context:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(context.captured_queries)


def test_query_counts_do_not_grow_with_the_history(client):
    bug = BugFactory(bug_id="SCALE-1")
    campaigns = [CampaignFactory(name="campaign 0")]
    grow(bug, campaigns[0], reproducers=1, runs_per_version=2)
    BugFactory.create_batch(2)
    run = Run.objects.filter(alarms__isnull=False).first()
    urls = ["/", "/catalog/", f"/bugs/{bug.bug_id}/", "/campaigns/", f"/campaigns/{campaigns[0].pk}/",
            f"/campaigns/{campaigns[0].pk}/?page=2", f"/runs/{run.pk}/", "/results/",
            f"/results/?campaign={campaigns[0].pk}", "/api/runs/", "/api/campaigns/", "/api/alarms/",
            "/api/bugs/"]
    for url in urls:  # warm the per-process caches (content types for the audit trail) before counting
        client.get(url)
    small = {url: queries(client, url) for url in urls}

    grow(bug, campaigns[0], reproducers=2, runs_per_version=6)  # 3x the reproducers, 5x the runs
    for n in (1, 2):
        grow(BugFactory(), CampaignFactory(name=f"campaign {n}"), reproducers=2, runs_per_version=3)
    BugFactory.create_batch(6)
    assert Run.objects.count() == 2 + 2 * 6 + 2 * 2 * 3
    for url in urls:  # what the first view computes once and caches (the new stability chart) is not counted
        client.get(url)
    large = {url: queries(client, url) for url in urls}
    assert large == small


def test_bug_page_shows_every_reproducer_card_and_pages_its_runs(client):
    bug = BugFactory(bug_id="SCALE-2")
    grow(bug, CampaignFactory(name="c"), reproducers=3, runs_per_version=20)
    page = client.get(f"/bugs/{bug.bug_id}/").content.decode()
    for index in range(3):
        assert f"&lt;script&gt;{index}" in page  # the latest version's code, escaped
    assert "<script>0" not in page
    assert page.count("(2 versions)") == 3
    assert page.count("verified") >= 3
    assert "page 1 of 2" in page
    assert "page 2 of 2" in client.get(f"/bugs/{bug.bug_id}/?page=2").content.decode()


def test_seed_history_makes_a_marked_history_once(capsys):
    call_command("load_catalog")
    call_command("seed_history", runs=200, alarms=1000, campaigns=3, seed=1)
    assert Run.objects.count() == 200
    assert Alarm.objects.count() == 1000
    assert all(name.startswith("synthetic") for name in Campaign.objects.values_list("name", flat=True))
    assert Campaign.objects.count() == 3
    assert set(Run.objects.values_list("status", flat=True)) >= {"succeeded", "failed"}
    assert not Alarm.objects.filter(run__detector__name="plain").exists()
    assert not Alarm.objects.exclude(run__status="succeeded").exists()
    assert Run.objects.filter(status="failed").exclude(failure_reason="").count() == Run.objects.filter(
        status="failed").count()
    assert Environment.objects.filter(host__startswith="synthetic").values("torch").distinct().count() > 2
    assert StabilityCheck.objects.values("environment").distinct().count() > 2
    assert "200 runs" in capsys.readouterr().out

    with pytest.raises(CommandError, match="already has 200 runs"):
        call_command("seed_history", runs=200, alarms=1000)
    assert Run.objects.count() == 200

    call_command("seed_history", runs=50, alarms=10, campaigns=1, force=True)
    assert Run.objects.count() == 250


def test_seed_history_needs_the_catalog():
    with pytest.raises(CommandError, match="load the catalog"):
        call_command("seed_history", runs=10, alarms=0)
