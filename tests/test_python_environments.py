"""Python environments (runners.environments): routing by environment, plans across environments, and, with a
real environment built by uv (torch 2.11.0 from the package index), a real reproducer run through the real
executor and sandbox on that interpreter, warm and cold.

The suite builds one environment at most, in the run-once pass, under a folder that outlives the test run
(``TEST_ENVIRONMENTS``): the first build on a machine takes about 20 s with a warm uv cache (minutes without),
later ones find it built."""
import json
import os
import re
import shutil
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management import call_command
from django.utils import timezone

from benchmark_site import settings as site_settings
from benchmark_site.celery import app
from bugs.catalog import do_load_catalog
from evaluation.compare import side
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.actions.runs import do_flag_unservable_runs
from runners.actions.workers import current_environment
from runners.environments.python_environments import (
    BUILT_MARKER,
    build_environment,
    default_environment,
    do_advertise_environments,
    environment_name,
    environment_python,
    facts_in,
    parse_requirements,
)
from runners.environments.routing import (
    Needs,
    describe_worker,
    environment_of_queue,
    needs_of_queue,
    queue_for,
    queues_in_environments,
)
from runners.execution import execute
from runners.models import Campaign, EnvironmentBuild, PythonEnvironment, Run, RunFailureKind, RunStatus, Worker
from runners.plans import CampaignPlan
from runners.progress import wait_for_campaign
from runners.selectors import runnable_versions
from runners.tasks import execute_run
from runners.worker.local import log_tail, start_worker, stop_process
from runners.worker.startup import consume_environment_queues

from .factories import PROGRAM_PREAMBLE, MaintainerFactory, ReproducerVersionFactory, RunFactory

pytestmark = pytest.mark.django_db

RELEASE = "2.11.0"
TEST_ENVIRONMENTS = Path.home() / ".cache" / "silentbench-test-environments"


def environment(name="py3.11-torch2.11.0", torch="2.11.0", **resolved):
    """A record of an environment that is not built (routing and plans need none)."""
    return PythonEnvironment.objects.create(name=name, requirements=[f"torch=={torch}"], python="3.11.7", torch=torch,
                                            resolved={"torch": torch, **resolved})


def version_needing(packages, **needs):
    manifest = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 3,
                "needs": {"time_limit_seconds": 20, "memory_mb": 1024, "packages": packages, **needs}}
    return ReproducerVersionFactory(manifest=manifest)


# --- Names, requirements, settings ----------------------------------------------------------------------------

def test_an_environment_is_named_by_what_it_resolved_to():
    assert environment_name("3.11.7", ["torch"], {"torch": "2.11.0"}) == "py3.11-torch2.11.0"
    assert environment_name("3.11.7", ["torch"], {"torch": "2.11.0+cu128"}) == "py3.11-torch2.11.0_cu128"
    assert environment_name("3.11.7", ["Torch", "NumPy"], {"torch": "2.15.0", "numpy": "2.4.6", "sympy": "1.14"}) \
        == "py3.11-torch2.15.0-numpy2.4.6"


def test_requirements_must_be_pip_requirements_and_pin_torch():
    assert parse_requirements(["torch==2.11.0", " numpy ", "torch==2.11.0"]) == ["torch==2.11.0", "numpy"]
    with pytest.raises(ValueError, match="needs a torch requirement"):
        parse_requirements(["numpy==2.4.6"])
    with pytest.raises(ValueError, match="is not a pip requirement"):
        parse_requirements(["torch=2.11"])


def test_the_worker_environments_setting_is_parsed_strictly(monkeypatch):
    variable = "SILENTBENCH_WORKER_ENVIRONMENTS"
    monkeypatch.setenv(variable, "torch==2.11.0; torch==2.15.0, numpy==2.4.6;")
    assert site_settings.env_requirement_sets(variable, "") == [["torch==2.11.0"], ["torch==2.15.0", "numpy==2.4.6"]]
    monkeypatch.setenv(variable, "numpy")
    with pytest.raises(ImproperlyConfigured, match="pins no torch"):
        site_settings.env_requirement_sets(variable, "")
    monkeypatch.setenv(variable, "torch=2.11")
    with pytest.raises(ImproperlyConfigured, match=variable):
        site_settings.env_requirement_sets(variable, "")
    monkeypatch.setenv("SILENTBENCH_UV_CACHE_DIR", "relative/cache")
    with pytest.raises(ImproperlyConfigured, match="not an absolute path"):
        site_settings.env_path("SILENTBENCH_UV_CACHE_DIR", "/x")
    monkeypatch.setenv("SILENTBENCH_UV_CACHE_DIR", "~/uv")
    assert site_settings.env_path("SILENTBENCH_UV_CACHE_DIR", "/x") == Path.home() / "uv"


def test_the_default_environment_is_the_workers_own_interpreter():
    default = default_environment()
    assert default.is_default and default_environment() == default
    assert default.torch.startswith("2.13.0") and default.name == f"py3.11-torch{default.torch}".replace("+", "_")
    assert environment_python(default) == Path(sys.executable) == environment_python(None)


def test_the_default_environment_is_never_a_built_record_that_has_its_name():
    """A built environment of the same torch and nothing else has the name the default's packages give: the
    default record is made apart, under that name and "-default", and found again."""
    name = default_environment().name
    PythonEnvironment.objects.all().delete()
    built = environment(name=name, torch="2.13.0")
    default = default_environment()
    assert default.is_default and default != built and default.name == f"{name}-default"
    assert default_environment() == default and not PythonEnvironment.objects.get(pk=built.pk).is_default


def test_a_build_that_stops_while_writing_its_marker_leaves_none(settings, tmp_path, monkeypatch):
    """The marker says an environment is built: written whole or not at all, so that a build stopped half-way (the
    disk full) is built again, not found with a marker that cannot be read."""
    from runners.environments import python_environments as environments

    settings.SILENTBENCH_ENVIRONMENTS_DIR = tmp_path
    monkeypatch.setattr(environments, "resolve", lambda requirements: ["torch==9.9.9"])

    def build(requirements, pins, directory):
        directory.mkdir(parents=True, exist_ok=True)
        return {"packages": {"torch": "9.9.9"}, "python": "3.11.7", "torch": "9.9.9"}
    monkeypatch.setattr(environments, "_build", build)
    write_text = Path.write_text

    def disk_full(path, data, *args, **kwargs):
        write_text(path, data[:len(data) // 2])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError, match="No space left"):
        build_environment(["torch==9.9.9"])
    assert not list(tmp_path.glob(f"*/{BUILT_MARKER}"))
    monkeypatch.setattr(Path, "write_text", write_text)
    built = build_environment(["torch==9.9.9"])
    marker = json.loads((tmp_path / built.name / BUILT_MARKER).read_text())
    assert (built.torch, marker["torch"]) == ("9.9.9", "9.9.9")


# --- Routing ----------------------------------------------------------------------------------------------------

def test_a_run_in_another_environment_goes_to_a_queue_that_names_it():
    other = environment()
    cpu, gpu = version_needing(["torch>=2.0"]), version_needing(["torch>=2.0"], gpus=2, gpu_memory_gb=40)
    assert (queue_for(cpu), queue_for(cpu, default_environment()), queue_for(cpu, other)) == (
        "cpu", "cpu", "cpu.py3.11-torch2.11.0")
    assert queue_for(gpu, other) == "gpu2-40gb.py3.11-torch2.11.0"
    assert needs_of_queue("gpu2-40gb.py3.11-torch2.11.0") == Needs(2, 40) and needs_of_queue("cpu.x") == Needs()
    assert (environment_of_queue("gpu1.py3.11-torch2.11.0"), environment_of_queue("gpu1")) == ("py3.11-torch2.11.0",
                                                                                               "")


def test_a_worker_consumes_each_of_its_queues_in_each_environment_it_built():
    assert queues_in_environments(["cpu", "gpu1", "celery"], ["py3.11-torch2.11.0", "py3.11-torch2.15.0"]) == [
        "cpu", "gpu1", "celery", "cpu.py3.11-torch2.11.0", "gpu1.py3.11-torch2.11.0", "cpu.py3.11-torch2.15.0",
        "gpu1.py3.11-torch2.15.0"]


def test_a_worker_advertises_its_environments():
    other = environment()
    worker = Worker.objects.create(hostname="w@a", queues=["cpu", "cpu.py3.11-torch2.11.0"], last_seen=timezone.now())
    worker = do_advertise_environments(worker, [other])
    assert Worker.objects.get(pk=worker.pk).capabilities["environments"] == ["py3.11-torch2.11.0"]
    assert describe_worker(worker) == "w@a (cpu; environments py3.11-torch2.11.0)"


def test_nobody_can_serve_a_run_of_an_environment_no_live_worker_built():
    other = environment()
    now = timezone.now()
    Worker.objects.create(hostname="w@a", queues=["cpu", "cpu.py3.11-torch2.15.0"], last_seen=now)
    run = RunFactory(queue="cpu.py3.11-torch2.11.0", python_environment=other,
                     campaign=Campaign.objects.create(name="c"))
    served = RunFactory(queue="cpu.py3.11-torch2.15.0", campaign=Campaign.objects.create(name="d"))
    Run.objects.filter(pk__in=[run.pk, served.pk]).update(queued_at=now - timedelta(hours=1))
    assert do_flag_unservable_runs(now) == [run.pk]
    run.refresh_from_db()
    assert (run.status, run.failure_kind) == (RunStatus.FAILED, RunFailureKind.UNSERVABLE)
    assert run.failure_reason.startswith("No worker can serve this run: it needs no GPU in the environment "
                                         "py3.11-torch2.11.0 (queue cpu.py3.11-torch2.11.0)")
    assert "w@a (cpu; environments py3.11-torch2.15.0)" in run.failure_reason


# --- Plans across environments -----------------------------------------------------------------------------------

def test_a_campaign_spans_environments_where_its_reproducers_declare_they_apply():
    old = environment("py3.11-torch2.3.0", "2.3.0")
    other = environment()
    recent, anything = version_needing(["torch>=2.4"]), version_needing(["torch>=2.0"])
    plan = CampaignPlan.build([recent, anything], [do_record_detector("plain")], variants=["buggy"],
                              environments=[old, other, default_environment()])
    cells = {(run.version, run.environment) for run in plan.runs}
    assert cells == {(anything, old), (recent, other), (anything, other), (recent, default_environment()),
                     (anything, default_environment())}
    campaign = do_create_campaign("matrix", plan, enqueue=False, acting_user=None)
    assert campaign.parameters["environments"] == [old.name, other.name, default_environment().name]
    assert set(campaign.runs.values_list("reproducer_version", "python_environment__name", "queue")) == {
        (anything.pk, "py3.11-torch2.3.0", "cpu.py3.11-torch2.3.0"), (recent.pk, other.name, f"cpu.{other.name}"),
        (anything.pk, other.name, f"cpu.{other.name}"), (recent.pk, default_environment().name, "cpu"),
        (anything.pk, default_environment().name, "cpu")}
    assert CampaignPlan.build([recent], [do_record_detector("plain")]).environments == (default_environment(),)


def test_a_plan_whose_environments_none_of_its_reproducers_apply_to_is_refused():
    with pytest.raises(ValidationError) as refused:
        CampaignPlan.build([version_needing(["torch>=2.4"])], [do_record_detector("plain")],
                           environments=[environment("py3.11-torch2.3.0", "2.3.0")])
    assert "No chosen reproducer declares packages" in refused.value.message_dict["environments"][0]


def test_a_maintainer_asks_for_environments_in_the_api_and_the_builder(client):
    """``environments`` by name in POST /api/campaigns/ and in the campaign builder; an unknown name is a 400 that
    names it, and nothing is created."""
    other = environment()
    version = version_needing(["torch>=2.0"])
    version.reproducer.bug.status = "verified"
    version.reproducer.bug.save()
    client.force_login(MaintainerFactory())
    body = {"name": "on 2.11", "bugs": [version.reproducer.bug.bug_id], "detectors": ["plain"], "variants": ["buggy"],
            "seeds": [0], "environments": [other.name]}
    created = client.post("/api/campaigns/", body, content_type="application/json")
    assert created.status_code == 201, created.content
    campaign = Campaign.objects.get(pk=created.json()["id"])
    assert list(campaign.runs.values_list("python_environment__name", "queue")) == [(other.name, f"cpu.{other.name}")]
    refused = client.post("/api/campaigns/", {**body, "environments": ["py3.11-torch9.9.9"]},
                          content_type="application/json")
    assert refused.status_code == 400 and "py3.11-torch9.9.9" in refused.content.decode()
    assert Campaign.objects.count() == 1
    page = client.get("/campaigns/new/").content.decode()
    assert f'value="{other.name}"' in page
    form = {"name": "builder", "bugs": [version.reproducer.bug.bug_id], "detectors": ["plain"], "variants": ["buggy"],
            "seeds": "0", "environments": [other.name, default_environment().name]}
    preview = client.post("/campaigns/new/", form).content.decode()
    plan = re.search(r'name="plan" value="([^"]+)"', preview)[1]
    client.post("/campaigns/new/", {**form, "plan": plan, "confirm": "1"})
    built = Campaign.objects.get(name="builder")
    assert sorted(built.runs.values_list("python_environment__name", flat=True)) == sorted(
        [other.name, default_environment().name])


def test_the_run_and_campaign_pages_name_the_environment(client):
    other = environment()
    plan = CampaignPlan.build([version_needing(["torch>=2.0"])], [do_record_detector("plain")], variants=["buggy"],
                              environments=[other])
    campaign = do_create_campaign("on 2.11", plan, enqueue=False, acting_user=None)
    run = campaign.runs.get()
    worker = Worker.objects.create(hostname="cpu@node", queues=["cpu", f"cpu.{other.name}"], last_seen=timezone.now())
    EnvironmentBuild.objects.create(environment=other, worker=worker, host="node", path="/envs/x", build_seconds=12.14,
                                    size_bytes=4_735_000_000, built_at=timezone.now())
    Run.objects.filter(pk=run.pk).update(environment=current_environment(other), worker=worker)
    page = client.get(run.get_absolute_url()).content.decode()
    assert '<strong id="python-environment">py3.11-torch2.11.0</strong>' in page
    assert '<span class="muted" id="environment-build">(built on node in 12.1 s, 4.4\xa0GB)</span>' in page
    assert "<dt>torch</dt><dd>2.11.0</dd>" in page
    campaign_page = client.get(campaign.get_absolute_url()).content.decode()
    assert '<span id="campaign-python-environments">Python environments: py3.11-torch2.11.0</span>' in campaign_page
    plain = RunFactory()
    assert '<strong id="python-environment">default</strong>' in client.get(plain.get_absolute_url()).content.decode()


# --- Refusals before anything runs -----------------------------------------------------------------------------

def test_a_detector_that_needs_a_package_the_environment_lacks_is_refused():
    run = Run(reproducer_version=version_needing(["torch>=2.0"]), detector=do_record_detector("traincheck"),
              variant="buggy", seed=0, steps=3, python_environment=environment())
    outcome = execute(run)
    assert (outcome.succeeded, outcome.failure_kind) == (False, RunFailureKind.UNSERVABLE)
    assert outcome.failure_reason == (
        "This worker cannot serve the run: the detector traincheck needs traincheck, which the environment "
        "py3.11-torch2.11.0 does not have; run it in the default environment, or build one with them.")


def test_a_run_of_an_environment_not_built_on_this_worker_is_refused(settings, tmp_path):
    settings.SILENTBENCH_ENVIRONMENTS_DIR = tmp_path
    run = Run(reproducer_version=version_needing(["torch>=2.0"]), detector=do_record_detector("plain"),
              variant="buggy", seed=0, steps=3, python_environment=environment())
    outcome = execute(run)
    assert (outcome.succeeded, outcome.failure_kind, outcome.exit_code) == (False, RunFailureKind.UNSERVABLE, None)
    assert outcome.failure_reason.startswith("This worker cannot serve the run: the environment py3.11-torch2.11.0 "
                                             "is not built here")


def test_the_host_facts_of_a_run_in_an_environment_are_that_interpreters():
    other = environment(numpy="2.4.6", sympy="1.14.0")
    facts, default_facts = facts_in(other), facts_in(None)
    assert facts["packages"] == {"torch": "2.11.0", "numpy": "2.4.6"} and facts["python"] == "3.11.7"
    assert facts["fingerprint"] != default_facts["fingerprint"] and facts["host"] == default_facts["host"]
    assert default_facts["packages"]["torch"].startswith("2.13.0")


# --- A real environment, a real run ------------------------------------------------------------------------------

TORCH_VERSION = PROGRAM_PREAMBLE + """
import torch
print("torch", torch.__version__, "from", torch.__file__)
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
report(event="step", step=0, rank=0, loss=float(torch.ones(2).sum()), time=time.time())
report(event="oracle", manifested=False, trigger_step=None, summary=torch.__version__)
"""


@pytest.fixture
def built(settings):
    """The torch 2.11.0 environment, built (once per machine) under TEST_ENVIRONMENTS."""
    settings.SILENTBENCH_ENVIRONMENTS_DIR = TEST_ENVIRONMENTS
    return build_environment([f"torch=={RELEASE}"])


@pytest.mark.once
@pytest.mark.integration
def test_an_environment_is_built_once_per_machine_and_recorded(built, settings):
    assert (built.name, built.torch, built.requirements, built.is_default) == (
        f"py3.11-torch{RELEASE}", RELEASE, [f"torch=={RELEASE}"], False)
    assert built.resolved["torch"] == RELEASE and "numpy" not in built.resolved  # exactly what uv resolved
    directory = TEST_ENVIRONMENTS / built.name
    marker = json.loads((directory / BUILT_MARKER).read_text())
    [build] = EnvironmentBuild.objects.filter(environment=built)
    assert build.path == str(directory) and environment_python(built) == directory / "bin" / "python"
    assert (build.build_seconds, build.size_bytes) == (marker["build_seconds"], marker["size_bytes"])
    assert build.build_seconds > 1 and build.size_bytes > 2 * 10**9  # torch and CUDA's libraries
    modified = (directory / BUILT_MARKER).stat().st_mtime_ns
    assert build_environment([f"torch=={RELEASE}"]) == built  # found built: nothing is built again
    assert (directory / BUILT_MARKER).stat().st_mtime_ns == modified
    assert EnvironmentBuild.objects.filter(environment=built).count() == 1


@pytest.mark.once
@pytest.mark.integration
def test_a_worker_builds_its_environments_as_it_starts_and_consumes_their_queues(built, settings, caplog):
    settings.SILENTBENCH_WORKER_ENVIRONMENTS = [[f"torch=={RELEASE}"], ["torch==0.0.1"]]  # no such release
    queues = app.amqp.Queues({})
    queues.select(["cpu", "gpu1"])
    consume_environment_queues(queues)
    assert list(queues.consume_from) == ["cpu", "gpu1", f"cpu.{built.name}", f"gpu1.{built.name}"]
    assert "the environment ['torch==0.0.1'] was not built; this worker does not serve it" in caplog.text


@pytest.mark.once
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_serves_the_environments_it_is_told_to(built, monkeypatch, tmp_path):
    """A `celery worker` started with SILENTBENCH_WORKER_ENVIRONMENTS finds the environment built (the same folder),
    consumes its queue, advertises it, and takes a campaign's run in it through the broker."""
    monkeypatch.setenv("SILENTBENCH_WORKER_ENVIRONMENTS", f"torch=={RELEASE}")
    monkeypatch.setenv("SILENTBENCH_ENVIRONMENTS_DIR", str(TEST_ENVIRONMENTS))
    app.control.purge()
    log = tmp_path / "worker.log"
    process = start_worker(log, name="environments")
    try:
        call_command("load_catalog")
        [version] = [v for v in runnable_versions(["PT-115607"]) if v.reproducer.name == "cpu"]
        campaign = do_create_campaign("through the broker", CampaignPlan.build(
            [version], [do_record_detector("plain")], variants=["buggy"], environments=[built]), acting_user=None)
        progress = wait_for_campaign(campaign, lambda line: None, timeout=300)
        assert progress["done"] == progress["total"] == 1, log_tail(log)
    finally:
        stop_process(process)
    run = campaign.runs.select_related("worker", "environment").get()
    assert run.status == RunStatus.SUCCEEDED and run.manifested, (run.failure_reason, log_tail(log))
    assert (run.queue, run.environment.torch) == (f"cpu.{built.name}", RELEASE)
    assert run.worker.queues == sorted(["cpu", f"cpu.{built.name}"])
    assert run.worker.capabilities["environments"] == [built.name]
    assert EnvironmentBuild.objects.get(environment=built).worker == run.worker


@pytest.mark.once
@pytest.mark.integration
def test_a_real_reproducer_runs_sealed_on_the_environments_torch(built, settings):
    """PT-115607's reproducer, buggy and fixed, through the task a worker runs (claim, sandbox, result), warm
    from the environment's own zygote; then a program that prints the torch it imported, warm and cold, with and
    without a detector's probe."""
    do_load_catalog(settings.SILENTBENCH_CATALOG_DIR)
    [version] = [v for v in runnable_versions(["PT-115607"]) if v.reproducer.name == "cpu"]
    plan = CampaignPlan.build([version], [do_record_detector("plain")], environments=[built])
    campaign = do_create_campaign("on 2.11", plan, enqueue=False, acting_user=None)
    for run in campaign.runs.all():
        assert run.queue == f"cpu.{built.name}"
        execute_run.apply(args=[run.pk])
    runs = {run.variant: run for run in campaign.runs.select_related("environment", "python_environment")}
    for variant, run in runs.items():
        assert run.status == RunStatus.SUCCEEDED, (variant, run.failure_reason, run.stderr[-2000:])
        assert (run.python_environment, run.environment.torch, run.environment.python) == (built, RELEASE, "3.11.7")
        assert run.execution["start"] == "warm" and run.execution["python_environment"] == built.name
        assert "pid namespace" in run.execution["layers"] and "landlock" in run.execution["layers"]
    assert (runs["buggy"].manifested, runs["fixed"].manifested) == (True, False)
    assert side(f"torch:{RELEASE}").runs.filter(pk__in=[run.pk for run in runs.values()]).count() == 2

    printing = ReproducerVersionFactory(files={"repro.py": TORCH_VERSION})
    # plain, and an in-process detector, whose probe the project's modules install under that interpreter too
    for warm, detector in ((True, "plain"), (False, "plain"), (True, "nan_inf"), (False, "nan_inf")):
        settings.SILENTBENCH_WARM_START = warm
        outcome = execute(Run(reproducer_version=printing, detector=do_record_detector(detector), variant="fixed",
                              seed=0, steps=1, python_environment=built))
        assert outcome.succeeded, (outcome.failure_reason, outcome.stderr[-2000:])
        imported = outcome.oracle["summary"]  # 2.11.0+cu130: the package index's build is a CUDA one
        assert imported.partition("+")[0] == RELEASE and outcome.execution["start"] == ("warm" if warm else "cold")
        assert f"torch {imported} from {TEST_ENVIRONMENTS / built.name}/lib/python3.11/site-packages/torch" \
            in outcome.stdout



SEALED_PROBE = PROGRAM_PREAMBLE + r'''
import json, pathlib, sys
site = pathlib.Path(sys.prefix, "lib", "python3.11", "site-packages")
attempts = {
    "write in the environment": lambda: pathlib.Path(sys.prefix, "written.txt").write_text("x"),
    "append to its torch": lambda: open(site / "torch" / "version.py", "a").write("#x"),
    "chmod its torch": lambda: os.chmod(site / "torch" / "version.py", 0o777),
    "remove its marker": lambda: os.unlink(pathlib.Path(sys.prefix, MARKER)),
    "read another environment": lambda: pathlib.Path(OTHER, "marker").read_text(),
    "list the uv cache": lambda: os.listdir(UV_CACHE),
}
results = {}
for name, attempt in attempts.items():
    try:
        attempt()
        results[name] = "allowed"
    except OSError as error:
        results[name] = f"denied: {type(error).__name__}"
results["listed beside the environment"] = sorted(os.listdir(pathlib.Path(sys.prefix).parent))
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
report(event="oracle", manifested=False, trigger_step=None, summary=json.dumps(results))
'''


@pytest.mark.once
@pytest.mark.integration
def test_a_run_in_an_environment_cannot_write_into_it_nor_see_the_uv_cache_or_other_environments(built, settings):
    """A run in a built environment (warm from its zygote, and cold) can neither change that environment's files
    (a later run would inherit them) nor read uv's cache or another environment of the folder holding them all:
    listing that folder shows its own environment only."""
    directory = TEST_ENVIRONMENTS / built.name
    torch_version = directory / "lib" / "python3.11" / "site-packages" / "torch" / "version.py"
    before = (torch_version.read_bytes(), torch_version.stat().st_mode)
    other = TEST_ENVIRONMENTS / f"another-environment-{os.getpid()}"  # no marker: never taken for a build
    other.mkdir()
    try:
        (other / "marker").write_text("another environment")
        program = (SEALED_PROBE.replace("MARKER", repr(BUILT_MARKER)).replace("OTHER", repr(str(other)))
                   .replace("UV_CACHE", repr(str(settings.SILENTBENCH_UV_CACHE_DIR))))
        probe = ReproducerVersionFactory(files={"repro.py": program})
        for warm in (True, False):
            settings.SILENTBENCH_WARM_START = warm
            outcome = execute(Run(reproducer_version=probe, detector=do_record_detector("plain"), variant="fixed",
                                  seed=0, steps=1, python_environment=built))
            assert outcome.succeeded, (outcome.failure_reason, outcome.stderr[-2000:])
            results = json.loads(outcome.oracle["summary"])
            assert results.pop("listed beside the environment") == [built.name], warm
            assert set(results) == {"write in the environment", "append to its torch", "chmod its torch",
                                    "remove its marker", "read another environment", "list the uv cache"}
            assert all(result.startswith("denied") for result in results.values()), (warm, results)
    finally:
        shutil.rmtree(other)
    assert not (directory / "written.txt").exists() and (directory / BUILT_MARKER).exists()
    assert (torch_version.read_bytes(), torch_version.stat().st_mode) == before
