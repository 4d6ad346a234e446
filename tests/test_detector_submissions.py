"""Detector submissions: checked like reproducer submissions, reviewed with a diff, approved into a scoring
campaign, and run only inside the sandbox, never in the worker (runners.detector_versions.submissions,
runners.detector_versions.submitted, docs/writing-a-detector.md)."""
import hashlib
import re
import secrets
import shutil
import socket
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.urls import reverse

from bugs.catalog import do_load_catalog
from core.enums import ReviewState, Variant
from core.models import AuditEvent
from evaluation.metrics import AlarmPoint, judge_run
from runners.actions.detector_versions import (
    do_approve_detector_version,
    do_reject_detector_version,
    do_start_scoring,
    do_submit_detector_version,
)
from runners.actions.detectors import (
    do_record_builtin_detector_version,
    do_record_detector,
    do_record_submitted_detector,
)
from runners.detector_versions.submissions import check_detector
from runners.detectors import all_plugins
from runners.detectors.base import SUBMITTED_MODULE
from runners.execution import execute
from runners.models import CampaignPurpose, Detector, DetectorVersion, RunStatus
from runners.scoring import DEFAULT_SEEDS, published_seeds
from runners.tasks import execute_run

from .factories import (
    CampaignFactory,
    EvaluationFactory,
    MaintainerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)
from .helpers import client_for

pytestmark = pytest.mark.django_db

DOC = Path(settings.BASE_DIR) / "docs" / "writing-a-detector.md"


def example_from_the_docs():
    """The complete example of docs/writing-a-detector.md: its only ```python block that defines a plugin."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    [example] = [block for block in blocks if "(DetectorPlugin)" in block]
    return example


def submit(code, user, config=None, link="https://example.org/paper"):
    checked, problems = check_detector(code, config)
    assert not problems, problems
    return do_submit_detector_version(checked, link, acting_user=user)


def load_bugs(tmp_path, *bug_ids):
    """Only these bugs of the real catalog: a scoring campaign over "every CPU reproducer" stays small."""
    for bug_id in bug_ids:
        shutil.copytree(Path(settings.SILENTBENCH_CATALOG_DIR) / bug_id, tmp_path / "catalog" / bug_id)
    do_load_catalog(tmp_path / "catalog")


# --- The example of the docs: submitted, approved, scored through the real executor -----------------------

@pytest.mark.integration
def test_the_example_of_the_docs_is_submitted_approved_and_scored(tmp_path):
    load_bugs(tmp_path, "PT-FORUM-84911")
    EvaluationFactory(campaign=CampaignFactory(name="evaluation", purpose=CampaignPurpose.EVALUATION,
                                               parameters={"seeds": [0]}))
    researcher, maintainer = UserFactory(), MaintainerFactory()
    version = submit(example_from_the_docs(), researcher)
    assert (version.name, version.version, version.review_state) == ("frozen_weights", "1",
                                                                      ReviewState.PENDING)

    version, campaign = do_approve_detector_version(version, acting_user=maintainer)
    assert campaign.purpose == CampaignPurpose.SCORING and campaign.parameters["seeds"] == [0]
    runs = list(campaign.runs.select_related("detector__code"))
    scored = [run for run in runs if run.detector.code_id == version.pk]
    twins = [run for run in runs if run.detector.code_id != version.pk]  # the ground truth (evaluation.integrity)
    assert sorted(run.variant for run in scored) == sorted(run.variant for run in twins) == [Variant.BUGGY,
                                                                                          Variant.FIXED]
    assert {(run.detector.name, run.detector.config.get("trusted_twin")) for run in twins} == {("plain", True)}
    for run in runs:
        execute_run(run.pk)  # the worker's path: claim, sandbox, offline check, do_finish_run
    by_variant = {}
    for run in campaign.runs.filter(detector__code=version).prefetch_related("alarms"):
        assert run.status == RunStatus.SUCCEEDED, (run.failure_reason, run.stderr[-2000:])
        by_variant[run.variant] = run
    buggy, fixed = by_variant[Variant.BUGGY], by_variant[Variant.FIXED]
    assert {alarm.rule for alarm in buggy.alarms.all()} == {"frozen_step"}
    assert judge_run(Variant.BUGGY, buggy.trigger_step, buggy.trigger_time,
                     [AlarmPoint(alarm.step, alarm.time, alarm.rule) for alarm in buggy.alarms.all()]).detected
    assert not fixed.alarms.exists()
    assert SUBMITTED_MODULE not in sys.modules  # this process (the worker) never imported it
    detector = buggy.detector
    assert (detector.submitter, detector.link, detector.code_hash) == (researcher, "https://example.org/paper",
                                                                      version.code_hash)
    assert detector.approved_at == version.reviewed_at is not None


# --- Hostile submitted code: only inside the sandbox ----------------------------------------------------

HOSTILE = '''
import glob, json, os, socket
from pathlib import Path
from runners.detectors import DetectorPlugin

MARKER = {marker!r}
SECRETS = {secrets!r}
try:  # at import time: must never land outside a sandbox
    Path(MARKER).parent.mkdir(parents=True, exist_ok=True)
    Path(MARKER).write_text("imported")
except OSError:
    pass

def snoop():
    found = []
    sources = {{"os.environ": "\\n".join(f"{{k}}={{v}}" for k, v in os.environ.items())}}
    for path in glob.glob("/proc/[0-9]*/environ") + [{secret_file!r}, {settings_file!r}]:
        try:
            sources[path] = Path(path).read_bytes().decode("utf-8", "replace")
        except OSError:
            pass
    for where, text in sources.items():
        found += [f"{{secret}} in {{where}}" for secret in SECRETS if secret in text]
    try:
        socket.create_connection(("127.0.0.1", {db_port}), timeout=2).close()
        database = "reached"
    except OSError as error:
        database = type(error).__name__
    return {{"found": found, "database": database, "settings_readable": {settings_file!r} in sources,
             "secret_file_readable": {secret_file!r} in sources}}


class Snooper(DetectorPlugin):
    name = "snooper"
    version = "1"
    integration = "drop-in"

    def install(self, probe):
        probe.alarm("snooped_in_probe", "what the probe saw", snoop(), step=0)

    def analyze(self, context, report):
        return [{{"step": 0, "rank": 0, "rule": "snooped_in_analyze", "message": "what analyze saw",
                  "evidence": snoop(), "time": None}}]
'''


def database_port():
    """A port that answers on this machine's loopback: PostgreSQL's when it runs, else one opened here."""
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
    except OSError:
        listener = socket.create_server(("127.0.0.1", 0))
        return listener.getsockname()[1], listener
    return 5432, None


@pytest.mark.integration
def test_a_hostile_approved_detector_runs_only_in_the_sandbox_and_reads_no_secret(tmp_path, monkeypatch):
    secret_key, database_password = secrets.token_hex(24), secrets.token_hex(12)
    monkeypatch.setenv("DJANGO_SECRET_KEY", secret_key)
    monkeypatch.setenv("DATABASE_URL", f"postgres://bench:{database_password}@127.0.0.1:5432/bench")
    secret_file = tmp_path / "secret_key"
    secret_file.write_text(secret_key)
    marker = tmp_path / f"imported-{secrets.token_hex(4)}"
    port, listener = database_port()
    settings_file = str(Path(settings.BASE_DIR) / "benchmark_site" / "settings.py")
    code = HOSTILE.format(marker=str(marker), secrets=[secret_key, database_password], secret_file=str(secret_file),
                          settings_file=settings_file, db_port=port)
    reproducer = ReproducerVersionFactory()  # the corpus its scoring campaign (not run here) is made of
    version, _ = do_approve_detector_version(submit(code, UserFactory()), acting_user=MaintainerFactory())
    try:
        outcome = execute(RunFactory(reproducer_version=reproducer, detector=do_record_submitted_detector(version),
                                     variant=Variant.BUGGY))
    finally:
        if listener is not None:
            listener.close()
    assert outcome.succeeded, outcome.failure_reason + outcome.stderr
    seen = {alarm["rule"]: alarm["evidence"] for alarm in outcome.alarms}
    assert set(seen) == {"snooped_in_probe", "snooped_in_analyze"}
    for evidence in seen.values():
        assert evidence["found"] == [], evidence
        assert evidence["database"] != "reached" and not evidence["settings_readable"], evidence
        assert not evidence["secret_file_readable"], evidence
    assert not marker.exists()  # its import-time write stayed in the sandbox's own /tmp
    assert SUBMITTED_MODULE not in sys.modules
    assert "snooper" not in all_plugins()


# --- One kind of detector: the built-ins are approved versions of the system ---------------------------------

def test_every_built_in_detector_is_an_approved_version_of_its_module_source():
    for name, plugin in all_plugins().items():
        record = do_record_detector(name)
        code = record.code
        source = Path(sys.modules[type(plugin).__module__].__file__).read_text(encoding="utf-8")
        assert (code.builtin, code.submitted_by, code.review_state) == (True, None, ReviewState.APPROVED)
        assert code.code == source and code.code_hash == hashlib.sha256(source.encode()).hexdigest()
        assert (code.name, code.version) == (plugin.name, plugin.version) and record.approved_at is not None
    nan_inf = all_plugins()["nan_inf"]
    assert do_record_detector("nan_inf").code == do_record_builtin_detector_version(nan_inf)  # recorded once


def test_a_row_recorded_before_detector_versions_is_given_its_code_not_duplicated():
    from runners.detector_versions.registry import config_hash

    config = all_plugins()["nan_inf"].config()
    legacy = Detector.objects.create(name="nan_inf", version="1", config=config, config_hash=config_hash(config))
    assert do_record_detector("nan_inf").pk == legacy.pk
    assert Detector.objects.get(pk=legacy.pk).code.builtin


# --- Checks: every problem at once, nothing stored --------------------------------------------------------

GOOD = example_from_the_docs()


@pytest.mark.parametrize("code, expected", [
    ("def broken(:\n", "line 1"),
    ("x = 1\n", "exactly one class deriving from DetectorPlugin"),
    (GOOD + "\n\nclass Second(DetectorPlugin):\n    name = 'b'\n", "exactly one class"),
    (GOOD.replace('name = "frozen_weights"', 'name = "Frozen Weights!"'), "name 'Frozen Weights!'"),
    (GOOD.replace('name = "frozen_weights"', "name = NAME"), "must be a literal"),
    (GOOD.replace("integration = DROP_IN", 'integration = "sometimes"'), "integration 'sometimes'"),
    (GOOD.replace("    def install(self, probe):", "    def setup(self, probe):"), "does not define install"),
    (GOOD.replace("    def analyze(self, context, report):", "    def command(self, argv, context):"),
     "the worker calls it"),
    (GOOD.replace('version = "1"', 'version = "1"\n    preload = "traincheck"'), "the worker decides it"),
    (GOOD.replace('version = "1"', 'version = "1"\n    in_quickstart = False'), "the worker decides it"),
    (GOOD.replace('version = "1"', 'version = "1"\n    needs_fit = True'), "needs_fit is True"),
    (GOOD.replace('name = "frozen_weights"', 'name = "nan_inf"'), "built-in detector"),
    (GOOD.replace('name = "frozen_weights"', 'name = "submit"'), "the name of one of the site's pages"),
    ("", "No code"),
])
def test_the_api_refuses_a_bad_module_with_every_problem_and_stores_nothing(code, expected):
    answer = client_for(UserFactory()).post("/api/detector-submissions/", {"code": code}, format="json")
    assert answer.status_code == 400, answer.content
    assert any(expected in problem for problem in answer.json()["code"]), answer.json()
    assert not DetectorVersion.objects.filter(builtin=False).exists()


@pytest.mark.parametrize("config, expected", [
    ("not json", "config is not JSON"), ([1, 2], "must be a JSON object"),
    ({"threshold": "x" * 20_000}, "bytes of JSON"),
])
def test_a_bad_config_is_refused(config, expected):
    answer = client_for(UserFactory()).post("/api/detector-submissions/", {"code": GOOD, "config": config},
                                            format="json")
    assert answer.status_code == 400 and any(expected in problem for problem in answer.json()["code"]), answer.json()


def test_a_module_over_the_size_limit_is_refused_before_it_is_parsed(settings):
    settings.SILENTBENCH_SUBMISSION_MAX_FILE_BYTES = 1024
    answer = client_for(UserFactory()).post("/api/detector-submissions/", {"code": GOOD}, format="json")
    assert answer.status_code == 400 and "KiB allowed" in answer.json()["code"][0]


def test_submitting_needs_a_signed_in_user_and_imports_and_queues_nothing(django_capture_on_commit_callbacks):
    assert client_for().post("/api/detector-submissions/", {"code": GOOD}, format="json").status_code in (401, 403)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        answer = client_for(UserFactory()).post(
            "/api/detector-submissions/", {"code": GOOD, "config": '{"every_n_steps": 2}', "link": "https://x.org/p"},
            format="json")
    assert answer.status_code == 201, answer.content
    assert callbacks == []
    body = answer.json()
    assert (body["name"], body["version"], body["review_state"], body["config"]) == (
        "frozen_weights", "1", "pending", {"every_n_steps": 2})
    assert body["interface"]["analyze"] is True and body["interface"]["integration"] == "drop-in"
    assert "frozen_weights" not in all_plugins() and SUBMITTED_MODULE not in sys.modules


def test_a_module_uploaded_as_a_file_is_read_like_a_reproducers(tmp_path):
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("frozen_weights.py", GOOD.encode())
    answer = client_for(UserFactory()).post("/api/detector-submissions/", {"files": [upload]}, format="multipart")
    assert answer.status_code == 201, answer.content
    binary = SimpleUploadedFile("frozen_weights.py", b"\xff\xfe\x00")
    answer = client_for(UserFactory()).post("/api/detector-submissions/", {"files": [binary]}, format="multipart")
    assert answer.status_code == 400 and "not UTF-8 text" in answer.json()["code"][0]
    both = {"files": [SimpleUploadedFile("a.py", GOOD.encode())], "code": GOOD}
    answer = client_for(UserFactory()).post("/api/detector-submissions/", both, format="multipart")
    assert answer.status_code == 400 and "not both" in answer.json()["code"][0]


def test_a_new_version_comes_from_its_submitter_or_a_maintainer_with_a_new_label():
    researcher, stranger, maintainer = UserFactory(), UserFactory(), MaintainerFactory()
    submit(GOOD, researcher)
    changed = GOOD.replace('version = "1"', 'version = "2"').replace("every_n_steps\": 1", "every_n_steps\": 3")
    assert client_for(stranger).post("/api/detector-submissions/", {"code": changed},
                                     format="json").status_code == 403
    same_label = GOOD.replace("every_n_steps\": 1", "every_n_steps\": 3")
    answer = client_for(researcher).post("/api/detector-submissions/", {"code": same_label}, format="json")
    assert answer.status_code == 400 and "already has a version '1'" in answer.json()["code"][0]
    assert client_for(researcher).post("/api/detector-submissions/", {"code": changed},
                                       format="json").status_code == 201
    assert client_for(maintainer).post("/api/detector-submissions/", {
        "code": changed.replace('version = "2"', 'version = "3"')}, format="json").status_code == 201


# --- Review: a diff against the previous approved version; approve or reject with a reason, audited ----------

def test_review_through_the_api_rejects_with_a_reason_and_approves_into_a_scoring_campaign():
    ReproducerVersionFactory()
    researcher, maintainer = UserFactory(), MaintainerFactory()
    version = submit(GOOD, researcher)
    url = f"/api/detector-submissions/{version.pk}/review/"
    assert client_for(researcher).post(url, {"decision": "approve"}, format="json").status_code == 403
    assert client_for(maintainer).post(url, {"decision": "reject"}, format="json").status_code == 400
    answer = client_for(maintainer).post(url, {"decision": "reject", "note": "reads files outside its run"},
                                         format="json")
    assert answer.status_code == 200 and answer.json()["review_state"] == "rejected"
    assert answer.json()["review_note"] == "reads files outside its run"
    assert client_for(maintainer).post(url, {"decision": "approve"}, format="json").status_code == 400
    [rejected] = AuditEvent.objects.about(version).filter(action="reject")
    assert rejected.actor == maintainer and "reads files outside its run" in rejected.summary

    second = submit(GOOD.replace('version = "1"', 'version = "2"'), researcher)
    answer = client_for(maintainer).post(f"/api/detector-submissions/{second.pk}/review/", {"decision": "approve"},
                                         format="json")
    assert answer.status_code == 200 and answer.json()["review_state"] == "approved"
    [campaign_id] = answer.json()["scoring_campaigns"]
    assert AuditEvent.objects.about(second).filter(action="approve", actor=maintainer).exists()
    own = client_for(researcher).get("/api/detector-submissions/").json()["results"]
    assert {row["id"] for row in own} == {version.pk, second.pk}
    assert client_for(UserFactory()).get("/api/detector-submissions/").json()["results"] == []


def test_the_review_page_shows_the_code_and_a_diff_against_the_previous_approved_version(client):
    ReproducerVersionFactory()
    researcher, maintainer = UserFactory(), MaintainerFactory()
    first, _ = do_approve_detector_version(submit(GOOD, researcher), acting_user=maintainer)
    second = submit(GOOD.replace('version = "1"', 'version = "2"').replace("every_n_steps\": 1", "every_n_steps\": 4"),
                    researcher)
    client.force_login(researcher)
    assert client.get(reverse("runners:review_detector", args=[second.pk])).status_code == 403
    client.force_login(maintainer)
    assert second.name in client.get(reverse("runners:detector_review_queue")).content.decode()
    page = client.get(reverse("runners:review_detector", args=[second.pk])).content.decode()
    assert "Changes since the latest approved version, 1" in page and "every_n_steps" in page
    assert 'class="gd"' in page and 'class="gi"' in page  # the diff's removed and added lines, highlighted
    answer = client.post(reverse("runners:review_detector", args=[second.pk]), {"decision": "reject", "note": ""})
    assert "a rejection needs a reason" in answer.content.decode()
    answer = client.post(reverse("runners:review_detector", args=[second.pk]), {"decision": "approve"})
    assert answer.status_code == 302
    second.refresh_from_db()
    assert second.review_state == ReviewState.APPROVED and second.approved_baseline() == first


def test_the_web_form_submits_a_module_and_reports_every_problem(client):
    client.force_login(UserFactory())
    page = client.post(reverse("runners:submit_detector"), {"code": "x = 1\n", "config": "[1]"})
    text = page.content.decode()
    assert page.status_code == 200 and "Nothing was stored" in text and "config must be a JSON object" in text
    answer = client.post(reverse("runners:submit_detector"), {"code": GOOD, "link": "https://example.org/p"})
    assert answer.status_code == 302 and answer.url == reverse("runners:my_detectors")
    assert "frozen_weights" in client.get(reverse("runners:my_detectors")).content.decode()
    client.logout()
    assert client.get(reverse("runners:submit_detector")).status_code == 302  # to sign in


def test_a_detector_is_never_scored_before_approval():
    ReproducerVersionFactory()
    version = submit(GOOD, UserFactory())
    with pytest.raises(ValidationError, match="not approved"):
        do_start_scoring(version, acting_user=None)
    do_reject_detector_version(version, "no", acting_user=MaintainerFactory())
    with pytest.raises(ValidationError, match="not approved"):
        do_start_scoring(version, acting_user=None)


# --- Seeds and rescoring ------------------------------------------------------------------------------------

def test_scoring_runs_at_the_published_evaluations_seeds_or_0_1_2():
    assert published_seeds() == DEFAULT_SEEDS == (0, 1, 2)
    EvaluationFactory(campaign=CampaignFactory(parameters={"seeds": [0, 1, 2, 3, 4]}))
    assert published_seeds() == (0, 1, 2, 3, 4)


def test_rescore_reruns_a_detector_on_the_current_corpus(capsys):
    first = ReproducerVersionFactory()
    version, campaign = do_approve_detector_version(submit(GOOD, UserFactory()), acting_user=MaintainerFactory())
    assert {run.reproducer_version_id for run in campaign.runs.all()} == {first.pk}
    second = ReproducerVersionFactory()  # the corpus grew
    call_command("rescore", "frozen_weights")
    rescored = version.records.get().runs.exclude(campaign=campaign).first().campaign
    assert rescored.purpose == CampaignPurpose.SCORING
    assert {run.reproducer_version_id for run in rescored.runs.all()} == {first.pk, second.pk}
    assert f"Campaign #{rescored.pk}" in capsys.readouterr().out
    call_command("rescore", "nan_inf")  # a built-in, through the same path
    assert do_record_builtin_detector_version(all_plugins()["nan_inf"]).records.get().runs.filter(
        campaign__purpose=CampaignPurpose.SCORING).exists()
    with pytest.raises(CommandError, match="No approved detector"):
        call_command("rescore", "crystal_ball")


FITTING = '''
import json, subprocess, sys
from pathlib import Path
from runners.detectors import DetectorPlugin


class Counting(DetectorPlugin):
    name = "counting"
    version = "1"
    integration = "drop-in"
    instruments = False
    needs_fit = True

    def install(self, probe):
        pass

    def fit(self, programs, workdir, env, limits, config):
        for directory, entrypoint, args in programs:
            subprocess.run([sys.executable, entrypoint, *args], cwd=directory, env=env, check=True, timeout=60)
        records = [json.loads(line) for line in Path(env["SILENTBENCH_REPORT"]).read_text().splitlines()]
        return json.dumps({"steps": sum(record["event"] == "step" for record in records)}), {"programs": len(programs)}

    def analyze(self, context, report):
        return [{"step": 0, "rule": "fitted", "message": "what the fit learned",
                 "evidence": json.loads(context.fit_artifact)}]
'''


@pytest.mark.integration
def test_a_submitted_detector_fits_and_analyzes_in_sandboxed_processes():
    from bugs.models import Reproducer

    pipeline = Reproducer.objects.create(name="toy-pipeline", strategy="injected")
    ReproducerVersionFactory(reproducer=pipeline)
    bug_version = ReproducerVersionFactory()
    version, campaign = do_approve_detector_version(submit(FITTING, UserFactory()), acting_user=MaintainerFactory())
    run = campaign.runs.filter(reproducer_version=bug_version, detector__code=version).first()
    execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, (run.failure_reason, run.stderr[-2000:])
    assert run.fit_artifact.summary["programs"] == 1 and run.fit_artifact.summary["references"] == [str(pipeline)]
    [alarm] = run.alarms.all()
    assert (alarm.rule, alarm.evidence) == ("fitted", {"steps": 3})  # the pipeline's 3 steps, counted in the fit
    assert SUBMITTED_MODULE not in sys.modules


# --- What a submitted detector is told, and what it may leave behind --------------------------------------

PEEKING = '''
import os
from runners.detectors import DetectorPlugin


class Peeking(DetectorPlugin):
    name = "peeking"
    version = "1"
    integration = "drop-in"

    def install(self, probe):
        pass

    def analyze(self, context, report):
        path = os.path.join(context.workdir, ".silentbench-report.jsonl")
        text = open(path).read() if os.path.exists(path) else ""
        return [{"step": 0, "rule": "peeked", "message": "what analyze was told",
                 "evidence": {"fields": sorted(vars(report)), "start": report.start, "steps": len(report.steps),
                              "report_file": text, "report_env": "SILENTBENCH_REPORT" in os.environ}}]
'''


@pytest.mark.integration
def test_a_submitted_analyze_is_not_told_the_answer():
    reproducer = ReproducerVersionFactory()
    version, _ = do_approve_detector_version(submit(PEEKING, UserFactory()), acting_user=MaintainerFactory())
    outcome = execute(RunFactory(reproducer_version=reproducer, detector=do_record_submitted_detector(version),
                                 variant=Variant.BUGGY, seed=5))
    assert outcome.succeeded, outcome.failure_reason + outcome.stderr
    assert outcome.oracle["manifested"] is True and outcome.trigger_step == 1  # the worker knows the answer
    [told] = [alarm["evidence"] for alarm in outcome.alarms if alarm["rule"] == "peeked"]
    assert told["fields"] == ["alarms", "comparisons", "start", "steps"], told
    assert set(told["start"]) == {"time", "steps", "world_size"} and told["steps"] == 3, told
    assert "oracle" not in told["report_file"] and "buggy" not in told["report_file"], told
    assert told["report_env"] is False


POISONING = '''
import os
from pathlib import Path
from runners.detectors import DetectorPlugin


class Poisoning(DetectorPlugin):
    name = "poisoning"
    version = "1"
    integration = "drop-in"

    def install(self, probe):
        folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "zz"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cplanted.py").write_text("print('code that other detectors would load')")
'''


@pytest.mark.integration
def test_a_run_under_a_submitted_detector_adds_nothing_to_the_compile_cache(settings, tmp_path):
    settings.SILENTBENCH_COMPILE_CACHE_DIR = tmp_path / "compile-cache"
    settings.SILENTBENCH_COMPILE_CACHE_MB = 10
    reproducer = ReproducerVersionFactory()
    version, _ = do_approve_detector_version(submit(POISONING, UserFactory()), acting_user=MaintainerFactory())
    outcome = execute(RunFactory(reproducer_version=reproducer, detector=do_record_submitted_detector(version),
                                 variant=Variant.BUGGY))
    assert outcome.succeeded, outcome.failure_reason + outcome.stderr
    assert outcome.execution["compile_cache"]["files_added"] == 0
    assert not list(settings.SILENTBENCH_COMPILE_CACHE_DIR.rglob("cplanted.py"))


# --- What the worker reads of a submitted detector: checked when it is submitted --------------------------

FITTER = '''
from runners.detectors import DetectorPlugin


class Fitter(DetectorPlugin):
    name = "fitter"
    version = "1"
    integration = "drop-in"
    needs_fit = True
    fit_config_keys = ["threshold"]
    default_config = {"threshold": 1}

    def install(self, probe):
        pass

    def fit(self, programs, workdir, env, limits, config):
        return "", {}
'''


@pytest.mark.parametrize("config, expected", [
    ({"fit_pipelines": 5}, "fit_pipelines must be a list"),
    ({"fit_pipelines": "mlp-adam"}, "fit_pipelines must be a list"),
    ({"fit_pipelines": ["mlp-adam", 1]}, "fit_pipelines must be a list"),
    ({"fit_seed": "1"}, "fit_seed must be a whole number"),
    ({"fit_seed": True}, "fit_seed must be a whole number"),
    ({"fit_seed": -1}, "fit_seed must be a whole number"),
    ({"fit_on_self": True}, "fit_on_self must be false"),
])
def test_a_bad_fit_config_is_refused_at_submission(config, expected):
    as_config = client_for(UserFactory()).post("/api/detector-submissions/", {"code": FITTER, "config": config},
                                               format="json")
    in_module = client_for(UserFactory()).post("/api/detector-submissions/", {
        "code": FITTER.replace('{"threshold": 1}', repr({"threshold": 1, **config}))}, format="json")
    for answer in (as_config, in_module):
        assert answer.status_code == 400, answer.content
        assert any(expected in problem for problem in answer.json()["code"]), answer.json()
    assert not DetectorVersion.objects.filter(builtin=False).exists()


def test_a_good_fit_config_is_taken_and_scored_without_error():
    ReproducerVersionFactory()
    config = {"fit_pipelines": ["mlp-adam"], "fit_seed": 7, "fit_on_self": False}
    answer = client_for(UserFactory()).post("/api/detector-submissions/", {"code": FITTER, "config": config},
                                            format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["interface"]["fit_config_keys"] == ["threshold"]
    review = client_for(MaintainerFactory()).post(f"/api/detector-submissions/{answer.json()['id']}/review/",
                                                  {"decision": "approve"}, format="json")
    assert review.status_code == 200 and review.json()["scoring_campaigns"], review.content


@pytest.mark.parametrize("attribute, expected", [
    ('fit_config_keys = (b"a",)', "fit_config_keys: a list or tuple of at most 64 config key names"),
    ('fit_config_keys = ["a", 1]', "fit_config_keys: a list or tuple of at most 64 config key names"),
    (f"fit_config_keys = {[f'k{n}' for n in range(65)]!r}", "fit_config_keys: a list or tuple of at most 64"),
    ('fit_config_keys = ["a\\x00"]', "cannot be stored"),
    ('description = "bad \\ud800 text"', "cannot be stored"),
])
def test_what_the_module_declares_must_be_storable_text(attribute, expected):
    code = FITTER.replace('fit_config_keys = ["threshold"]', attribute)
    answer = client_for(UserFactory()).post("/api/detector-submissions/", {"code": code}, format="json")
    assert answer.status_code == 400, answer.content
    assert any(expected in problem for problem in answer.json()["code"]), answer.json()
    assert not DetectorVersion.objects.filter(builtin=False).exists()
