"""Failures have a kind (Run.failure_kind) next to their reason: set where the reason is set, classified
for runs stored before kinds existed, shown and filtered on the campaign, run and compare pages, and the
way to retry only some failures (action, page, API, command)."""
import importlib
import io
import random
import re
from datetime import timedelta

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from bugs.models import Reproducer
from core.models import AuditEvent
from devtools import synthetic
from runners import failures, tasks
from runners.actions.campaigns import do_cancel_campaign, do_create_campaign, do_retry_failed_runs
from runners.actions.detectors import do_record_detector
from runners.actions.runs import do_flag_unservable_runs
from runners.environments import routing
from runners.environments.routing import Needs
from runners.execution import execute, run_limits
from runners.executor import Limits, SandboxResult
from runners.failures import FitError, program_failure
from runners.models import Campaign, Run, RunFailureKind, RunStatus
from runners.plans import CampaignPlan
from runners.tasks import execute_run

from .factories import GOOD_REPRODUCER, MaintainerFactory, ReproducerVersionFactory, RunFactory, UserFactory

pytestmark = pytest.mark.django_db
MIGRATION = importlib.import_module("runners.migrations.0007_run_failure_kind")
Kind = RunFailureKind
HOSTILE = "<script>alert('kind')</script>"


def run_with(source, time_limit=20, **fields):
    version = ReproducerVersionFactory(files={"repro.py": source}, time_limit_seconds=time_limit)
    return RunFactory(reproducer_version=version, **fields)


def api(user=None):
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


# --- Set where the reason is set ---------------------------------------------------------------------------

@pytest.mark.integration
def test_a_real_time_limit_is_of_kind_time_limit():
    outcome = execute(run_with("import time\nwhile True: time.sleep(1)", time_limit=2))
    assert (outcome.succeeded, outcome.failure_kind) == (False, Kind.TIME_LIMIT)
    assert outcome.failure_reason.startswith("Time limit exceeded: still running after 2 s")


@pytest.mark.integration
def test_a_real_crash_is_stored_as_a_crash_and_a_good_run_has_no_kind():
    crashing, silent, good = (run_with("raise RuntimeError('boom in the reproducer')"),
                              run_with("print('I trained, trust me')"), run_with(GOOD_REPRODUCER))
    for run in (crashing, silent, good):
        execute_run(run.pk)  # the worker's path: sandbox, RunOutcome, do_finish_run
        run.refresh_from_db()
    assert (crashing.status, crashing.failure_kind) == (RunStatus.FAILED, Kind.CRASH)
    assert crashing.failure_reason == "Crashed: exited with code 1. RuntimeError: boom in the reproducer"
    assert (silent.status, silent.failure_kind) == (RunStatus.FAILED, Kind.PROTOCOL)
    assert silent.failure_reason.startswith("No oracle report:")
    assert (good.status, good.failure_kind, good.failure_reason) == (RunStatus.SUCCEEDED, "", "")


LIMITS = Limits(time_limit_seconds=60, memory_mb=512, flood_bytes=1000, max_processes=64)


def ended(exit_code=1, stderr="", **flags):
    return SandboxResult(exit_code=exit_code, wall_seconds=1.0, stdout="", stderr=stderr, output_truncated=False,
                         **flags)


@pytest.mark.parametrize("result, kind, begins", [
    (ended(-9, forked_too_much=True), Kind.PROCESS_LIMIT, "Process limit exceeded: more than 64"),
    (ended(-9, timed_out=True), Kind.TIME_LIMIT, "Time limit exceeded: still running after 60 s"),
    (ended(-9, flooded=True), Kind.OUTPUT_FLOOD, "Output flood: more than 1000 bytes"),
    (ended(1, "Traceback ...\nMemoryError"), Kind.MEMORY, "Out of memory: exceeded the memory limit of 512 MB."),
    (ended(1, "BlockingIOError: [Errno 11] Resource temporarily unavailable"), Kind.PROCESS_LIMIT,
     "Process limit reached: at most 64"),
    (ended(1, "PermissionError: [Errno 13] Permission denied: '/etc/x'"), Kind.SANDBOX_REFUSAL,
     "Refused by the sandbox:"),
    (ended(-11), Kind.CRASH, "Crashed: killed by SIGSEGV."),
    (ended(3, "SystemExit: 3"), Kind.CRASH, "Crashed: exited with code 3. SystemExit: 3"),
])
def test_every_way_a_program_ends_badly_has_its_kind(result, kind, begins):
    failure = program_failure(result, LIMITS)
    assert failure.kind == kind
    assert failure.reason.startswith(begins)
    assert MIGRATION.classify(RunStatus.FAILED, failure.reason) == kind  # the sentence says the same
    assert program_failure(ended(0), LIMITS) is None


def test_refusals_before_the_program_runs_have_their_kinds(monkeypatch):
    def failing(error):
        def fail(*args, **kwargs):
            raise error
        return fail

    unapproved = RunFactory(reproducer_version=ReproducerVersionFactory(review_state="pending"))
    unfitted = RunFactory(detector=do_record_detector("traincheck"))
    broken = RunFactory()
    misrouted = RunFactory(queue="gpu1")
    monkeypatch.setattr(tasks, "ensure_fit", failing(FitError("no reference pipeline ran")))
    monkeypatch.setattr(tasks, "execute", failing(RuntimeError("disk full")))
    monkeypatch.setattr(routing, "gpu_inventory", lambda: [])  # this host has no GPU
    expected = {unapproved: Kind.UNAPPROVED, unfitted: Kind.FIT_FAILED, broken: Kind.INTERNAL,
                misrouted: Kind.UNSERVABLE}
    for run, kind in expected.items():
        execute_run(run.pk)
        run.refresh_from_db()
        assert (run.status, run.failure_kind) == (RunStatus.FAILED, kind), run.failure_reason
        assert MIGRATION.classify(run.status, run.failure_reason) == kind
    assert "disk full" in broken.failure_reason and "no reference pipeline ran" in unfitted.failure_reason
    assert misrouted.failure_reason.startswith("This worker cannot serve the run: it needs 1 GPU")


def test_cancelled_runs_are_of_kind_cancelled():
    campaign = do_create_campaign("c", CampaignPlan.build([ReproducerVersionFactory()], [do_record_detector("plain")]),
                                  enqueue=False, acting_user=None)
    do_cancel_campaign(campaign, acting_user=MaintainerFactory(username="ann"))
    assert set(campaign.runs.values_list("status", "failure_kind", "failure_reason")) == {
        (RunStatus.CANCELLED, Kind.CANCELLED, "Cancelled by ann before it started.")}


def test_runs_nobody_can_serve_are_of_kind_unservable():
    now = timezone.now()
    run = RunFactory(queue="gpu2", campaign=Campaign.objects.create(name="c"))
    Run.objects.filter(pk=run.pk).update(queued_at=now - timedelta(hours=1))
    assert do_flag_unservable_runs(now) == [run.pk]
    run.refresh_from_db()
    assert (run.status, run.failure_kind) == (RunStatus.FAILED, Kind.UNSERVABLE)
    assert run.failure_reason.startswith("No worker can serve this run: it needs 2 GPUs (queue gpu2)")


def test_a_failed_run_needs_a_known_kind():
    from runners.actions.runs import do_fail_run_without_executing

    run = RunFactory(status=RunStatus.RUNNING)
    with pytest.raises(ValueError):
        do_fail_run_without_executing(run, "why", "bogus")
    assert do_fail_run_without_executing(run, "why", Kind.INTERNAL)
    assert Run.objects.get(pk=run.pk).failure_kind == Kind.INTERNAL


# --- Runs stored before kinds: the data migration ----------------------------------------------------------

def every_sentence():
    """(status, builder, sentence): at least one sentence of every reason builder there is."""
    limits = Limits(time_limit_seconds=30, memory_mb=1024)
    samples = [
        (failures.time_limit_exceeded, (limits,)), (failures.time_limit_exceeded, (limits, True)),
        (failures.out_of_memory, (limits, "MemoryError")), (failures.output_flood, (limits,)),
        (failures.process_limit_exceeded, (limits,)), (failures.process_limit_reached, (limits, "BlockingIOError")),
        (failures.write_refused, ("PermissionError: x",)), (failures.crashed, (-9,)), (failures.crashed, (1, "boom")),
        (failures.no_oracle_report, ()), (failures.offline_check_failed, ("traincheck check failed",)),
        (failures.unapproved, ()), (failures.fit_failed, ("no pipelines",)), (failures.internal_error, ("oops",)),
        (failures.unservable_reason, ("gpu2", Needs(2), "", [], 10)), (failures.wrong_worker_reason, (Needs(1), [])),
        (failures.cancelled_before_start, ("the system",)), (failures.timer_interrupted, ()),
    ]
    # Sentences first written after kinds existed: every run stored with one has its kind, the migration never saw it.
    written_with_a_kind = {failures.storing_failed, failures.too_many_records, failures.lost_again,
                           failures.detector_setup_failed, failures.isolation_unavailable,
                           failures.environment_not_built, failures.environment_lacks_packages}
    assert {builder for builder, _ in samples} | written_with_a_kind == set(failures.KIND_OF_BUILDER)  # none forgotten
    return [(RunStatus.CANCELLED if builder is failures.cancelled_before_start else RunStatus.FAILED, builder,
             builder(*arguments)) for builder, arguments in samples]


def test_the_migration_classifies_every_sentence_the_code_writes():
    for status, builder, sentence in every_sentence():
        assert MIGRATION.classify(status, sentence) == failures.kind_of(builder), sentence


@pytest.mark.parametrize("status, reason, kind", [
    ("failed", "worker lost", "crash"),  # unrecognised: a failed run crashed
    ("failed", "", "crash"),
    ("cancelled", "", "cancelled"),
    ("succeeded", "", ""), ("queued", "", ""), ("running", "", ""),
    # what devtools.synthetic made up before 0007
    ("failed", "time limit of 60 s exceeded: the process group was killed", "time_limit"),
    ("failed", "out of memory: the address-space limit of 1024 MB was reached", "memory"),
    ("failed", "output flood: more than 32 MiB on stdout; the process group was killed", "output_flood"),
    ("failed", "exit code 1: the reproducer wrote no oracle report (protocol error)", "protocol"),
    ("failed", "exit code 1: RuntimeError: Expected all tensors to be on the same device", "crash"),
    ("failed", "worker lost: still running 5 min past its allowance; requeued and given up", "lost"),
])
def test_the_migration_falls_back_by_status(status, reason, kind):
    assert MIGRATION.classify(status, reason) == kind
    assert kind == "" or kind in Kind.values


def test_the_migration_classifies_the_stored_runs():
    expected = {}
    for status, builder, sentence in every_sentence():
        expected[RunFactory(status=status, failure_reason=sentence).pk] = failures.kind_of(builder)
    expected[RunFactory(status=RunStatus.FAILED, failure_reason="??").pk] = Kind.CRASH
    expected[RunFactory(status=RunStatus.SUCCEEDED).pk] = ""
    expected[RunFactory(status=RunStatus.FAILED, failure_reason="Crashed: x", failure_kind=Kind.LOST).pk] = Kind.LOST
    MIGRATION.classify_stored_runs(apps, None)
    assert dict(Run.objects.values_list("id", "failure_kind")) == expected


def test_the_synthetic_history_fails_with_the_real_sentences_and_kinds():
    version = ReproducerVersionFactory()
    for _, _, builder, arguments in synthetic.FAILURES:
        sentence = builder(*arguments(run_limits(version)))
        assert MIGRATION.classify(RunStatus.FAILED, sentence) == failures.kind_of(builder)
    campaign = Campaign.objects.create(name="synthetic test")
    rng, now, detector = random.Random(1), timezone.now(), do_record_detector("plain")
    runs = [synthetic.make_run(rng, campaign, None, version, detector, "buggy", seed, False, now)
            for seed in range(800)]
    unsuccessful = [run for run in runs if run.status in (RunStatus.FAILED, RunStatus.CANCELLED)]
    assert {run.status for run in unsuccessful} == {RunStatus.FAILED, RunStatus.CANCELLED}
    assert len({run.failure_kind for run in unsuccessful}) > 3
    for run in runs:
        assert run.failure_kind == MIGRATION.classify(run.status, run.failure_reason), run.failure_reason


# --- Retry by kind ------------------------------------------------------------------------------------------

@pytest.fixture
def failed_campaign():
    """A campaign with two time-limit failures, a crash, a cancelled run, an unclassified failure and a success."""
    campaign = Campaign.objects.create(name="kinds")
    make = {Kind.TIME_LIMIT: "Time limit exceeded: still running after 20 s", Kind.CRASH: f"Crashed: {HOSTILE}",
            Kind.CANCELLED: "Cancelled by the system before it started."}
    runs = {kind: RunFactory(campaign=campaign, failure_kind=kind, failure_reason=reason, attempts=1,
                             status=RunStatus.CANCELLED if kind == Kind.CANCELLED else RunStatus.FAILED)
            for kind, reason in make.items()}
    runs["time_limit_2"] = RunFactory(campaign=campaign, status=RunStatus.FAILED, failure_kind=Kind.TIME_LIMIT,
                                      failure_reason=make[Kind.TIME_LIMIT], seed=1)
    runs["unclassified"] = RunFactory(campaign=campaign, status=RunStatus.FAILED, failure_reason="from an old dump")
    runs["ok"] = RunFactory(campaign=campaign, status=RunStatus.SUCCEEDED)
    return campaign, runs


def statuses(runs):
    return {name: Run.objects.get(pk=run.pk).status for name, run in runs.items()}


def test_retry_by_kind_queues_only_those_kinds(failed_campaign):
    campaign, runs = failed_campaign
    crash = runs[Kind.CRASH]
    assert do_retry_failed_runs(campaign, kinds=[Kind.CRASH], acting_user=None) == [crash.pk]
    crash.refresh_from_db()
    assert (crash.status, crash.failure_kind, crash.failure_reason) == (RunStatus.QUEUED, "", "")
    assert [name for name, status in statuses(runs).items() if status == RunStatus.QUEUED] == [Kind.CRASH]
    event = AuditEvent.objects.about(campaign).get(action="retry")
    assert event.detail["kinds"] == ["crash"] and event.detail["runs"][0]["failure_kind"] == "crash"
    assert "(crashed)" in event.summary
    assert do_retry_failed_runs(campaign, kinds=[], acting_user=None) == []
    with pytest.raises(ValueError):
        do_retry_failed_runs(campaign, kinds=["bogus"], acting_user=None)
    assert sorted(do_retry_failed_runs(campaign, acting_user=None)) == sorted(
        runs[name].pk for name in (Kind.TIME_LIMIT, "time_limit_2", Kind.CANCELLED, "unclassified"))


def test_a_retry_leaves_a_historical_reproducers_runs_as_they_are(failed_campaign):
    """A reproducer marked historical after its runs failed never runs again, a retry included."""
    campaign, runs = failed_campaign
    crash = runs[Kind.CRASH]
    Reproducer.objects.filter(pk=crash.reproducer_version.reproducer_id).update(
        historical_reason="Only torch 0.3 had the bug.")
    assert crash.pk not in do_retry_failed_runs(campaign, acting_user=None)
    assert Run.objects.get(pk=crash.pk).status == RunStatus.FAILED


def test_the_api_retries_by_kind_and_refuses_unknown_kinds(failed_campaign):
    campaign, runs = failed_campaign
    url, maintainer = f"/api/campaigns/{campaign.pk}/retry/", api(MaintainerFactory())
    assert api(UserFactory()).post(url, {"kinds": ["crash"]}, format="json").status_code == 403
    bad = maintainer.post(url, {"kinds": ["crash", "bogus"]}, format="json")
    assert bad.status_code == 400
    assert 'Unknown failure kind "bogus"; the kinds are: time_limit, memory,' in str(bad.json())
    assert maintainer.post(url, {"kinds": []}, format="json").status_code == 400
    assert maintainer.post(url, {"kinds": "crash"}, format="json").status_code == 400
    assert RunStatus.QUEUED not in statuses(runs).values()  # nothing retried by a refused request
    done = maintainer.post(url, {"kinds": ["time_limit", "cancelled"]}, format="json")
    assert done.status_code == 200
    assert sorted(done.json()["runs"]) == sorted(runs[name].pk for name in (Kind.TIME_LIMIT, "time_limit_2",
                                                                            Kind.CANCELLED))
    assert sorted(maintainer.post(url).json()["runs"]) == [runs[Kind.CRASH].pk, runs["unclassified"].pk]
    schemas = api().get("/api/schema/?format=json").json()["components"]["schemas"]
    items = schemas["CampaignRetryRequest" if "CampaignRetryRequest" in schemas else "CampaignRetry"][
        "properties"]["kinds"]["items"]
    assert schemas[items["$ref"].rsplit("/", 1)[1]]["enum"] == Kind.values  # the one enum of failure kinds


def test_the_api_shows_and_filters_runs_by_failure_kind(failed_campaign):
    campaign, runs = failed_campaign
    found = api().get(f"/api/runs/?campaign={campaign.pk}&failure_kind=time_limit").json()["results"]
    assert sorted(run["id"] for run in found) == sorted([runs[Kind.TIME_LIMIT].pk, runs["time_limit_2"].pk])
    assert {run["failure_kind"] for run in found} == {"time_limit"}
    assert api().get(f"/api/runs/{runs['ok'].pk}/").json()["failure_kind"] == ""
    assert api().get("/api/runs/?failure_kind=bogus").status_code == 400


def test_retry_failed_takes_kinds(failed_campaign, monkeypatch):
    from runners.management.commands import retry_failed

    campaign, runs = failed_campaign
    monkeypatch.setattr(retry_failed, "wait_with_local_worker", lambda *args, **kwargs: {"counts": {}})
    with pytest.raises(CommandError, match="Unknown failure kind: bogus. The kinds are: time_limit, memory"):
        call_command("retry_failed", str(campaign.pk), "--kinds", "crash,bogus", "--no-worker")
    out = io.StringIO()
    call_command("retry_failed", str(campaign.pk), "--kinds", "time_limit,crash", "--no-worker", stdout=out)
    assert "3 failed run(s) queued again" in out.getvalue()
    assert {name for name, status in statuses(runs).items() if status == RunStatus.QUEUED} == {
        Kind.TIME_LIMIT, "time_limit_2", Kind.CRASH}


# --- Pages --------------------------------------------------------------------------------------------------

def boxes(page):
    """{value: ticked} of the retry form's kind boxes."""
    return {re.search(r'value="(\w+)"', box)[1]: " checked" in box
            for box in re.findall(r'<input type="checkbox" name="kind"[^>]*>', page)}


def test_the_campaign_page_breaks_failures_down_by_kind_and_filters_by_it(client, failed_campaign):
    campaign, runs = failed_campaign
    page = client.get(campaign.get_absolute_url()).content.decode()
    breakdown = page[page.index('id="failure-kinds"'):page.index('class="card failures"')]
    assert re.findall(r'<a href="\?kind=(\w+)" class="badge kind-\w+">([^<]+)</a> <strong>(\d+)</strong>',
                      breakdown) == [("time_limit", "Time limit", "2"), ("crash", "Crashed", "1"),
                                     ("cancelled", "Cancelled", "1")]
    assert "Not classified</span> <strong>1</strong>" in breakdown
    failure_list = page[page.index('class="card failures"'):page.index('class="status-tabs"')]
    assert '<span class="badge kind kind-crash">Crashed</span> <span class="reason">Crashed: &lt;script&gt;' \
        in failure_list
    assert HOSTILE not in page
    assert boxes(page) == {}  # the retry form is for maintainers

    def listed(query):
        """The runs in the run table (the failure list above it shows every failed run)."""
        live = client.get(f"/campaigns/{campaign.pk}/live/{query}").content.decode()
        table = live[live.index('class="status-tabs"'):]
        return {name for name, run in runs.items() if f'href="/runs/{run.pk}/"' in table}

    assert listed("?kind=time_limit") == {Kind.TIME_LIMIT, "time_limit_2"}
    assert listed("?kind=cancelled&status=cancelled") == {Kind.CANCELLED}
    assert listed("?kind=cancelled&status=failed") == set()
    assert listed("?kind=bogus") == set(runs)  # not a kind: no filter
    filtered = client.get(f"{campaign.get_absolute_url()}?kind=time_limit").content.decode()
    assert 'id="kind-filter"' in filtered and ">Time limit</span>" in filtered
    assert 'href="?status=failed&amp;kind=time_limit"' in filtered  # the state tabs keep the kind


def test_the_campaign_pages_retry_form_offers_the_kinds_present(client, failed_campaign):
    campaign, runs = failed_campaign
    client.force_login(MaintainerFactory())
    url, retry = campaign.get_absolute_url(), f"/campaigns/{campaign.pk}/retry/"
    assert boxes(client.get(url).content.decode()) == {"time_limit": True, "crash": True, "cancelled": True}

    page = client.post(retry, {"by_kind": "True"}, follow=True).content.decode()
    assert "Tick at least one kind of failure to retry." in page
    client.post(retry, {"by_kind": "True", "kind": ["crash", "bogus"]})
    assert RunStatus.QUEUED not in statuses(runs).values()

    page = client.post(retry, {"by_kind": "True", "kind": ["crash"]}, follow=True).content.decode()
    assert "Queued 1 failed or cancelled run(s) again (crashed)." in page
    assert {name for name, status in statuses(runs).items() if status == RunStatus.QUEUED} == {Kind.CRASH}
    assert boxes(page) == {"time_limit": True, "cancelled": True}  # what is left

    # every kind present ticked: every failed and cancelled run, the unclassified one too
    client.post(retry, {"by_kind": "True", "kind": ["time_limit", "cancelled"]})
    assert {name for name, status in statuses(runs).items() if status != RunStatus.QUEUED} == {"ok"}


def test_a_retry_without_the_boxes_retries_everything(client, failed_campaign):
    campaign, runs = failed_campaign
    client.force_login(MaintainerFactory())
    client.post(f"/campaigns/{campaign.pk}/retry/")
    assert {name for name, status in statuses(runs).items() if status != RunStatus.QUEUED} == {"ok"}


def test_the_run_page_shows_the_kind(client):
    run = RunFactory(status=RunStatus.FAILED, failure_kind=Kind.MEMORY,
                     failure_reason=f"Out of memory: exceeded the memory limit of 1024 MB. {HOSTILE}")
    page = client.get(run.get_absolute_url()).content.decode()
    assert '<span class="badge kind kind-memory" id="failure-kind">Out of memory</span>' in page
    assert HOSTILE not in page and "&lt;script&gt;" in page


def test_the_compare_page_shows_each_sides_failures_by_kind(client, failed_campaign):
    before, _ = failed_campaign
    after = Campaign.objects.create(name=HOSTILE)
    for seed in range(3):
        RunFactory(campaign=after, status=RunStatus.FAILED, failure_kind=Kind.MEMORY, seed=seed,
                   failure_reason="Out of memory: exceeded the memory limit of 1024 MB.")
    RunFactory(campaign=after, status=RunStatus.FAILED, failure_kind=Kind.TIME_LIMIT, failure_reason="Time limit")
    page = client.get(f"/results/compare/?a=campaign:{before.pk}&b=campaign:{after.pk}").content.decode()
    rows = re.findall(r'<tr class="kind-(\w+)"><td><span class="badge kind-\w*">([^<]+)</span></td>'
                      r'<td>(\d+)</td><td>(\d+)</td></tr>', page)
    assert rows == [("time_limit", "Time limit", "2", "1"), ("memory", "Out of memory", "0", "3"),
                    ("crash", "Crashed", "1", "0"), ("cancelled", "Cancelled", "1", "0"),
                    ("unclassified", "Not classified", "1", "0")]
    assert HOSTILE not in page
    empty = Campaign.objects.create(name="empty")
    page = client.get(f"/results/compare/?a=campaign:{empty.pk}&b=campaign:{empty.pk}").content.decode()
    assert "No failed or cancelled runs on either side." in page
