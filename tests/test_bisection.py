"""Bisection across torch releases: the outcome of a release (majority of seeds, fails apart), the k-section planner
(pure: which releases it probes in which rounds, and how many rounds k workers need), the release list from the
package index, and the driver (evaluation.actions) through its rounds, with the runs' results written as a worker
would write them; the pages and the maintainers' button."""
import io
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.utils import timezone

from bugs.catalog import do_load_catalog
from bugs.models import Bug
from core.models import AuditEvent
from evaluation import actions
from evaluation.actions import do_advance_bisection, do_start_bisection
from evaluation.bisections import BisectionForm
from evaluation.models import Bisection, BisectionStatus
from evaluation.tasks import POLL_SECONDS, advance_bisection
from runners.bisection import (
    ReleaseOutcome,
    index_releases,
    next_probes,
    release_environment,
    release_outcome,
    releases_between,
    simulate,
    spread,
)
from runners.environments.python_environments import build_environment, default_environment
from runners.environments.routing import in_environment
from runners.models import PythonEnvironment, Run, RunStatus
from runners.tasks import execute_run

from .factories import (
    BugFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    UserFactory,
    WorkerFactory,
)
from .test_python_environments import RELEASE as OLD_RELEASE
from .test_python_environments import TEST_ENVIRONMENTS

REPRODUCES, DOES_NOT, FAILS = ReleaseOutcome.REPRODUCES, ReleaseOutcome.DOES_NOT, ReleaseOutcome.FAILS
RELEASES = ["2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0"]


def appears_at(first):
    """An oracle: the bug manifests from release ``first`` on."""
    return lambda release: REPRODUCES if RELEASES.index(release) >= RELEASES.index(first) else DOES_NOT


@pytest.mark.parametrize("seeds, manifested, failed, outcome", [
    (3, 3, 0, REPRODUCES), (3, 2, 1, REPRODUCES), (3, 2, 0, REPRODUCES),
    (3, 1, 0, DOES_NOT), (3, 0, 1, DOES_NOT), (3, 0, 0, DOES_NOT),
    (3, 1, 1, FAILS), (3, 0, 2, FAILS), (3, 0, 3, FAILS),
    (2, 1, 0, DOES_NOT),  # a tie is no majority
    (1, 1, 0, REPRODUCES), (1, 0, 1, FAILS),
])
def test_a_release_has_the_bug_when_most_seeds_manifest_it(seeds, manifested, failed, outcome):
    assert release_outcome(seeds, manifested, failed) == outcome


def test_an_outcome_needs_a_seed():
    with pytest.raises(ValueError, match="at least one seed"):
        release_outcome(0, 0, 0)


def test_spread_splits_the_candidates_evenly():
    assert spread(list("abcdefg"), 1) == ("d",)
    assert spread(list("abcdefg"), 3) == ("b", "d", "f")
    assert spread(list("ab"), 3) == ("a", "b")


@pytest.mark.parametrize("k, rounds", [
    # one worker: both ends, then halving (the middle of the five between, then of the two left below it)
    (1, [["2.9.0"], ["2.13.0"], ["2.11.0"], ["2.10.0"]]),
    # two: both ends at once, then thirds
    (2, [["2.9.0", "2.13.0"], ["2.10.0", "2.12.0"], ["2.11.0"]]),
    # three: the ends and the middle in the first round, then what is left between the last good and first bad
    (3, [["2.9.0", "2.13.0", "2.11.0"], ["2.9.1", "2.10.0"]]),
])
def test_the_k_section_planner_probes_k_releases_a_round(k, rounds):
    simulation = simulate(RELEASES, appears_at("2.11.0"), k)
    assert simulation.rounds == rounds
    assert (simulation.result.first_changed, simulation.result.last_same) == ("2.11.0", "2.10.0")
    assert all(len(probes) <= k for probes in simulation.rounds)


def test_more_workers_need_fewer_rounds_for_any_change():
    """Over every place the change can be, the worst case of rounds falls as workers are added, and the planner
    always finds the right release."""
    worst = {}
    for k in (1, 2, 3, 4):
        for first in RELEASES[1:]:
            simulation = simulate(RELEASES, appears_at(first), k)
            assert simulation.result.first_changed == first
            assert len(set(sum(simulation.rounds, []))) == simulation.probes  # no release probed twice
            worst[k] = max(worst.get(k, 0), len(simulation.rounds))
    assert worst == {1: 5, 2: 3, 3: 2, 4: 2}


def test_a_failing_release_is_skipped_and_reported():
    def oracle(release):
        return FAILS if release == "2.10.0" else appears_at("2.12.0")(release)

    simulation = simulate(RELEASES, oracle, 2)
    assert simulation.rounds == [["2.9.0", "2.13.0"], ["2.10.0", "2.12.0"], ["2.9.1", "2.11.0"]]
    result = simulation.result
    assert (result.first_changed, result.last_same, result.failed_between) == ("2.12.0", "2.11.0", ())
    # the failing release lies between the last agreeing and the first disagreeing one: the change may be there
    simulation = simulate(RELEASES, lambda r: FAILS if r == "2.10.0" else appears_at("2.10.0")(r), 1)
    assert (simulation.result.first_changed, simulation.result.last_same) == ("2.11.0", "2.9.1")
    assert simulation.result.failed_between == ("2.10.0",)
    assert "2.10.0 between them failed" in simulation.result.reason


def test_no_change_and_a_failing_end_stop_the_search():
    assert next_probes(RELEASES, {"2.9.0": REPRODUCES, "2.13.0": REPRODUCES}, 2).result.reason == (
        "no change: the oracle says reproduces on both 2.9.0 and 2.13.0")
    result = next_probes(RELEASES, {"2.9.0": FAILS, "2.13.0": REPRODUCES}, 2).result
    assert result.first_changed is None and "the good release 2.9.0 fails" in result.reason


def test_a_fix_is_bisected_from_the_release_that_has_the_bug():
    releases = releases_between("2.13.0", "2.9.0", RELEASES)
    assert releases == RELEASES[::-1]
    simulation = simulate(releases, appears_at("2.11.0"), 2)  # the bug is there from 2.11.0: 2.10.0 is "fixed"
    assert (simulation.result.first_changed, simulation.result.last_same) == ("2.10.0", "2.11.0")


def test_releases_between_names_what_is_missing():
    assert releases_between("2.10.0", "2.12.0", RELEASES) == ["2.10.0", "2.11.0", "2.12.0", "2.12.1"][:3]
    with pytest.raises(ValueError, match=r"2\.8\.0 is not among the releases \(2\.9\.0, 2\.9\.1"):
        releases_between("2.8.0", "2.13.0", RELEASES)
    with pytest.raises(ValueError, match="'two' is not a release version"):
        releases_between("two", "2.13.0", RELEASES)


def test_releases_are_compared_as_versions_and_a_pre_release_end_is_refused():
    """"2.9" is "2.9.0": listed once, the ends as given; a pre-release end is refused, never silently dropped."""
    assert releases_between("2.9", "2.11.0", ["2.9.0", "2.9", "2.10", "2.10.0", "2.11.0", "2.11.0rc1"]) == [
        "2.9", "2.10", "2.11.0"]
    assert releases_between("2.11", "2.9.0", ["2.9", "2.10.0", "2.11.0"]) == ["2.11", "2.10.0", "2.9.0"]
    with pytest.raises(ValueError, match=r"'2\.13\.0rc1' is a pre-release: a bisection runs between final releases"):
        releases_between("2.9.0", "2.13.0rc1", ["2.9.0", "2.10.0", "2.13.0rc1"])


def test_index_releases_are_the_final_releases_with_a_wheel_for_this_platform(tmp_path):
    """PyPI's JSON API, read from a file of the same form."""
    wheel = {"filename": "torch-{}-cp311-cp311-manylinux_2_28_x86_64.whl", "yanked": False}
    data = {"releases": {
        "2.9.0": [dict(wheel, filename=wheel["filename"].format("2.9.0"))],
        "2.10.0": [dict(wheel, filename=wheel["filename"].format("2.10.0"))],
        "2.11.0": [dict(wheel, filename="torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl")],  # another Python
        "2.12.0": [dict(wheel, filename=wheel["filename"].format("2.12.0"), yanked=True)],
        "2.13.0rc1": [dict(wheel, filename=wheel["filename"].format("2.13.0rc1"))],
        "2.13.0": [dict(wheel, filename=wheel["filename"].format("2.13.0"))],
    }}
    (tmp_path / "torch.json").write_text(json.dumps(data))
    assert index_releases(url=f"file://{tmp_path}/{{package}}.json") == ["2.9.0", "2.10.0", "2.13.0"]


# --- The driver, through the database ---

@pytest.fixture
def environments():
    """The default environment (torch 2.13.0+cpu) and four others, each served by a live worker."""
    found = {"2.13.0": PythonEnvironment.objects.create(name="py3.11-torch2.13.0+cpu", torch="2.13.0+cpu",
                                                        python="3.11.7", is_default=True)}
    for release in ("2.9.0", "2.10.0", "2.11.0", "2.12.0"):
        found[release] = PythonEnvironment.objects.create(name=f"py3.11-torch{release}", torch=release,
                                                          python="3.11.7", requirements=[f"torch=={release}"],
                                                          resolved={"torch": release})
    WorkerFactory(queues=["cpu", *(in_environment("cpu", env.name) for env in found.values() if not env.is_default)],
                  concurrency=2)
    return found


@pytest.fixture
def bug():
    """A bug whose reproducer declares that it applies to torch 2.9 to 2.11 only: a bisection probes it anyway."""
    bug = BugFactory(bug_id="PT-1")
    manifest = {"entrypoint": "repro.py", "strategy": "faithful", "default_steps": 3,
                "needs": {"time_limit_seconds": 20, "memory_mb": 1024, "packages": ["torch>=2.9,<2.12"]}}
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug, name="cpu"), manifest=manifest)
    return bug


def finish_round(bisection, oracle, failed_seed=None):
    """Finish the open round's runs as a worker would: manifested on every seed where ``oracle`` says so."""
    for run in Run.objects.filter(campaign__in=bisection.probes.filter(outcome="").values("campaign"),
                                  status=RunStatus.QUEUED).select_related("python_environment"):
        release = run.python_environment.torch.split("+")[0]
        failed = run.seed == failed_seed
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.FAILED if failed else RunStatus.SUCCEEDED, finished_at=timezone.now(), wall_seconds=2.5,
            manifested=None if failed else oracle(release) == REPRODUCES)


@pytest.mark.django_db
def test_a_bisection_runs_its_rounds_on_the_workers_and_stores_its_path(environments, bug):
    releases = ["2.9.0", "2.10.0", "2.11.0", "2.12.0", "2.13.0"]
    oracle = appears_at("2.12.0")
    bisection = do_start_bisection(bug, "2.9.0", "2.13.0", seeds=range(3), releases=releases,
                                   acting_user=MaintainerFactory())
    rounds = []
    while bisection.status == BisectionStatus.RUNNING:
        bisection = do_advance_bisection(bisection, acting_user=None)
        open_probes = list(bisection.probes.filter(outcome="").order_by("id"))
        if open_probes:
            rounds.append([probe.release for probe in open_probes])
            assert do_advance_bisection(bisection).probes.filter(outcome="").count() == len(open_probes)  # waits
            finish_round(bisection, oracle, failed_seed=2)
    # two free slots (one worker of concurrency 2): the ends, then the thirds of 2.10.0..2.12.0, then 2.11.0
    assert rounds == [["2.9.0", "2.13.0"], ["2.10.0", "2.12.0"], ["2.11.0"]]
    assert (bisection.first_changed, bisection.last_same) == ("2.12.0", "2.11.0")
    probe = bisection.probes.get(release="2.13.0")
    assert (probe.outcome, probe.runs, probe.manifested, probe.failed, probe.seconds) == (REPRODUCES, 3, 2, 1, 7.5)
    runs = Run.objects.filter(campaign=probe.campaign, python_environment=environments["2.13.0"])
    assert {(run.variant, run.detector.name, run.queue) for run in runs} == {("buggy", "plain", "cpu")}
    assert set(Run.objects.filter(python_environment=environments["2.11.0"]).values_list("queue", flat=True)) == {
        in_environment("cpu", "py3.11-torch2.11.0")}
    events = AuditEvent.objects.filter(target_id=str(bisection.pk), target_type__model="bisection")
    assert sorted(events.values_list("action", flat=True)) == ["create", "finish"]


@pytest.mark.django_db
def test_a_bisection_fails_with_the_reason_when_no_worker_serves_a_release(environments, bug):
    bisection = do_start_bisection(bug, "2.9.0", "2.13.0", seeds=[0], releases=["2.9.0", "2.13.0"], workers=2,
                                   acting_user=None)
    PythonEnvironment.objects.filter(torch="2.9.0").update(name="py3.11-torch2.9.0-other")
    bisection = do_advance_bisection(bisection)
    assert bisection.status == BisectionStatus.FAILED
    assert "no live worker serves torch 2.9.0 (py3.11-torch2.9.0-other)" in bisection.reason
    assert 'SILENTBENCH_WORKER_ENVIRONMENTS="torch==2.9.0"' in bisection.reason
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_probe_runs_in_the_environment_of_its_release_that_a_worker_serves(environments, bug):
    """Two environments have torch 2.9.0 (one with numpy too, as old releases need): the probe takes the served one."""
    with_numpy = PythonEnvironment.objects.create(name="py3.11-torch2.9.0-numpy1.26.4", torch="2.9.0", python="3.11.7",
                                                  resolved={"torch": "2.9.0", "numpy": "1.26.4"})
    WorkerFactory(queues=[in_environment("cpu", with_numpy.name)])
    # the other one: first by name, but not served
    PythonEnvironment.objects.filter(name="py3.11-torch2.9.0").update(name="py3.11-torch2.9.0-a")
    bisection = do_start_bisection(bug, "2.9.0", "2.13.0", seeds=[0], releases=["2.9.0", "2.13.0"], workers=2,
                                   acting_user=None)
    bisection = do_advance_bisection(bisection)
    assert bisection.status == BisectionStatus.RUNNING, bisection.reason
    assert bisection.probes.get(release="2.9.0").environment == with_numpy


@pytest.mark.django_db
def test_a_probe_runs_in_the_environment_of_its_release_that_the_reproducer_runs_in(environments):
    """Two served environments have torch 2.9.0; the reproducer declares numpy<2, which only one of them has."""
    bug = BugFactory(bug_id="PT-3")
    manifest = {"entrypoint": "repro.py", "strategy": "faithful", "default_steps": 3,
                "needs": {"time_limit_seconds": 20, "memory_mb": 1024, "packages": ["torch>=2.9,<2.12", "numpy<2"]}}
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug, name="cpu"), manifest=manifest)
    with_numpy = PythonEnvironment.objects.create(name="py3.11-torch2.9.0-numpy1.26.4", torch="2.9.0", python="3.11.7",
                                                  resolved={"torch": "2.9.0", "numpy": "1.26.4"})
    WorkerFactory(queues=[in_environment("cpu", with_numpy.name)])
    assert release_environment("2.9.0") == environments["2.9.0"]  # first by name without a reproducer to fit
    assert release_environment("2.9.0", versions=[version]) == with_numpy
    bisection = do_start_bisection(bug, "2.9.0", "2.13.0", seeds=[0], releases=["2.9.0", "2.13.0"], workers=2,
                                   acting_user=None)
    bisection = do_advance_bisection(bisection)
    assert bisection.status == BisectionStatus.RUNNING, bisection.reason
    assert bisection.probes.get(release="2.9.0").environment == with_numpy


@pytest.mark.django_db
def test_an_unexpected_error_fails_the_bisection_instead_of_leaving_it_running(environments, bug, monkeypatch,
                                                                                caplog):
    later = []
    monkeypatch.setattr(advance_bisection, "apply_async", lambda args, countdown: later.append((args, countdown)))

    def broken(*args, **kwargs):
        raise KeyError("forced")
    monkeypatch.setattr(actions, "probe_plan", broken)
    bisection = do_start_bisection(bug, "2.9.0", "2.13.0", seeds=[0], releases=["2.9.0", "2.13.0"], acting_user=None)
    advance_bisection(bisection.pk)
    bisection.refresh_from_db()
    assert bisection.status == BisectionStatus.FAILED and bisection.finished_at is not None
    assert bisection.reason == "unexpected error: KeyError: 'forced'"
    assert later == []  # the chain ends with the bisection, not before it
    assert any(record.exc_info and "bisection #" in record.getMessage() for record in caplog.records)
    events = AuditEvent.objects.filter(target_id=str(bisection.pk), target_type__model="bisection")
    assert sorted(events.values_list("action", flat=True)) == ["create", "fail"]


@pytest.mark.django_db
def test_the_releases_come_from_the_index_when_not_given(environments, bug):
    bisection = do_start_bisection(bug, "2.10.0", "2.12.0", seeds=[0], workers=1, acting_user=None)
    bisection = do_advance_bisection(bisection, available=lambda: RELEASES)
    assert bisection.status == BisectionStatus.RUNNING, bisection.reason
    assert bisection.releases == ["2.10.0", "2.11.0", "2.12.0"]
    assert list(bisection.probes.values_list("release", flat=True)) == ["2.10.0"]


@pytest.mark.django_db
def test_bad_starts_are_refused_with_every_reason(bug):
    with pytest.raises(ValidationError) as refused:
        do_start_bisection(bug, "2.13.0", "2.13.0", seeds=[], releases=None, steps=0, acting_user=None)
    assert refused.value.messages == ["The good and the bad release must differ.",
                                      "Give between 1 and 10 seeds, none negative.",
                                      "Steps must be between 1 and 100000."]
    with pytest.raises(ValidationError, match="PT-2 has no approved CPU reproducer"):
        do_start_bisection(BugFactory(bug_id="PT-2"), "2.9.0", "2.13.0", seeds=[0], acting_user=None)
    with pytest.raises(ValidationError, match="2.8.0 is not among the releases"):
        do_start_bisection(bug, "2.8.0", "2.13.0", seeds=[0], releases=RELEASES, acting_user=None)
    with pytest.raises(ValidationError, match="'2.13.0rc1' is a pre-release"):
        do_start_bisection(bug, "2.9.0", "2.13.0rc1", seeds=[0], acting_user=None)
    form = BisectionForm({"bug": "PT-1", "good": "2.9.0", "bad": "2.13.0rc1", "seeds": 3})
    assert not form.is_valid() and "'2.13.0rc1' is a pre-release" in form.errors["bad"][0]


@pytest.mark.django_db
def test_the_command_says_why_a_bisection_cannot_run(bug):
    with pytest.raises(CommandError, match="No bug 'PT-404'"):
        call_command("bisect", "PT-404", "--good", "2.9.0", "--bad", "2.13.0", stdout=io.StringIO())
    with pytest.raises(CommandError, match="'2.13.0rc1' is a pre-release"):
        call_command("bisect", "PT-1", "--good", "2.9.0", "--bad", "2.13.0rc1", stdout=io.StringIO())
    with pytest.raises(CommandError, match="2.8.0 is not among the releases"):
        call_command("bisect", "PT-1", "--good", "2.8.0", "--bad", "2.13.0", "--releases", "2.9.0,2.13.0",
                     stdout=io.StringIO())
    PythonEnvironment.objects.create(name="py3.11-torch2.13.0+cpu", torch="2.13.0+cpu", python="3.11.7",
                                     is_default=True)
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"no live worker serves torch 2.12.0 \(no environment built\)"):
        call_command("bisect", "PT-1", "--good", "2.12.0", "--bad", "2.13.0", "--releases", "2.12.0,2.13.0",
                     "--workers", "1", stdout=out)
    bisection = Bisection.objects.get()
    assert bisection.status == BisectionStatus.FAILED and not bisection.probes.exists()
    assert "failed: no live worker serves" in out.getvalue()


@pytest.mark.django_db
def test_the_task_drives_a_bisection_until_it_ends(environments, bug, monkeypatch):
    later = []
    monkeypatch.setattr(advance_bisection, "apply_async", lambda args, countdown: later.append((args, countdown)))
    bisection = do_start_bisection(bug, "2.9.0", "2.13.0", seeds=[0], releases=["2.9.0", "2.13.0"], acting_user=None)
    advance_bisection(bisection.pk)
    assert later == [([bisection.pk], POLL_SECONDS)] and bisection.probes.count() == 2
    finish_round(bisection, appears_at("2.13.0"))
    advance_bisection(bisection.pk)
    assert len(later) == 1  # finished: not called again
    bisection.refresh_from_db()
    assert (bisection.status, bisection.first_changed) == (BisectionStatus.FINISHED, "2.13.0")
    advance_bisection(999)  # a bisection deleted meanwhile: nothing to do


# --- Pages and the button ---

@pytest.mark.django_db
def test_only_maintainers_start_a_bisection_and_the_workers_drive_it(client, bug, django_capture_on_commit_callbacks,
                                                                     monkeypatch):
    form = {"bug": "PT-1", "good": "2.9.0", "bad": "2.13.0", "releases": "2.9.0, 2.11.0, 2.13.0", "seeds": "3"}
    assert client.post("/results/bisections/start/", form).status_code in (302, 403)
    client.force_login(UserFactory())
    assert client.post("/results/bisections/start/", form).status_code == 403
    assert not Bisection.objects.exists()
    client.force_login(MaintainerFactory())
    page = client.get("/results/bisections/?bug=PT-1").content.decode()
    assert 'id="start-bisection"' in page and 'value="PT-1"' in page
    sent = []
    monkeypatch.setattr("evaluation.views.advance_bisection.delay", sent.append)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/results/bisections/start/", form)
    bisection = Bisection.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/results/bisections/{bisection.pk}/"
    assert sent == [bisection.pk]  # the driver runs on a worker, not in the request
    assert (bisection.releases, bisection.seeds, bisection.workers) == (["2.9.0", "2.11.0", "2.13.0"], [0, 1, 2], None)
    bad = client.post("/results/bisections/start/", {**form, "good": "yesterday"})
    assert bad.status_code == 400 and "&#x27;yesterday&#x27; is not a release version" in bad.content.decode()
    missing = client.post("/results/bisections/start/", {**form, "good": "2.8.0"})
    assert missing.status_code == 400 and "2.8.0 is not among the releases" in missing.content.decode()


@pytest.mark.django_db
def test_the_bisection_page_shows_the_path_and_the_bug_page_links_it(client, environments, bug):
    bisection = do_start_bisection(bug, "2.9.0", "2.13.0", seeds=range(3), releases=["2.9.0", "2.11.0", "2.13.0"],
                                   workers=2, acting_user=None)
    while bisection.status == BisectionStatus.RUNNING:
        bisection = do_advance_bisection(bisection)
        finish_round(bisection, appears_at("2.11.0"))
    page = client.get(bisection.get_absolute_url()).content.decode()
    assert "First release where the oracle changed: <strong>2.11.0</strong>" in page
    assert "<td>1</td><td>2.9.0</td><td>does not</td><td>0/3</td><td>0</td>" in page
    assert "<td>2</td><td>2.11.0</td><td>reproduces</td><td>3/3</td><td>0</td>" in page
    assert "2 rounds, 9 runs, 22.5 s of runs" in page
    bug_page = client.get("/bugs/PT-1/").content.decode()
    link = f'href="/results/bisections/{bisection.pk}/">#{bisection.pk}</a>'
    assert f"{link} (2.9.0 → 2.13.0: first changed at 2.11.0)" in bug_page
    assert "Bisect across releases" not in bug_page  # not for the public
    assert client.get("/results/bisections/999/").status_code == 404


# --- One real bisection, end to end ---

@pytest.fixture
def built_old_release(settings):
    """The one extra environment the suite builds (tests/test_python_environments.py: torch 2.11.0, kept under
    TEST_ENVIRONMENTS between runs), found built there."""
    settings.SILENTBENCH_ENVIRONMENTS_DIR = TEST_ENVIRONMENTS
    return build_environment([f"torch=={OLD_RELEASE}"])


@pytest.mark.once
@pytest.mark.integration
@pytest.mark.django_db
def test_a_real_bisection_runs_real_reproducers_on_two_releases(built_old_release, settings):
    """PT-115607's CPU reproducer, bisected from torch 2.11.0 (the built environment) to 2.13.0 (the workers' own):
    one round of two probes, their runs executed by the task a worker runs (claim, sandbox, result) on each
    release's interpreter; the symptom manifests on both, so the oracle never changes."""
    do_load_catalog(settings.SILENTBENCH_CATALOG_DIR)
    default = default_environment()
    WorkerFactory(queues=["cpu", in_environment("cpu", built_old_release.name)], concurrency=2)
    bisection = do_start_bisection(Bug.objects.get(bug_id="PT-115607"), OLD_RELEASE, "2.13.0",
                                   seeds=[0], releases=[OLD_RELEASE, "2.13.0"], reproducer="cpu", acting_user=None)
    bisection = do_advance_bisection(bisection)
    probes = {probe.release: probe for probe in bisection.probes.all()}
    assert {release: probe.environment for release, probe in probes.items()} == {
        OLD_RELEASE: built_old_release, "2.13.0": default}
    for run in Run.objects.filter(campaign=probes[OLD_RELEASE].campaign):
        execute_run.apply(args=[run.pk])
    bisection = do_advance_bisection(bisection)
    failures = list(Run.objects.filter(campaign=probes[OLD_RELEASE].campaign).exclude(
        status=RunStatus.SUCCEEDED).values_list("failure_reason", "stderr"))
    assert not failures, failures
    assert bisection.status == BisectionStatus.FINISHED, bisection.reason
    assert bisection.reason == f"no change: the oracle says reproduces on both {OLD_RELEASE} and 2.13.0"
    for release, probe in probes.items():
        probe.refresh_from_db()
        [run] = Run.objects.filter(campaign=probe.campaign, python_environment=probe.environment)
        assert run.status == RunStatus.SUCCEEDED, (run.failure_reason, run.stderr[-2000:])
        assert run.environment.torch.partition("+")[0] == release  # the torch the run really imported
        assert (probe.outcome, probe.runs, probe.manifested) == (REPRODUCES, 1, 1)
        assert probe.seconds == pytest.approx(run.wall_seconds)
