"""Published evaluations (issue 33): a stored evaluation's snapshot ships with the app and loads into another
database as the same evaluation: the same tables (recomputed from the loaded runs), the same published ID, the
original times, the stability checks; loading twice changes nothing, and a damaged snapshot loads nothing."""
import gzip
import io
import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from bugs.models import Bug
from evaluation.actions import (
    do_load_published_evaluation,
    do_publish_evaluation,
    do_retabulate_evaluation,
    run_tables,
)
from evaluation.models import Evaluation
from evaluation.published import SnapshotError, published_snapshots, read_snapshot
from runners.actions.detectors import do_record_detector
from runners.models import Alarm, Campaign, Run, StabilityCheck

from .factories import (
    CampaignFactory,
    ReproducerVersionFactory,
    RunFactory,
)
from .helpers import client_for, stored_evaluation

pytestmark = pytest.mark.django_db
TRIGGER = 3


@pytest.fixture
def stored():
    return stored_evaluation()


def forget(evaluation):
    """This database without the evaluation, its runs and the stability checks: what a fresh install has."""
    campaign = evaluation.campaign
    evaluation.delete()
    campaign.delete()
    StabilityCheck.objects.all().delete()


def test_a_published_evaluation_loads_back_as_the_same_evaluation(stored, tmp_path):
    path = do_publish_evaluation(stored, tmp_path, acting_user=None)
    assert stored.published_id == f"{stored.created_at:%Y-%m-%d}.{stored.tables_digest[:8]}"
    assert path.name == f"{stored.published_id}.json.gz" and published_snapshots(tmp_path) == [path]
    alarms = sorted(Alarm.objects.values_list("rule", "step", "time", "arrival_step"))
    tables, created_at, published_id = stored.tables, stored.created_at, stored.published_id
    forget(stored)
    assert not Run.objects.exists()

    loaded, made = do_load_published_evaluation(read_snapshot(path), acting_user=None)
    assert made and loaded.published_id == published_id and loaded.label == published_id
    assert loaded.tables == tables and loaded.created_at == created_at and loaded.wall_seconds == 12.5
    # The runs themselves came back, not just the tables: judging them again gives the same tables.
    runs = loaded.campaign.runs.all()
    assert run_tables(runs) == {name: tables[name] for name in run_tables(runs)}
    assert sorted(Alarm.objects.values_list("rule", "step", "time", "arrival_step")) == alarms
    assert runs.get(status="failed").failure_reason == "it crashed"
    assert runs.first().stdout == f"(not shipped: published evaluation {published_id} keeps no logs)"
    assert {run.status: run.environment and run.environment.host for run in runs} == {
        "succeeded": "eval-host", "failed": None}
    assert StabilityCheck.objects.count() == 2
    # never verified here: the bugs take the published verdict of their current versions
    assert set(Bug.objects.filter(bug_id__in=["PUB-1", "PUB-2"]).values_list("status", flat=True)) == {"verified"}

    again, made = do_load_published_evaluation(read_snapshot(path), acting_user=None)
    assert not made and again.pk == loaded.pk and Run.objects.count() == runs.count()


def test_the_published_numbers_show_on_a_fresh_install_beside_live_runs(stored, tmp_path):
    path = do_publish_evaluation(stored, tmp_path, acting_user=None)
    forget(stored)
    call_command("load_results", str(path))
    evaluation = Evaluation.objects.get()
    page = client_for().get("/results/").content.decode()
    assert evaluation.published_id in page
    catalog = client_for().get("/catalog/").content.decode()
    assert "nan_inf" in catalog  # "Caught by" from the published tables
    # A live campaign of the same bug is a layer beside it: the published tables do not move.
    live = CampaignFactory(name="quickstart")
    RunFactory(campaign=live, reproducer_version=Run.objects.first().reproducer_version,
               detector=do_record_detector("grad_health"), status="succeeded", variant="buggy", steps=10,
               trigger_step=TRIGGER, manifested=True)
    evaluation.refresh_from_db()
    assert evaluation.tables == read_snapshot(path)["evaluation"]["tables"]


def test_a_snapshot_for_another_catalog_says_what_is_missing_and_loads_nothing(stored, tmp_path):
    path = do_publish_evaluation(stored, tmp_path, acting_user=None)
    snapshot = read_snapshot(path)
    snapshot["reproducer_versions"][1]["bug"] = "NOT-LOADED"
    forget(stored)
    with pytest.raises(SnapshotError, match="no reproducer NOT-LOADED/cpu; run load_catalog first"):
        do_load_published_evaluation(snapshot, acting_user=None)
    assert not Run.objects.exists() and not Campaign.objects.exists() and not Evaluation.objects.exists()


def test_tables_changed_after_publishing_are_refused(stored, tmp_path):
    snapshot = read_snapshot(do_publish_evaluation(stored, tmp_path, acting_user=None))
    snapshot["evaluation"]["tables"]["detection"][0]["detected_runs"] = 99
    forget(stored)
    with pytest.raises(SnapshotError, match="do not match their digest"):
        do_load_published_evaluation(snapshot, acting_user=None)
    assert not Run.objects.exists() and not Evaluation.objects.exists()


def test_a_changed_reproducer_is_loaded_as_the_version_that_ran_not_as_the_latest(stored, tmp_path):
    path = do_publish_evaluation(stored, tmp_path, acting_user=None)
    ran = Run.objects.first().reproducer_version
    forget(stored)
    newer = ReproducerVersionFactory(reproducer=ran.reproducer, files={"repro.py": "# changed since\n"})
    ran.delete()
    do_load_published_evaluation(read_snapshot(path), acting_user=None)
    restored = ran.reproducer.versions.get(content_hash=ran.content_hash)
    assert restored.created_at < newer.created_at and ran.reproducer.latest_version() == newer
    assert "published evaluation" in restored.review_note
    # its verdict was the replaced version's: the bug, as it is now, is not said to be verified
    assert ran.reproducer.bug.__class__.objects.get(pk=ran.reproducer.bug_id).status == "approved"


@pytest.mark.parametrize("content, message", [
    (b"not gzip at all", "not a gzipped JSON snapshot"),
    (gzip.compress(b"[1, 2]"), "snapshot format 'list'"),
    (gzip.compress(json.dumps({"format": 99}).encode()), "snapshot format 99"),
    (gzip.compress(json.dumps({"format": 1, "published_id": "x"}).encode()), "missing evaluation, campaigns"),
])
def test_a_bad_snapshot_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(content)
    with pytest.raises(CommandError, match=message):
        call_command("load_results", str(path))


def test_a_snapshot_edited_by_hand_is_a_clear_error_and_loads_nothing(stored, tmp_path):
    path = do_publish_evaluation(stored, tmp_path, acting_user=None)
    snapshot = read_snapshot(path)
    del snapshot["runs"][0]["variant"]
    forget(stored)
    with gzip.open(path, "wt") as stream:
        json.dump(snapshot, stream)
    with pytest.raises(CommandError, match="a malformed snapshot .KeyError: 'variant'.; nothing of it was loaded"):
        call_command("load_results", str(path))
    assert not Run.objects.exists()


def test_the_snapshot_is_the_same_bytes_each_time(stored, tmp_path):
    first = do_publish_evaluation(stored, tmp_path / "a", acting_user=None).read_bytes()
    assert do_publish_evaluation(stored, tmp_path / "b", acting_user=None).read_bytes() == first


def test_the_snapshots_that_ship_load_into_the_catalog_and_judge_to_their_own_tables():
    """What a fresh install loads: every snapshot under evaluation/published/, on the catalog as it is now. Its
    runs, judged again here, give the tables it stored (detection, false positives, latency), so the numbers a
    newcomer reads are those of the runs they can open."""
    shipped = published_snapshots()
    assert shipped, "no published evaluation ships with the app (manage.py publish_evaluation writes one)"
    call_command("load_catalog", stdout=io.StringIO())
    for path in shipped:
        snapshot = read_snapshot(path)
        evaluation, made = do_load_published_evaluation(snapshot, acting_user=None)
        assert made and evaluation.tables_digest == snapshot["evaluation"]["tables_digest"]
        judged = run_tables(evaluation.campaign.runs.all())
        for name in ("detection", "false_positives", "latency"):
            assert judged[name] == evaluation.tables[name], name
        assert evaluation.campaign.runs.count() == evaluation.parameters["runs"]


def test_an_evaluation_with_runs_the_public_may_not_see_is_not_published(stored, tmp_path):
    from bugs.actions import do_hold_out_bug

    from .factories import MaintainerFactory
    do_hold_out_bug(Bug.objects.get(bug_id="PUB-2"), acting_user=MaintainerFactory())
    with pytest.raises(ValidationError, match="run\\(s\\) of code the public may not see"):
        do_publish_evaluation(stored, tmp_path, acting_user=None)
    assert not published_snapshots(tmp_path) and not Evaluation.objects.get(pk=stored.pk).published_id


def test_a_published_evaluation_keeps_its_tables(stored, tmp_path):
    do_publish_evaluation(stored, tmp_path, acting_user=None)
    with pytest.raises(ValidationError, match="is published as .*: its tables stay as published"):
        do_retabulate_evaluation(stored, acting_user=None)
    twin = Evaluation.objects.create(campaign=stored.campaign, tables=stored.tables)
    Evaluation.objects.filter(pk=twin.pk).update(created_at=stored.created_at)
    twin.refresh_from_db()
    with pytest.raises(ValidationError, match="Another evaluation is published as"):
        do_publish_evaluation(twin, tmp_path, acting_user=None)


def test_a_loaded_version_never_becomes_the_latest_and_checks_load_once(stored, tmp_path):
    path = do_publish_evaluation(stored, tmp_path, acting_user=None)
    ran = Run.objects.first().reproducer_version
    forget(stored)
    older_here = ReproducerVersionFactory(reproducer=ran.reproducer, files={"repro.py": "# loaded before\n"})
    ReproducerVersion = type(ran)
    ReproducerVersion.objects.filter(pk=older_here.pk).update(created_at=ran.created_at - timedelta(days=2))
    ran.delete()  # this database never had the code that ran; its only version is older by the clock
    snapshot = read_snapshot(path)
    do_load_published_evaluation(snapshot, acting_user=None)
    assert ran.reproducer.latest_version().pk == older_here.pk  # what ran is history here, not the code to run
    checks = StabilityCheck.objects.count()
    second = {**snapshot, "published_id": "2026-11-29.00000000"}
    do_load_published_evaluation(second, acting_user=None)
    assert StabilityCheck.objects.count() == checks  # the same verifications, shipped twice, loaded once
