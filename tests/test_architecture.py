"""The shape of the code: apps import one way, every campaign comes from one CampaignPlan, and the changes
people make (cancel, retry, approve, reject, deprecate) leave a record that their pages show."""
import ast
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from rest_framework.test import APIClient

from bugs.actions import do_deprecate_bug, do_review_version
from bugs.models import BugStatus
from core.enums import ReviewState
from core.models import AuditEvent
from runners import executor
from runners.actions.campaigns import do_cancel_campaign, do_create_campaign, do_retry_failed_runs
from runners.actions.detectors import do_record_detector
from runners.models import Campaign, CampaignPurpose, Run, RunFailureKind, RunStatus
from runners.plans import CampaignPlan

from .factories import BugFactory, MaintainerFactory, ReproducerFactory, ReproducerVersionFactory, RunFactory

pytestmark = pytest.mark.django_db
ROOT = Path(settings.BASE_DIR)
# Each app may import only the apps to its right (core imports none of them).
ALLOWED = {
    "core": set(),
    "bugs": {"core"},
    "runners": {"core", "bugs"},
    "sensitivity": {"core", "bugs", "runners"},
    "evaluation": {"core", "bugs", "runners", "sensitivity"},
    "accounts": {"core"},
    "devtools": {"core", "bugs", "runners", "sensitivity", "evaluation"},
}


PROJECT = set(ALLOWED) | {"benchmark_site"}  # the project package wires the apps; no app imports it


def imported_apps(app):
    """{(module path, imported app)} for every import of another project app in ``app`` (migrations aside)."""
    found = set()
    for path in (ROOT / app).rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            found |= {(str(path.relative_to(ROOT)), name.split(".")[0]) for name in names
                      if name.split(".")[0] in PROJECT and name.split(".")[0] != app}
    return found


@pytest.mark.parametrize("app", sorted(ALLOWED))
def test_apps_import_one_way(app):
    wrong = sorted((path, other) for path, other in imported_apps(app) if other not in ALLOWED[app])
    assert not wrong, f"{app} may import only {sorted(ALLOWED[app])}: {wrong}"


def module_name(path):
    """``runners/executor/__init__.py`` -> ``runners.executor``; ``runners/tasks.py`` -> ``runners.tasks``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path):
    """[(line, absolute module named)] for every import in ``path``, those inside functions too: relative ones
    resolved, and ``from package import name`` also as ``package.name`` (a module or not)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def module_graph(app):
    """{module: {modules of ``app`` it imports}}, migrations aside."""
    modules = {module_name(path): path for path in (ROOT / app).rglob("*.py") if "migrations" not in path.parts}
    graph = {}
    for module, path in modules.items():
        edges = set()
        for _, named in imports_of(path):
            while named and named not in modules:
                named = named.rpartition(".")[0]
            if named and named != module and not module.startswith(f"{named}."):  # a package's own submodule
                edges.add(named)
        graph[module] = edges
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("app", sorted(PROJECT))
def test_no_import_circle_inside_an_app(app):
    """Every import counts, those inside functions too: a circle hidden in a function is still a circle."""
    assert cycles(module_graph(app)) == []


def test_the_circle_check_finds_a_circle_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def python_files(*folders):
    return [path for folder in folders for path in (ROOT / folder).rglob("*.py") if "migrations" not in path.parts]


@pytest.mark.parametrize("app", sorted(ALLOWED))
def test_no_app_names_a_higher_apps_model_by_string(app):
    """``apps.get_model("runners", "Run")`` or a label such as "runners.Run" in a lower app is an import in disguise."""
    higher = {other for other in ALLOWED if other != app and other not in ALLOWED[app]}
    labels = re.compile(rf"""["']({'|'.join(sorted(higher))})\.[A-Z]\w*["']""")
    get_model = re.compile(rf"""get_model\(\s*["']({'|'.join(sorted(higher))})\b""")
    wrong = [(str(path.relative_to(ROOT)), match.group(0)) for path in python_files(app)
             for pattern in (labels, get_model) for match in pattern.finditer(path.read_text())] if higher else []
    assert not wrong, f"{app} names models of apps it may not import: {wrong}"


def test_no_module_imports_a_management_command():
    """What several commands share lives in a module (core.cli, runners.cli), not in another command."""
    command = re.compile(r"^\w+\.management\.commands\.\w+")
    wrong = [(str(path.relative_to(ROOT)), line, named) for path in python_files(*PROJECT)
             for line, named in imports_of(path) if command.match(named)]
    assert not wrong, wrong


def test_nothing_outside_the_executor_imports_its_internals():
    """The executor's public surface is what ``runners.executor`` exports; its modules are its own business."""
    wrong = [(str(path.relative_to(ROOT)), line, named) for path in python_files(*PROJECT)
             if "executor" not in path.relative_to(ROOT).parts
             for line, named in imports_of(path) if named.startswith("runners.executor.")
             and named.rpartition(".")[2] not in executor.__all__]
    assert not wrong, wrong


@pytest.mark.parametrize("folder", ["runners/executor", "runners/detectors", "sensitivity/faults"])
def test_what_runs_in_a_sandbox_imports_no_django_and_nothing_of_the_web(folder):
    """The executor runs in zygotes of other Python environments (no Django there), and the detector plugins and the
    fault harness and operators in the reproducer's own process: none may import Django or a module that does."""
    allowed = ("runners.executor", "runners.detectors")
    wrong = [(str(path.relative_to(ROOT)), line, named) for path in python_files(folder)
             for line, named in imports_of(path)
             if named.split(".")[0] in (*PROJECT, "django", "rest_framework", "celery")
             and not named.startswith(allowed)]
    assert not wrong, wrong


def test_devtools_is_not_installed_in_production(tmp_path):
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "benchmark_site.settings", "DJANGO_ENV": "production",
           "DJANGO_SECRET_KEY": "x" * 50, "DJANGO_ALLOWED_HOSTS": "example.org", "SILENTBENCH_VAR_DIR": str(tmp_path)}
    apps = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                           "print(' '.join(settings.INSTALLED_APPS))"], env=env, cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.split()
    assert "runners" in apps and "devtools" not in apps
    assert "devtools" in settings.INSTALLED_APPS  # development and tests have it


@pytest.fixture
def versions():
    bug = BugFactory(bug_id="TEST-PLAN")
    cpu = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug, name="cpu"))
    cuda = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug, name="cuda", needs_cuda=True))
    pipeline = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=None, name="clean-mlp"))
    return cpu, cuda, pipeline


def test_a_plan_resolves_names_into_exact_runs(versions):
    cpu, cuda, pipeline = versions
    plan = CampaignPlan.resolve(bugs=["TEST-PLAN"], pipelines=["clean-mlp"], detectors=["plain", "nan_inf"],
                                seeds=[1, 0, 1], steps=7)
    assert plan.versions == (cpu, pipeline) and plan.seeds == (0, 1)
    # the bug: 2 variants; the pipeline: its fixed variant only; x 2 detectors x 2 seeds
    assert len(plan.runs) == (2 + 1) * 2 * 2
    assert {run.variant for run in plan.runs if run.version == pipeline} == {"fixed"}
    assert len(CampaignPlan.resolve(bugs=["TEST-PLAN"], detectors=["plain"], cuda=True).runs) == 4
    assert plan.digest() != CampaignPlan.resolve(bugs=["TEST-PLAN"], pipelines=["clean-mlp"],
                                                 detectors=["plain", "nan_inf"], seeds=[0, 1]).digest()


def test_a_plan_reports_every_problem_at_once(versions):
    with pytest.raises(Exception) as raised:
        CampaignPlan.resolve(bugs=["TEST-PLAN", "TEST-NONE"], pipelines=["nope"], detectors=["crystal_ball"],
                             seeds=[], steps=0)
    problems = raised.value.message_dict
    assert set(problems) == {"bugs", "pipelines", "detectors", "seeds", "steps"}
    assert "TEST-NONE: no approved CPU reproducer" in problems["bugs"][0]


def test_the_api_plans_like_the_builder_with_pipelines_cuda_and_steps(versions):
    cpu, cuda, pipeline = versions
    api = APIClient()
    api.force_authenticate(MaintainerFactory())
    body = {"name": "api", "bugs": ["TEST-PLAN"], "pipelines": ["clean-mlp"], "include_cuda": True,
            "detectors": ["plain"], "seeds": [0, 1], "steps": 5}
    preview = api.post("/api/campaigns/preview/", body, format="json").json()
    plan = CampaignPlan.resolve(bugs=["TEST-PLAN"], pipelines=["clean-mlp"], detectors=["plain"], seeds=[0, 1],
                                steps=5, cuda=True)
    assert preview["runs"] == len(plan.runs) == 10 and preview["plan"] == plan.digest()
    created = api.post("/api/campaigns/", body, format="json")
    assert created.status_code == 201, created.content
    campaign = Campaign.objects.get(pk=created.json()["id"])
    assert campaign.runs.count() == 10 and set(campaign.runs.values_list("steps", flat=True)) == {5}
    assert campaign.runs.filter(reproducer_version=cuda).exists()
    bad = api.post("/api/campaigns/preview/", {**body, "pipelines": ["nope"]}, format="json")
    assert bad.status_code == 400 and "nope: no such clean pipeline" in str(bad.json()["pipelines"])


def test_run_campaign_command_uses_the_same_plan(versions):
    call_command("run_campaign", "--bugs", "TEST-PLAN", "--pipelines", "clean-mlp", "--detectors", "plain",
                 "--seeds", "0,1", "--steps", "5")
    campaign = Campaign.objects.get()
    assert campaign.runs.count() == 6 and campaign.created_by is None
    with pytest.raises(Exception, match="TEST-NONE: no approved CPU reproducer"):
        call_command("run_campaign", "--bugs", "TEST-NONE", "--detectors", "plain")


def test_overhead_pairs_each_have_their_own_baseline(versions):
    _, _, pipeline = versions
    plain, detector = do_record_detector("plain"), do_record_detector("nan_inf")
    plan = CampaignPlan.pairs(pipeline, plain, [detector], pairs=3)
    campaign = do_create_campaign("overhead", plan, CampaignPurpose.OVERHEAD, enqueue=False, acting_user=None)
    runs = list(campaign.runs.order_by("id"))
    assert [(run.detector.name, run.seed) for run in runs] == [
        ("plain", 0), ("nan_inf", 0), ("plain", 1), ("nan_inf", 1), ("plain", 2), ("nan_inf", 2)]
    from runners.reconciler import do_reenqueue_lost_runs
    from runners.selectors import dispatched_runs

    assert not dispatched_runs().filter(campaign=campaign).exists()  # the reconciler leaves them to their timer
    assert do_reenqueue_lost_runs() == []


def test_cancel_and_retry_leave_a_record_on_the_campaign_page(client, versions):
    cpu, _, _ = versions
    maintainer = MaintainerFactory(username="mia")
    campaign = do_create_campaign("c", CampaignPlan.build([cpu], [do_record_detector("plain")]), enqueue=False,
                                  acting_user=maintainer)
    failed = campaign.runs.get(variant="buggy")
    campaign.runs.filter(pk=failed.pk).update(status=RunStatus.FAILED, failure_reason="Crashed: <b>boom</b>")
    do_cancel_campaign(campaign, acting_user=maintainer)
    do_retry_failed_runs(campaign, acting_user=maintainer)
    assert list(AuditEvent.objects.about(campaign).values_list("action", flat=True)) == ["retry", "cancel", "create"]
    cancel = AuditEvent.objects.about(campaign).get(action="cancel")
    assert cancel.detail["runs"] == [campaign.runs.get(variant="fixed").pk] and cancel.detail["run_count"] == 1
    retry = AuditEvent.objects.about(campaign).get(action="retry")
    assert retry.detail["cancelled_by"] == maintainer.pk and retry.detail["cancelled_at"]
    page = client.get(campaign.get_absolute_url()).content.decode()
    assert "cancelled 1 queued run(s)" in page and "queued 2 failed or cancelled run(s) again" in page
    assert "Crashed: &lt;b&gt;boom&lt;/b&gt;" in page and "<b>boom</b>" not in page  # the old reason, as text


def test_review_and_deprecation_leave_a_record_on_their_pages(client):
    version = ReproducerVersionFactory(review_state=ReviewState.PENDING,
                                       reproducer=ReproducerFactory(bug=BugFactory(status=BugStatus.SUBMITTED)))
    maintainer = MaintainerFactory(username="rev")
    do_review_version(version, approve=False, note="no seed handling", acting_user=maintainer)
    client.force_login(maintainer)
    page = client.get(f"/review/{version.pk}/").content.decode()
    assert "rejected" in page and "no seed handling" in page and ">rev<" in page
    bug = BugFactory(bug_id="TEST-OLD")
    do_deprecate_bug(bug, "duplicate of TEST-9", acting_user=None)
    page = client.get("/bugs/TEST-OLD/").content.decode()
    assert "deprecated TEST-OLD: duplicate of TEST-9" in page and "the system" in page


def test_a_verification_verdict_is_recorded_by_the_catalogs_action():
    from runners.actions.campaigns import do_record_stability

    bug = BugFactory(status=BugStatus.APPROVED)
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug))
    campaign = Campaign.objects.create(name="v", purpose=CampaignPurpose.VERIFICATION)
    for variant, manifested in (("buggy", True), ("fixed", False)):
        RunFactory(campaign=campaign, reproducer_version=version, variant=variant, status=RunStatus.SUCCEEDED,
                   manifested=manifested)
    do_record_stability(campaign)
    bug.refresh_from_db()
    assert bug.status == BugStatus.VERIFIED
    assert AuditEvent.objects.about(bug).get(action="verdict").detail["previous_status"] == BugStatus.APPROVED


def test_the_repository_cites_only_files_it_has():
    """Every Markdown file named anywhere, and every relative link in the docs, is a file of this repository."""
    tracked = [path for path in ROOT.rglob("*") if path.is_file() and path.suffix in {".md", ".py", ".html", ".yaml"}
               and not {".venv", ".git", "var", "node_modules"} & set(path.relative_to(ROOT).parts)]
    names = {path.name for path in ROOT.rglob("*.md") if ".venv" not in path.parts}
    missing = []
    for path in tracked:
        text = path.read_text(errors="replace")
        for cited in set(re.findall(r"(?<![\w:/.-])((?:[\w.-]+/)*[A-Za-z][\w-]*\.md)\b", text)):
            if cited.rsplit("/", 1)[-1] not in names:
                missing.append((str(path.relative_to(ROOT)), cited))
        if path.suffix == ".md":
            for link in re.findall(r"\]\((?!https?:|#|mailto:)([^)#\s]+)", text):
                if not (path.parent / link).exists():
                    missing.append((str(path.relative_to(ROOT)), link))
    assert not missing, missing


def test_an_overhead_measurement_is_never_retried_through_the_broker(client, versions):
    _, _, pipeline = versions
    plan = CampaignPlan.pairs(pipeline, do_record_detector("plain"), [do_record_detector("nan_inf")], pairs=1)
    campaign = do_create_campaign("overhead", plan, CampaignPurpose.OVERHEAD, enqueue=False, acting_user=None)
    campaign.runs.update(status=RunStatus.FAILED, failure_reason="x")
    with pytest.raises(ValidationError, match="overhead measurement"):
        do_retry_failed_runs(campaign, acting_user=None)
    api = APIClient()
    api.force_authenticate(MaintainerFactory())
    response = api.post(f"/api/campaigns/{campaign.pk}/retry/", {}, format="json")
    assert response.status_code == 400 and "overhead measurement" in str(response.json())
    client.force_login(MaintainerFactory())
    assert 'id="retry-campaign"' not in client.get(campaign.get_absolute_url()).content.decode()
    assert set(campaign.runs.values_list("status", flat=True)) == {RunStatus.FAILED}


def test_an_interrupted_overhead_measurement_leaves_nothing_running_or_queued(monkeypatch, versions):
    """Ctrl-C while a run is being timed: that run fails as lost, the rest are cancelled, the campaign ends."""
    from evaluation import overhead

    _, _, pipeline = versions
    claimed = []

    def interrupted_run(run_id):
        Run.objects.filter(pk=run_id).update(status=RunStatus.RUNNING)
        claimed.append(run_id)
        raise KeyboardInterrupt

    monkeypatch.setattr(overhead, "execute_run", interrupted_run)
    with pytest.raises(KeyboardInterrupt):
        overhead.do_measure_overhead(pipeline, [do_record_detector("nan_inf")], do_record_detector("plain"), pairs=2)
    campaign = Campaign.objects.get(purpose=CampaignPurpose.OVERHEAD)
    lost = campaign.runs.get(pk=claimed[0])
    assert (lost.status, lost.failure_kind) == (RunStatus.FAILED, RunFailureKind.LOST)
    assert set(campaign.runs.exclude(pk=lost.pk).values_list("status", flat=True)) == {RunStatus.CANCELLED}
    assert campaign.completed_at is not None


def test_a_stale_overhead_run_is_given_up_by_the_reconciler(versions):
    """Its timing command was killed outright (SIGKILL, a lost host): nobody queues overhead runs again."""
    from datetime import timedelta

    from django.utils import timezone

    from runners.reconciler import reconcile

    _, _, pipeline = versions
    plan = CampaignPlan.pairs(pipeline, do_record_detector("plain"), [do_record_detector("nan_inf")], pairs=2)
    campaign = do_create_campaign("overhead", plan, CampaignPurpose.OVERHEAD, enqueue=False, acting_user=None)
    running = campaign.runs.order_by("id").first()
    Run.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING, started_at=timezone.now(), attempts=1)
    assert reconcile()["overhead_runs_given_up"] == []  # within its allowance: still being timed
    repaired = reconcile(now=timezone.now() + timedelta(days=1))
    assert repaired["overhead_runs_given_up"] == [running.pk]
    running.refresh_from_db()
    campaign.refresh_from_db()
    assert (running.status, running.failure_kind) == (RunStatus.FAILED, RunFailureKind.LOST)
    assert set(campaign.runs.exclude(pk=running.pk).values_list("status", flat=True)) == {RunStatus.CANCELLED}
    assert campaign.completed_at is not None


@pytest.mark.integration
def test_an_interrupted_caller_takes_the_sandboxed_program_with_it(tmp_path):
    """Ctrl-C (or SIGTERM turned into SystemExit) while the sandbox waits: every process of the run dies. The
    caller is a process of its own, as a command is when its user presses Ctrl-C."""
    import signal
    import subprocess
    import sys
    import time
    import uuid

    from .helpers import processes_naming

    key = uuid.uuid4().hex
    token = f"sleeper-{key}"  # only the sandboxed program's command line holds it whole, not the caller's
    caller = subprocess.Popen(
        # Python's own Ctrl-C handler, even where this suite runs with SIGINT ignored (a background job)
        [sys.executable, "-c", "import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
         "from runners.executor import Limits, run_sandboxed\n"
         "run_sandboxed([sys.executable, '-c', 'import time; time.sleep(120)', 'sleeper-' + sys.argv[1]], "
         f"{str(tmp_path)!r}, {{'PATH': '/usr/bin:/bin'}}, Limits(time_limit_seconds=60, memory_mb=1024))\n", key],
        stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    for _ in range(1200):
        if processes_naming(token) or caller.poll() is not None:
            break
        time.sleep(0.05)
    assert processes_naming(token), caller.communicate()[1][-2000:]
    caller.send_signal(signal.SIGINT)
    stderr = caller.communicate(timeout=60)[1]
    assert caller.returncode != 0 and "KeyboardInterrupt" in stderr, stderr[-2000:]
    for _ in range(50):
        if not processes_naming(token):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the sandboxed program {processes_naming(token)} outlived its interrupted caller")
