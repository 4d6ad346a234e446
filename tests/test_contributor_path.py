"""The contributor's path (issue 15): the catalog's fields documented as the code has them, framework ID prefixes
that cannot clash, prose that arrives whole, every problem of a submission in one answer, the verdict in the
submission API, every registered detector listed, and every submitted field on the review page."""
import re

import pytest
import yaml
from django.conf import settings
from django.core.exceptions import ValidationError

from bugs.actions import do_review_version, do_set_verification_verdict
from bugs.api import BugSerializer
from bugs.catalog import BUG_FIELDS, do_load_catalog
from bugs.forms import SUBMITTED_BUG_FIELDS
from bugs.models import (
    FRAMEWORK_OF_ID_PREFIX,
    RESERVED_ID_PREFIXES,
    STRATEGIES,
    Bug,
    BugStatus,
    FaultLocation,
    Framework,
    ReproducerVersion,
    Reproduction,
)
from runners.actions.detectors import do_record_detector
from runners.detector_versions.registry import config_hash
from runners.detectors import all_plugins, campaign_plugins
from runners.models import Detector

from .factories import (
    BugFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    StabilityCheckFactory,
    UserFactory,
)
from .helpers import BUG_FORM, FILES, client_for, uploads

pytestmark = pytest.mark.django_db

DOCS = settings.BASE_DIR / "docs"
BROKEN_FILES = {**FILES, "repro.py": "def broken(:\n"}
API_FORM = {name: value for name, value in BUG_FORM.items() if name != "reproducer_name"}


# --- docs/catalog.md follows the code ----------------------------------------------------------

def doc_table(heading):
    """The rows of the first table after ``heading`` in docs/catalog.md, as lists of cell texts."""
    text = (DOCS / "catalog.md").read_text()
    after = text[text.index(f"\n{heading}\n"):]
    rows = re.search(r"\n(\|.*\|\n)+", after).group(0).strip().splitlines()
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def backticked(cell):
    return re.findall(r"`([^`]+)`", cell)


@pytest.mark.parametrize("field, choices", [("framework", Framework), ("fault_location", FaultLocation),
                                            ("reproduction", Reproduction), ("status", BugStatus),
                                            ("strategy", STRATEGIES)])
def test_the_catalog_doc_lists_exactly_the_models_choices(field, choices):
    assert [backticked(row[0])[0] for row in doc_table(f"### `{field}`")] == [str(choice) for choice in choices]


def test_the_catalog_doc_lists_each_frameworks_reserved_prefixes():
    documented = {backticked(row[0])[0]: [prefix.rstrip("-") for prefix in backticked(row[2])]
                  for row in doc_table("### `framework`")}
    assert documented == {framework.value: list(prefixes) for framework, prefixes in RESERVED_ID_PREFIXES.items()}


def test_the_catalog_doc_lists_every_bug_field_of_the_yaml_the_form_and_the_api():
    documented = [backticked(row[0])[0] for row in doc_table("## Fields")]
    assert len(documented) == len(set(documented))
    assert set(documented) == {"id", *BUG_FIELDS, *SUBMITTED_BUG_FIELDS, *BugSerializer.Meta.fields}


def test_the_docs_protocol_links_the_catalog_doc():
    assert "(catalog.md)" in (DOCS / "reproducer-protocol.md").read_text()


def test_no_curl_example_sends_a_text_field_with_dash_f():
    """``curl -F name=value`` cuts the value at a ';' (and reads '@...' as a file): only files go with -F."""
    for path in [settings.BASE_DIR / "README.md", *DOCS.glob("*.md")]:
        fields = re.findall(r"(?:^|\s)(?:-F|--form)\s+['\"]?(\w+)=", path.read_text(), re.M)
        assert set(fields) <= {"files"}, f"{path.name} sends {fields} with -F: use --form-string"


# --- framework prefixes ----------------------------------------------------------------------

def test_every_framework_reserves_prefixes_of_its_own():
    assert set(RESERVED_ID_PREFIXES) == set(Framework)
    assert all(RESERVED_ID_PREFIXES.values())
    assert len(FRAMEWORK_OF_ID_PREFIX) == sum(map(len, RESERVED_ID_PREFIXES.values()))  # no prefix twice


def test_the_catalog_in_the_repository_keeps_the_prefix_rules():
    summary = do_load_catalog(settings.BASE_DIR / "catalog")
    assert len(summary.bugs_created) == len(list((settings.BASE_DIR / "catalog").glob("*/bug.yaml")))
    assert Bug.objects.filter(bug_id="TF-25175", framework=Framework.TENSORFLOW).exists()


def test_an_id_with_another_frameworks_prefix_is_refused_by_the_api_the_form_and_the_loader(client, tmp_path):
    user = UserFactory()
    clash = {**API_FORM, "bug_id": "TF-4242", "framework": Framework.TRANSFORMERS}
    response = client_for(user).post("/api/submissions/", {**clash, "files": uploads(FILES)})
    assert response.status_code == 400
    assert response.json()["bug_id"] == [
        "TF-4242: the prefix TF- is reserved for TensorFlow bugs. For HuggingFace Transformers use HF- (such as "
        "HF-12345), or a prefix that says where the bug was reported, such as GH- or SO-."]
    client.force_login(user)
    page = client.post("/submit/", {**BUG_FORM, **clash, "files": uploads(FILES)}).content.decode()
    assert "the prefix TF- is reserved for TensorFlow bugs" in page
    folder = tmp_path / "TF-4242"
    folder.mkdir()
    (folder / "bug.yaml").write_text(yaml.safe_dump({
        "id": "TF-4242", "title": "t", "framework": "transformers", "fault_location": "user", "root_cause": "r",
        "symptom": "s", "reproduction": "catalog_only"}))
    with pytest.raises(ValidationError, match="reserved for TensorFlow"):
        do_load_catalog(tmp_path)
    assert not Bug.objects.exists()

    response = client_for(user).post("/api/submissions/", {**clash, "bug_id": "HF-4242", "files": uploads(FILES)})
    assert response.status_code == 201, response.json()
    assert Bug.objects.get(bug_id="HF-4242").framework == Framework.TRANSFORMERS


# --- submitting through the API ----------------------------------------------------------------

def test_prose_with_semicolons_is_stored_whole_from_a_multipart_submission():
    prose = {"root_cause": "The hook zeroes the grad; type=text/plain; only the bias trains.",
             "symptom": "Loss plateaus; filename=x.py; nothing is logged",
             "fix": "@fix.txt; <detach.txt; re-register the hook after wrap()",
             "detection_signal": "param_not_updated; grad norms of the weight stay 0",
             "framework_versions": "torch 2.1; 2.2; 2.3"}
    response = client_for(UserFactory()).post("/api/submissions/", {**API_FORM, **prose, "files": uploads(FILES)},
                                               format="multipart")
    assert response.status_code == 201, response.json()
    bug = Bug.objects.get(bug_id=API_FORM["bug_id"])
    assert {name: getattr(bug, name) for name in prose} == prose


@pytest.mark.parametrize("bug_id, problem", [
    ("GH-4242", "already exists"),  # taken by the bug made below
    ("gh 4243", "is not a bug ID"),
    ("TF-4243", "reserved for TensorFlow"),
])
def test_the_ids_problem_and_the_files_problems_come_in_one_answer(bug_id, problem):
    BugFactory(bug_id="GH-4242")
    response = client_for(UserFactory()).post(
        "/api/submissions/", {**API_FORM, "bug_id": bug_id, "framework": Framework.JAX, "fix_url": "not a url",
                              "files": uploads(BROKEN_FILES)})
    assert response.status_code == 400
    problems = response.json()
    assert problem in " ".join(problems["bug_id"])
    assert any(p.startswith("repro.py, line 1:") and "does not parse" in p for p in problems["files"])
    assert "fix_url" in problems
    assert ReproducerVersion.objects.count() == 0


def test_a_submission_cannot_be_catalog_only():
    response = client_for(UserFactory()).post(
        "/api/submissions/", {**API_FORM, "reproduction": Reproduction.CATALOG_ONLY, "files": uploads(FILES)})
    assert response.status_code == 400 and "reproduction" in response.json()


def test_the_submission_api_shows_the_verdict_and_its_figures():
    user = UserFactory()
    response = client_for(user).post("/api/submissions/", {**API_FORM, "files": uploads(FILES)})
    assert response.status_code == 201, response.json()
    assert response.json()["bug_status"] == BugStatus.SUBMITTED and response.json()["verification"] is None
    version = ReproducerVersion.objects.get()
    do_review_version(version, approve=True, verify=False, acting_user=MaintainerFactory())
    StabilityCheckFactory(reproducer_version=version, seeds=5, buggy_manifested=5, fixed_manifested=0, failed_runs=9)
    check = StabilityCheckFactory(reproducer_version=version, seeds=3, buggy_manifested=2, fixed_manifested=1,
                                  failed_runs=0)
    do_set_verification_verdict(version.reproducer.bug, check.verdict)

    listed = client_for(user).get("/api/submissions/").json()["results"]
    assert [(item["bug"], item["bug_status"]) for item in listed] == [("GH-4242", BugStatus.FLAKY)]
    verification = listed[0]["verification"]
    assert {key: verification[key] for key in ("verdict", "seeds", "buggy_manifested", "fixed_manifested",
                                               "failed_runs")} == {
        "verdict": "flaky", "seeds": 3, "buggy_manifested": 2, "fixed_manifested": 1, "failed_runs": 0}
    assert client_for(user).get(f"/api/submissions/{version.pk}/").json()["verification"] == verification
    assert client_for(UserFactory()).get(f"/api/submissions/{version.pk}/").status_code == 404


# --- the detectors API ---------------------------------------------------------------------------

def listed_detectors(query=""):
    response = client_for().get(f"/api/detectors/{query}")
    assert response.status_code == 200
    return response.json()["results"]


def test_the_detectors_api_lists_every_registered_detector_without_writing():
    """Every detector a campaign may name: the sensitivity track's bundle, which none may, is not listed."""
    plugins = campaign_plugins()
    assert "bundle" in all_plugins() and "bundle" not in plugins
    listed = listed_detectors()
    assert [item["name"] for item in listed] == sorted(plugins)
    for item in listed:
        plugin = plugins[item["name"]]
        assert item == {"id": None, "name": plugin.name, "version": plugin.version, "config": plugin.config(),
                        "config_hash": config_hash(plugin.config()), "description": plugin.description,
                        "needs_fit": plugin.needs_fit, "integration": plugin.integration, "current": True}
    assert any(item["needs_fit"] for item in listed) and not all(item["needs_fit"] for item in listed)
    assert Detector.objects.count() == 0


def test_the_detectors_api_merges_recorded_detectors_with_the_registry():
    plain = do_record_detector("plain")
    tuned = do_record_detector("nan_inf", {"check_loss": False})
    gone = Detector.objects.create(name="crystal_ball", version="1", config={}, config_hash=config_hash({}))
    listed = {(item["name"], item["id"]): item for item in listed_detectors()}
    assert len(listed) == len(campaign_plugins()) + 2  # the tuned nan_inf and the unregistered one
    assert listed[("plain", plain.pk)]["current"] and ("plain", None) not in listed
    assert not listed[("nan_inf", tuned.pk)]["current"] and listed[("nan_inf", None)]["current"]
    assert listed[("crystal_ball", gone.pk)]["needs_fit"] is None and not listed[("crystal_ball", gone.pk)]["current"]
    assert listed[("crystal_ball", gone.pk)]["integration"] is None
    assert [(item["name"], item["id"]) for item in listed_detectors("?name=nan_inf")] == [
        ("nan_inf", tuned.pk), ("nan_inf", None)]
    assert [item["id"] for item in listed_detectors("?name=traincheck")] == [None]
    detail = client_for().get(f"/api/detectors/{plain.pk}/").json()
    assert detail["current"] is True and detail["needs_fit"] is False
    assert Detector.objects.count() == 3


# --- the review page -------------------------------------------------------------------------

def test_the_review_page_shows_every_submitted_field(client):
    values = {"bug_id": "GH-777", "title": "Title marker", "framework": Framework.LIGHTNING,
              "framework_versions": "Versions marker", "fault_location": FaultLocation.COMPILER,
              "root_cause_category": "Category marker", "root_cause": "Root cause marker",
              "symptom": "Symptom marker", "fix": "Fix marker", "detection_signal": "Signal marker",
              "upstream_issue_url": "https://example.org/issue-marker", "fix_url": "https://example.org/fix-marker",
              "reproduction": Reproduction.INJECTED, "needs_cuda_original": True, "multi_rank": True}
    assert set(values) == set(SUBMITTED_BUG_FIELDS)
    bug = BugFactory(status=BugStatus.SUBMITTED, **values)
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug), review_state="pending",
                                       submitted_by=UserFactory())
    client.force_login(MaintainerFactory())
    page = client.get(f"/review/{version.pk}/").content.decode()
    shown = {name: getattr(bug, f"get_{name}_display")() if name in ("framework", "fault_location", "reproduction")
             else value for name, value in values.items() if not isinstance(value, bool)}
    assert [name for name, text in shown.items() if text not in page] == []
    assert re.search(r"needs CUDA</dt><dd>yes</dd>", page) and re.search(r"\(ranks\)</dt><dd>yes</dd>", page)
