"""A run's page (issue 33): its twin of the other variant linked, repeated alarms grouped by rule with their steps
and ranks, and the whole run as a JSON download (records, oracle, alarms, logs), only for who may see the run."""
import json
import re

import pytest

from core.enums import ReviewState

from .factories import AlarmFactory, ReproducerVersionFactory, RunFactory
from .helpers import HOSTILE, table

pytestmark = pytest.mark.django_db


def test_sixty_identical_alarms_read_as_one_group_and_the_twin_is_linked(client):
    buggy = RunFactory(status="succeeded", variant="buggy", steps=30, trigger_step=0, campaign=None,
                       detector__name="cross_rank_consistency")
    fixed = RunFactory(status="succeeded", variant="fixed", steps=30, reproducer_version=buggy.reproducer_version,
                       detector=buggy.detector)
    for step in range(30):
        for rank in (0, 1):
            AlarmFactory(run=buggy, step=step, rank=rank, rule="replicas_diverged", message=f"checksum at {step}")
    AlarmFactory(run=buggy, step=5, rule="other_rule", message="once")
    page = client.get(buggy.get_absolute_url()).content.decode()
    groups = table(page, "alarm-groups")
    assert [(g["Rule"], g["Alarms"], g["Steps"], g["Ranks"], g["First message"]) for g in groups] == [
        ("replicas_diverged", "×60", "0–29", "0–1", "checksum at 0"), ("other_rule", "×1", "5", "0", "once")]
    assert '<details id="every-alarm">' in page  # the 61 rows, one click away
    links = " ".join(re.search(r'<p id="run-links">(.*?)</p>', page, re.S).group(1).split())
    assert f'Its fixed twin (same seed, detector and campaign): <a href="{fixed.get_absolute_url()}">' in links
    assert 'href="/detectors/cross_rank_consistency/"' in links


def test_the_run_downloads_as_json_with_its_records_and_logs(client):
    run = RunFactory(status="succeeded", stdout=HOSTILE, step_records=[{"step": 0, "rank": 0, "loss": 2.5}],
                     manifested=True, oracle_summary="diverged")
    AlarmFactory(run=run, step=1, rule="r", message=HOSTILE)
    response = client.get(f"/runs/{run.pk}/record.json")
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="silentbench-run-{run.pk}.json"'
    record = json.loads(response.content)
    assert record["run"] == run.pk and record["stdout"] == HOSTILE and record["step_records"][0]["loss"] == 2.5
    assert record["alarms"][0]["message"] == HOSTILE and record["manifested"] is True
    assert record["reproducer"]["content_hash"] == run.reproducer_version.content_hash


def test_a_run_of_unreviewed_code_downloads_for_no_stranger(client):
    hidden = RunFactory(reproducer_version=ReproducerVersionFactory(review_state=ReviewState.PENDING))
    assert client.get(f"/runs/{hidden.pk}/record.json").status_code == 404
    assert client.get("/runs/999999/record.json").status_code == 404
