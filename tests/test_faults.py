"""Faults, with real processes: a private PostgreSQL and Redis (tests/services.py), real `celery worker`
processes, and the reconciler run in this process the way `manage.py reconcile --every` would.

Each test prints how long the system took to recover (`pytest -s` shows the figures).
"""
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import Client

from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.models import Campaign, Run, RunStatus
from runners.plans import CampaignPlan
from runners.reconciler import reconcile
from runners.worker.local import log_tail, start_worker, stop_process

from .factories import GOOD_REPRODUCER, PROGRAM_PREAMBLE, CampaignFactory, ReproducerVersionFactory, WorkerFactory
from .helpers import is_running
from .services import celery_on, django_on

# Small windows so that each fault heals in seconds (production: 15 s, 90 s, 60 s).
FAST = {"SILENTBENCH_HEARTBEAT_SECONDS": "0.5", "SILENTBENCH_WORKER_STALE_SECONDS": "3",
        "SILENTBENCH_REQUEUE_QUEUED_AFTER_SECONDS": "2", "SILENTBENCH_DB_RETRY_SECONDS": "60"}

# Sleeps before its first step, so that a fault lands while it runs; one alarm, so duplicates would show.
SLOW_REPRODUCER = PROGRAM_PREAMBLE + """
time.sleep({sleep})
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    report(event="step", step=step, rank=0, loss=1.0 / (step + 1), time=time.time())
report(event="alarm", step=1, rank=0, rule="toy_rule", message="toy alarm")
report(event="oracle", manifested=True, trigger_step=1, summary="toy oracle", evidence={{}})
"""


@pytest.fixture(scope="module")
def stack(own_postgres, own_redis, django_db_blocker):
    """A fresh database on the private PostgreSQL and the private Redis, for this module."""
    url = own_postgres.createdb(f"faults_{uuid.uuid4().hex[:8]}")
    with django_db_blocker.unblock(), django_on(url), celery_on(own_redis.url(1)):
        call_command("migrate", verbosity=0)
        yield {"postgres": own_postgres, "redis": own_redis}


@pytest.fixture
def workers(stack, tmp_path, monkeypatch, settings):
    """``start(name)`` starts a real worker on the private services; all are stopped afterwards."""
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
        setattr(settings, name, float(value))
    started = []

    def start(name):
        log = tmp_path / f"{name}.log"
        process = start_worker(log, name=f"{name}-{uuid.uuid4().hex[:6]}")
        started.append(process)
        process.log = log
        return process

    yield start
    for process in started:
        stop_process(process, timeout=10)


def campaign_of(sources, name, time_limit=20, memory_mb=1024):
    versions = [ReproducerVersionFactory(files={"repro.py": source}, time_limit_seconds=time_limit,
                                         memory_mb=memory_mb) for source in sources]
    return do_create_campaign(name, CampaignPlan.build(versions, [do_record_detector("plain")], ["buggy"], [0]),
                              acting_user=None)


def wait_until(condition, timeout, what, reconciling=False, every=0.3):
    """Poll ``condition`` (reconciling each time, as `manage.py reconcile --every` would); seconds taken."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if reconciling:
            reconcile()
        if condition():
            return time.monotonic() - started
        time.sleep(every)
    raise AssertionError(f"not {what} after {timeout} s")


def run_status(run_id):
    return Run.objects.get(pk=run_id).status


def reproducer_processes(run_id):
    """PIDs of the processes working in a directory of this run."""
    prefix = str(Path(os.environ.get("SILENTBENCH_VAR_DIR", "var")).resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(prefix) and f"/run-{run_id}-" in cwd and is_running(int(entry.name)):
                pids.append(int(entry.name))
    return pids


@pytest.mark.faults
def test_a_worker_killed_mid_run_is_retried_and_the_run_finishes_once(workers):
    campaign = campaign_of([SLOW_REPRODUCER.format(sleep=4)], "kill -9")
    run = campaign.runs.get()
    first = workers("doomed")
    wait_until(lambda: run_status(run.pk) == RunStatus.RUNNING and reproducer_processes(run.pk), 60,
               "running on the first worker")
    orphans = reproducer_processes(run.pk)

    os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool process, as the kernel's OOM killer or a crash
    first.wait()
    killed = time.monotonic()
    wait_until(lambda: not any(is_running(pid) for pid in orphans), 10, "rid of the orphaned reproducer")
    second = workers("survivor")
    wait_until(lambda: run_status(run.pk) in (RunStatus.SUCCEEDED, RunStatus.FAILED), 90,
               "finished by the second worker", reconciling=True)
    recovered = time.monotonic() - killed

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, (run.failure_reason, log_tail(second.log))
    assert run.attempts == 2 and run.worker.hostname.startswith("survivor")
    assert not run.alarms.exists()  # its own "toy_rule" alarm line is refused: alarms come only from detectors
    assert Run.objects.filter(campaign=campaign).count() == 1
    wait_until(lambda: Campaign.objects.get(pk=campaign.pk).completed_at is not None, 10, "completed", True)
    assert second.poll() is None
    print(f"\nkill -9 mid-run: finished {recovered:.1f} s after the kill (run takes 4 s)")


@pytest.mark.faults
def test_redis_restarted_mid_campaign_loses_nothing(workers, stack):
    campaign = campaign_of([SLOW_REPRODUCER.format(sleep=1)] * 4, "redis restart")
    worker = workers("redis")
    wait_until(lambda: campaign.runs.filter(status=RunStatus.SUCCEEDED).exists(), 60, "one run done")

    stack["redis"].restart()  # without persistence: every queued and unacknowledged message is gone
    restarted = time.monotonic()
    wait_until(lambda: Campaign.objects.get(pk=campaign.pk).completed_at is not None, 120,
               "completed after the restart", reconciling=True, every=0.5)
    recovered = time.monotonic() - restarted

    runs = list(campaign.runs.all())
    assert [run.status for run in runs] == [RunStatus.SUCCEEDED] * 4, [run.failure_reason for run in runs]
    # each run's own alarm line refused and counted once: its one result stored once
    assert all(run.alarms.count() == 0 and run.execution["refused_alarms"] == 1 for run in runs)
    assert worker.poll() is None, log_tail(worker.log)
    print(f"\nRedis restart: campaign of 4 x 1 s runs completed {recovered:.1f} s after the restart")


@pytest.mark.faults
def test_postgres_restarted_under_load_requests_fail_cleanly_and_no_result_is_lost(workers, stack):
    postgres = stack["postgres"]
    campaign = campaign_of([SLOW_REPRODUCER.format(sleep=3)], "postgres restart")
    run = campaign.runs.get()
    client = Client()
    page, api = f"/runs/{run.pk}/", f"/api/runs/{run.pk}/"
    assert client.get(page).status_code == 200 and client.get(api).status_code == 200
    worker = workers("pg")
    wait_until(lambda: run_status(run.pk) == RunStatus.RUNNING, 60, "running")

    postgres.stop()  # while the reproducer runs: it finishes during the outage
    down = time.monotonic()
    during = [client.get(url) for url in (page, api, "/", page, api)]
    assert [response.status_code for response in during] == [503] * 5
    assert b"database is unavailable" in during[0].content and "<script" not in during[0].content.decode()
    assert during[1].json() == {"detail": "The database is unavailable right now; please try again in a minute."}
    with pytest.raises(OperationalError):
        Run.objects.count()
    time.sleep(max(0, 5 - (time.monotonic() - down)))  # the run ends (~3 s) while PostgreSQL is down
    postgres.start()
    up = time.monotonic()
    connection.close()  # what Django does at every request's start and end, which the test client skips

    stored = wait_until(lambda: run_status(run.pk) == RunStatus.SUCCEEDED, 60, "stored after the restart")
    assert client.get(page).status_code == 200 and client.get(api).status_code == 200
    run.refresh_from_db()
    # kept by the worker across the outage, stored once (its own alarm line refused, as always)
    assert run.attempts == 1 and run.alarms.count() == 0 and run.execution["refused_alarms"] == 1
    wait_until(lambda: Campaign.objects.get(pk=campaign.pk).completed_at is not None, 20, "completed")
    assert worker.poll() is None, log_tail(worker.log)
    print(f"\nPostgreSQL down {up - down:.1f} s: result stored {stored:.1f} s after it came back; pages 503 meanwhile")


MISBEHAVING = {
    "hang": ("import time\nwhile True: time.sleep(1)", "Time limit exceeded"),
    "fork bomb": ("import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                  "        time.sleep(0.01)\n", "Process limit"),
    "memory": ("block = bytearray(2 * 1024 ** 3)", "Out of memory"),
    "flood": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", "Output flood"),
    # the standard library's folder is in a sealed run's view, read-only (its /tmp is its own)
    "write outside": (GOOD_REPRODUCER + "\nopen(os.path.dirname(os.__file__) + '/silentbench-escape-{token}', 'w')\n",
                      "Refused by the sandbox"),
}


@pytest.mark.faults
def test_misbehaving_reproducers_fail_with_their_reason_and_the_worker_lives_on(workers, monkeypatch):
    monkeypatch.setenv("SILENTBENCH_OUTPUT_FLOOD_BYTES", str(4 * 1024 * 1024))
    monkeypatch.setenv("SILENTBENCH_MAX_PROCESSES", "64")
    token = uuid.uuid4().hex
    sources = [source.replace("{token}", token) for source, _ in MISBEHAVING.values()] + [GOOD_REPRODUCER]
    campaign = campaign_of(sources, "misbehaving", time_limit=3, memory_mb=512)
    worker = workers("sandbox")
    wait_until(lambda: Campaign.objects.get(pk=campaign.pk).completed_at is not None, 120, "completed")

    runs = {run.reproducer_version.files["repro.py"]: run for run in campaign.runs.all()}
    for (what, (_, reason)), source in zip(MISBEHAVING.items(), sources):
        run = runs[source]
        assert run.status == RunStatus.FAILED and reason in run.failure_reason, (what, run.failure_reason)
    assert runs[GOOD_REPRODUCER].status == RunStatus.SUCCEEDED  # the last one, on the same worker
    assert not Path(os.path.dirname(os.__file__), f"silentbench-escape-{token}").exists()
    assert worker.poll() is None, log_tail(worker.log)


# --- The same mechanisms in-process, fast (every pass of the suite) ---

@pytest.mark.django_db
def test_reconcile_requeues_a_silent_workers_runs_and_completes_a_missed_campaign(
        settings, monkeypatch, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from runners import reconciler
    from runners.actions import runs as run_actions

    from .factories import RunFactory

    enqueued = []
    monkeypatch.setattr(run_actions, "enqueue_runs", enqueued.extend)  # lost runs are queued again by runners.actions
    monkeypatch.setattr(reconciler, "enqueue_runs", enqueued.extend)
    settings.SILENTBENCH_WORKER_STALE_SECONDS = 60
    now = timezone.now()
    silent = WorkerFactory(hostname="silent@a", last_seen=now - timedelta(seconds=61))
    alive = WorkerFactory(hostname="alive@b", last_seen=now - timedelta(seconds=5))
    orphan = RunFactory(status=RunStatus.RUNNING, worker=silent, attempts=1, started_at=now)
    busy = RunFactory(status=RunStatus.RUNNING, worker=alive, attempts=1, started_at=now)
    finished = CampaignFactory(name="done, never marked")
    RunFactory(campaign=finished, status=RunStatus.SUCCEEDED)

    with django_capture_on_commit_callbacks(execute=True):
        repaired = reconciler.reconcile(now)
    assert repaired["requeued_from_silent_workers"] == [orphan.pk] and enqueued == [orphan.pk]
    orphan.refresh_from_db()
    busy.refresh_from_db()
    assert (orphan.status, orphan.worker, orphan.attempts) == (RunStatus.QUEUED, None, 1)
    assert busy.status == RunStatus.RUNNING
    assert repaired["completed_campaigns"] == [finished.pk]
    assert reconciler.reconcile(now)["completed_campaigns"] == []  # idempotent


@pytest.mark.django_db
def test_a_database_outage_is_a_clean_503_page_or_json(monkeypatch):
    from django.db.backends import utils

    def refused(*args, **kwargs):
        raise OperationalError('connection to server at "db" failed: Connection refused')

    monkeypatch.setattr(utils.CursorWrapper, "execute", refused)
    client = Client()
    page = client.get("/")
    assert page.status_code == 503 and page["Retry-After"] == "30"
    assert page["Content-Type"].startswith("text/html") and b"try again" in page.content
    assert b"Connection refused" not in page.content  # no internals shown
    api = client.get("/api/runs/")
    assert api.status_code == 503 and "try again" in api.json()["detail"]
