"""`manage.py bench_quickstart`: where a quickstart campaign's time went, read from its runs."""
from datetime import datetime, timedelta, timezone

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runners.models import RunStatus
from tests.factories import CampaignFactory, ReproducerVersionFactory, RunFactory

START = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def timed_run(campaign, start, claim_to_result, sandbox, steps, status=RunStatus.SUCCEEDED, world_size=1):
    """A run claimed ``start`` s after START, with step records at the (rank, time) pairs ``steps``, of a version
    whose manifest declares ``world_size`` ranks."""
    manifest = {**ReproducerVersionFactory.build().manifest, "needs": {"world_size": world_size}}
    return RunFactory(campaign=campaign, status=status, reproducer_version=ReproducerVersionFactory(manifest=manifest),
                      started_at=START + timedelta(seconds=start),
                      finished_at=START + timedelta(seconds=start + claim_to_result), wall_seconds=sandbox,
                      step_records=[{"step": 0, "rank": rank, "loss": 1.0, "time": moment} for rank, moment in steps])


@pytest.mark.django_db
def test_bench_quickstart_reads_where_the_time_went(capsys):
    campaign = CampaignFactory(name="quickstart")
    timed_run(campaign, 0.0, 1.0, 0.9, [(0, 100.0), (0, 100.4)])  # own 0.4 s: 0.5 s beyond it
    timed_run(campaign, 0.2, 2.0, 1.8, [(0, 50.0), (1, 50.2), (0, 51.0)], world_size=2)  # own 1.0 s: 0.8 s beyond
    timed_run(campaign, 1.1, 0.5, 0.4, [])  # claimed 0.1 s after the first run's result; ends at 1.6 s
    timed_run(campaign, 1.8, 0.2, 0.1, [], status=RunStatus.FAILED)  # held a slot: in the time, not the sandbox
    call_command("bench_quickstart")
    out = capsys.readouterr().out
    assert "3 succeeded runs of 4, 4 ran" in out and "span, first claim to last result: 2.2 s" in out
    assert "run-seconds, claim to result: 4; succeeded runs in the sandbox: 3, of which the reproducers' own: 1" in out
    assert "1 rank(s): 0.450 s (n = 2)" in out  # 0.5 and 0.4 (no step record: all of it beyond)
    assert "2 rank(s): 0.800 s (n = 1)" in out
    assert "gap from a result to the next claim: median 0.150 s" in out  # 1.0 to 1.1 s, 1.6 to 1.8 s
    # one run or none under way from 0 to 0.2 s, 1.0 to 1.1 s, 1.6 to 1.8 s and 2.0 to 2.2 s
    assert "time with fewer than 2 runs under way: 0.7 s" in out


@pytest.mark.django_db
def test_bench_quickstart_says_when_there_is_nothing_to_read():
    with pytest.raises(CommandError, match="run `manage.py quickstart --no-serve` first"):
        call_command("bench_quickstart")
