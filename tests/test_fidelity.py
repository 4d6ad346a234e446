"""Reproducer fidelity: every bug's reproducer declares the symptom its oracle judges and how its setup differs
from the upstream report's, the loader and the submission checks refuse one that does not, and the bug page shows
both."""
import re
import shutil

import pytest
import yaml
from django.conf import settings
from django.core.exceptions import ValidationError

from bugs.catalog import do_load_catalog, parse_reproducer_folder
from bugs.models import OracleSymptom, Reproducer
from bugs.submissions import MANIFEST_NAME, reproducer_problems

from .factories import BugFactory, ReproducerFactory, ReproducerVersionFactory
from .helpers import FILES, SUBMISSION_MANIFEST

CATALOG = settings.SILENTBENCH_CATALOG_DIR
BUG_REPRODUCERS = sorted(path.parent for path in CATALOG.glob("*/*/reproducer.yaml")
                         if path.parent.parent.name != "pipelines")
PIPELINES = sorted(path.parent for path in (CATALOG / "pipelines").glob("*/reproducer.yaml"))


def needs_cuda(folder):
    return bool(yaml.safe_load((folder / MANIFEST_NAME).read_text())["needs"].get("cuda"))


CUDA_REPRODUCERS = [folder for folder in BUG_REPRODUCERS if needs_cuda(folder)]
CUDA_PIPELINES = [folder for folder in PIPELINES if needs_cuda(folder)]  # GPU workloads: no CPU host runs them
# What each missing or wrong field is refused with: the field and what to write in it.
REFUSALS = [
    ({"oracle": None}, "'oracle' must declare the symptom your oracle record judges"),
    ({"oracle": {"check": "The loss is above 1."}}, "oracle.symptom must be one of loss, accuracy"),
    ({"oracle": {"symptom": "stale_gradient", "check": "x"}}, "not its cause"),
    ({"oracle": {"symptom": "loss", "check": "  "}}, "oracle.check must say in a sentence what the oracle compares"),
    ({"fidelity_note": None}, "'fidelity_note' must say in a sentence or two what differs from the upstream report"),
    ({"fidelity_note": ""}, "(model, optimizer, loss, data, steps, hardware)"),
]


def without(manifest, changes):
    """``manifest`` with ``changes`` applied; a None value removes the field."""
    changed = {**manifest, **changes}
    return {name: value for name, value in changed.items() if value is not None}


def test_the_catalog_has_the_reproducers_the_audit_covers():
    assert len(PIPELINES) == 8 and [folder.name for folder in CUDA_PIPELINES] == ["gpu-transformer"]  # GPU overhead
    assert len(BUG_REPRODUCERS) == 46 and len(CUDA_REPRODUCERS) == 9  # 7 of today's bugs, 2 historical


@pytest.mark.parametrize("folder", BUG_REPRODUCERS, ids=lambda folder: f"{folder.parent.name}/{folder.name}")
def test_every_catalog_reproducer_declares_a_symptom_oracle_and_a_fidelity_note(folder):
    manifest = yaml.safe_load((folder / MANIFEST_NAME).read_text())
    assert manifest["oracle"]["symptom"] in OracleSymptom.values
    assert len(manifest["oracle"]["check"].split()) >= 8  # a sentence, with the threshold
    assert len(manifest["fidelity_note"].split()) >= 15  # what differs, and why
    assert "Upstream" in manifest["fidelity_note"]  # names the setup it departs from


def test_every_catalog_oracle_summary_is_listed_in_the_fidelity_audit():
    audit = (settings.BASE_DIR / "docs" / "fidelity.md").read_text()
    for folder in BUG_REPRODUCERS:
        symptom = yaml.safe_load((folder / MANIFEST_NAME).read_text())["oracle"]["symptom"]
        assert f"| {folder.parent.name} ({folder.name}) | `{symptom}`" in audit, folder


@pytest.mark.parametrize("changes, message", REFUSALS)
def test_a_submission_without_them_is_refused_with_what_to_write(changes, message):
    manifest = without(SUBMISSION_MANIFEST, changes)
    _, problems = reproducer_problems({**FILES, MANIFEST_NAME: yaml.safe_dump(manifest)})
    assert any(message in problem for problem in problems), problems
    assert all(problem.startswith(f"{MANIFEST_NAME}: ") for problem in problems)


@pytest.mark.django_db
@pytest.mark.parametrize("changes, message", REFUSALS)
def test_the_loader_refuses_a_catalog_reproducer_without_them(tmp_path, changes, message):
    shutil.copytree(CATALOG / "SO-60335387", tmp_path / "SO-60335387")
    manifest_path = tmp_path / "SO-60335387" / "cpu" / MANIFEST_NAME
    manifest_path.write_text(yaml.safe_dump(without(yaml.safe_load(manifest_path.read_text()), changes)))
    with pytest.raises(ValidationError, match=re.escape(message)):
        do_load_catalog(tmp_path)
    assert not Reproducer.objects.exists()


@pytest.mark.parametrize("folder", PIPELINES, ids=lambda folder: folder.name)
def test_a_clean_reference_pipeline_needs_neither(folder):
    manifest, _ = parse_reproducer_folder(folder, reproduces_bug=False)
    assert "oracle" not in manifest and "fidelity_note" not in manifest
    with pytest.raises(ValidationError, match="fidelity_note"):
        parse_reproducer_folder(folder)


@pytest.mark.django_db
def test_the_loader_stores_them_and_the_api_returns_them(client, tmp_path):
    shutil.copytree(CATALOG / "SO-60335387", tmp_path / "SO-60335387")
    shutil.copytree(CATALOG / "pipelines" / "mlp-adam", tmp_path / "pipelines" / "mlp-adam")
    do_load_catalog(tmp_path)
    declared = yaml.safe_load((CATALOG / "SO-60335387" / "cpu" / MANIFEST_NAME).read_text())
    reproducer = Reproducer.objects.get(bug__bug_id="SO-60335387")
    assert (reproducer.oracle_symptom, reproducer.oracle_check, reproducer.fidelity_note) == (
        OracleSymptom.LOSS, declared["oracle"]["check"], declared["fidelity_note"])
    assert Reproducer.objects.get(bug=None).fidelity_note == ""
    [shown] = client.get("/api/bugs/SO-60335387/").json()["reproducers"]
    assert (shown["oracle_symptom"], shown["fidelity_note"]) == ("loss", declared["fidelity_note"])


@pytest.mark.django_db
def test_the_bug_page_shows_the_oracle_and_the_fidelity_note(client):
    bug = BugFactory(bug_id="TEST-FIDELITY")
    ReproducerVersionFactory(reproducer=ReproducerFactory(
        bug=bug, oracle_symptom=OracleSymptom.RANK_DIVERGENCE, oracle_check="Replicas differ by more than 1e-6.",
        fidelity_note="Upstream on 64 GPUs in bf16; here 2 gloo ranks in fp32."))
    page = client.get("/bugs/TEST-FIDELITY/").content.decode()
    assert "Replicas differ between ranks." in page and "Replicas differ by more than 1e-6." in page
    assert "Upstream on 64 GPUs in bf16; here 2 gloo ranks in fp32." in page


def test_the_docs_list_exactly_the_symptoms_of_the_code():
    protocol = (settings.BASE_DIR / "docs" / "reproducer-protocol.md").read_text()
    table = protocol.split("| value | the oracle checks |", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\s*\| `(\w+)` \|", table, flags=re.MULTILINE) == list(OracleSymptom.values)
    catalog_doc = (settings.BASE_DIR / "docs" / "catalog.md").read_text()
    listed = catalog_doc.split("(`oracle.symptom`: ", 1)[1].split(")", 1)[0]
    assert re.findall(r"`(\w+)`", listed) == list(OracleSymptom.values)


@pytest.mark.django_db
def test_a_historical_reproducer_is_shown_with_its_reason_and_never_run(client, tmp_path):
    """PT-5801 and PT-36485 had their bug only in builds that no environment can install today: their CUDA
    reproducers are kept, marked historical with the reason, and left out of every campaign, evaluation and check;
    the CUDA reproducer of a bug that current builds still have (PT-181723) is not."""
    from runners.selectors import runnable_versions

    for bug_id in ("PT-5801", "PT-36485", "PT-181723"):
        shutil.copytree(CATALOG / bug_id, tmp_path / bug_id)
    do_load_catalog(tmp_path)
    declared = yaml.safe_load((CATALOG / "PT-5801" / "cuda" / MANIFEST_NAME).read_text())["historical_reason"]
    historical = Reproducer.objects.get(bug__bug_id="PT-5801", name="cuda")
    assert historical.historical_reason == declared.strip() and "torch 0.3" in declared
    assert [str(version.reproducer) for version in runnable_versions(cuda=True)] == ["PT-181723/cuda"]
    assert {str(version.reproducer) for version in runnable_versions()} == {
        "PT-5801/cpu", "PT-36485/cpu", "PT-181723/cpu"}
    page = client.get("/bugs/PT-5801/").content.decode()
    assert page.count("Historical, never run:") == 1 and "no environment today can run it" in page
    assert page.count("Not verified yet.") == 1  # the cpu analogue's; the historical one is never verified
    shown = {r["name"]: r["historical_reason"] for r in client.get("/api/bugs/PT-5801/").json()["reproducers"]}
    assert shown == {"cpu": "", "cuda": historical.historical_reason}


def test_an_empty_historical_reason_is_refused_with_what_to_write(tmp_path):
    folder = tmp_path / "cuda"
    shutil.copytree(CATALOG / "PT-181723" / "cuda", folder)
    manifest = yaml.safe_load((folder / MANIFEST_NAME).read_text())
    (folder / MANIFEST_NAME).write_text(yaml.safe_dump({**manifest, "historical_reason": " "}))
    with pytest.raises(ValidationError, match="historical_reason must say in a sentence why no environment today"):
        parse_reproducer_folder(folder)


@pytest.mark.parametrize("folder", CUDA_REPRODUCERS + CUDA_PIPELINES,
                         ids=lambda folder: f"{folder.parent.name}/{folder.name}")
def test_a_cuda_reproducer_without_a_gpu_refuses_clearly_before_it_reports_anything(folder, tmp_path):
    """Run for real where torch sees no CUDA device: status 2, one sentence on stderr naming what it needs, and no
    record (a run that reported a start, or an oracle, would read as a bug that did not show; a clean pipeline's, as
    a clean run). The CUDA pipelines too: a CPU host never runs them, but one named by hand must refuse as clearly."""
    import os
    import subprocess
    import sys

    report = tmp_path / "report.jsonl"
    done = subprocess.run([sys.executable, "repro.py", "--variant", "buggy", "--seed", "0", "--steps", "2"],
                          cwd=folder, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "SILENTBENCH_REPORT": str(report)})
    assert done.returncode == 2, done.stderr
    assert f"{folder.parent.name}/{folder.name} needs a CUDA GPU" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not report.exists() and not done.stdout


@pytest.mark.django_db
def test_a_historical_reproducer_is_refused_by_a_plan_and_a_submission_may_not_be_one(tmp_path):
    """Whatever names it (a campaign form, the API, a verification on approval), a plan refuses a historical
    reproducer; and only the catalog's own records may be historical, since a submission is verified by running."""
    from bugs.submissions import reproducer_problems
    from runners.actions.detectors import do_record_detector
    from runners.plans import CampaignPlan

    shutil.copytree(CATALOG / "PT-5801", tmp_path / "PT-5801")
    do_load_catalog(tmp_path)
    historical = Reproducer.objects.get(bug__bug_id="PT-5801", name="cuda").latest_version()
    with pytest.raises(ValidationError, match="Historical: no environment today can show their bugs"):
        CampaignPlan.build([historical], [do_record_detector("plain")])
    files = {**FILES, MANIFEST_NAME: yaml.safe_dump({**SUBMISSION_MANIFEST, "historical_reason": "Only torch 0.3."})}
    assert any("historical_reason is for the catalog's own records" in problem
               for problem in reproducer_problems(files)[1])


@pytest.mark.django_db
def test_a_cuda_pipeline_is_run_only_where_a_campaign_asks_for_cuda(client, tmp_path):
    """gpu-transformer, the GPU overhead workload, loads with the other pipelines, but whatever picks clean pipelines
    on the CPU (the evaluation, the scores, TrainCheck's default fit) leaves it out, and a plan that names it takes it
    only with the CUDA option, as it takes a bug's CUDA reproducers; without the option it says so."""
    from runners.actions.detectors import do_record_detector
    from runners.detector_versions.fitting import reference_versions
    from runners.environments.routing import queue_for
    from runners.forms import CampaignForm
    from runners.plans import CampaignPlan
    from runners.scoring import scoring_versions
    from runners.selectors import runnable_versions

    shutil.copytree(CATALOG / "pipelines", tmp_path / "pipelines")
    do_load_catalog(tmp_path)
    names = {folder.name for folder in PIPELINES}
    cpu = {folder.name for folder in PIPELINES if folder not in CUDA_PIPELINES}
    assert set(Reproducer.objects.reference_pipelines().values_list("name", flat=True)) == names
    assert {version.reproducer.name for version in runnable_versions(pipelines=True)} == cpu
    assert {str(version.reproducer) for version in scoring_versions()} == {f"pipeline/{name}" for name in cpu}
    assert {version.reproducer.name for version in reference_versions({}, runnable_versions(pipelines=True)[0])} < cpu

    with pytest.raises(ValidationError) as refused:
        CampaignPlan.resolve(bugs=[], pipelines=["gpu-transformer", "mlp-adam"], detectors=["plain"])
    assert refused.value.message_dict == {
        "pipelines": ["gpu-transformer: a CUDA pipeline, which needs the CUDA option (and a GPU worker)"]}
    plan = CampaignPlan.resolve(bugs=[], pipelines=["gpu-transformer", "mlp-adam"], detectors=["plain"], cuda=True)
    assert [(str(run.version.reproducer), run.variant) for run in plan.runs] == [
        ("pipeline/gpu-transformer", "fixed"), ("pipeline/mlp-adam", "fixed")]
    assert queue_for(plan.runs[0].version) == "gpu1-40gb" and queue_for(plan.runs[1].version) == "cpu"
    with pytest.raises(ValidationError, match="nope: no such clean pipeline"):
        CampaignPlan.resolve(bugs=[], pipelines=["nope"], detectors=["plain"], cuda=True)
    do_record_detector("plain")
    assert ("gpu-transformer", "gpu-transformer (needs CUDA)") in CampaignForm().fields["pipelines"].choices
    assert '<span class="badge">needs CUDA</span>' in client.get("/pipelines/").content.decode()
