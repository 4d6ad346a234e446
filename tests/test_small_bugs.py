"""Small bugs, each pinned by a test: the 503 page's stylesheet, a missing campaign on every results
surface, one parse per submitted Python file, the detector plugin's fit interface, and a message
naming a module that moved."""
import ast
import importlib
import inspect
import io
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from django.contrib.staticfiles import finders
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.test import Client

from bugs.models import Bug, ReproducerVersion
from runners.detectors.base import DetectorPlugin
from runners.detectors.traincheck import TrainCheck
from runners.models import Campaign

from .factories import GOOD_REPRODUCER, BugFactory, UserFactory
from .helpers import ORACLE_AND_FIDELITY, client_for

STYLESHEET_LINK = re.compile(r'<link\b[^>]*\brel="stylesheet"[^>]*\bhref="([^"]+)"')


def stylesheets(html):
    return STYLESHEET_LINK.findall(html)


# --- 1. the 503 page links the site's real stylesheet -----------------------------------------------

@pytest.mark.django_db
def test_the_503_page_links_the_stylesheet_that_exists(monkeypatch, settings):
    base_page = Client().get("/accounts/login/").content.decode()  # a page of templates/base.html
    from django.db.backends import utils

    def refused(*args, **kwargs):
        raise OperationalError("connection refused")

    with monkeypatch.context() as patched:
        patched.setattr(utils.CursorWrapper, "execute", refused)
        page = Client().get("/")
    assert page.status_code == 503
    links = stylesheets(page.content.decode())
    assert links, "the 503 page links no stylesheet"
    assert links == stylesheets(base_page)[:1]  # the same stylesheet as every other page
    for href in links:
        assert href.startswith(settings.STATIC_URL)
        assert finders.find(href.removeprefix(settings.STATIC_URL)) is not None, f"{href} is no static file"
        assert Client().get(href).status_code == 200, f"{href} is not served"


def test_the_503_page_links_the_hashed_name_under_a_manifest_storage(settings, tmp_path):
    """With a manifest storage (hashed names after collectstatic) it links what ``{% static %}`` gives, and it
    still answers when the manifest lacks the stylesheet."""
    from benchmark_site.middleware import unavailable_page

    (tmp_path / "staticfiles.json").write_text(
        '{"paths": {"css/site.css": "css/site.0123abcd.css"}, "version": "1.1", "hash": "x"}')
    settings.STATIC_ROOT = tmp_path
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"}}
    assert stylesheets(unavailable_page()) == ["/static/css/site.0123abcd.css"]
    (tmp_path / "staticfiles.json").write_text('{"paths": {}, "version": "1.1", "hash": "x"}')
    settings.STORAGES = {**settings.STORAGES}  # a fresh storage reads the new manifest
    assert stylesheets(unavailable_page()) == ["/static/css/site.css"]


# --- 2. a campaign that does not exist is a 404 everywhere ------------------------------------------

def export(*args):
    out = io.StringIO()
    call_command("export", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/results/", "/results/detection.csv", "/results/latency.json", "/api/results/"])
def test_a_missing_or_malformed_campaign_is_a_404_on_every_web_surface(client, url):
    campaign = Campaign.objects.create(name="exists")
    assert client.get(url, {"campaign": campaign.pk}).status_code == 200
    assert client.get(url, {"campaign": ""}).status_code == 200  # the form's "–": no campaign chosen
    assert client.get(url, {"campaign": "999999"}).status_code == 404
    for malformed in ("abc", "-1", "1.5", "١٢"):  # never a 500, never silently "no campaign"
        assert client.get(url, {"campaign": malformed}).status_code == 404
    assert client.get(url, {"evaluation": "abc"}).status_code == 404


@pytest.mark.django_db
def test_export_of_a_missing_campaign_is_a_command_error():
    campaign = Campaign.objects.create(name="exists")
    assert export("detection", "--campaign", str(campaign.pk)).startswith("bug,")
    with pytest.raises(CommandError, match="No campaign #999999"):
        export("detection", "--campaign", "999999")


# --- 3. each submitted Python file is parsed once ----------------------------------------------------

MANIFEST = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 4,
            "needs": {"cuda": False, "world_size": 1, "time_limit_seconds": 30, "memory_mb": 1024},
            **ORACLE_AND_FIDELITY}
FILES = {"repro.py": GOOD_REPRODUCER, "helper.py": "SCALE = 2\n", "reproducer.yaml": yaml.safe_dump(MANIFEST)}
BUG = {"bug_id": "GH-5151", "title": "Parsed twice", "framework": "pytorch", "fault_location": "user",
       "root_cause": "r", "symptom": "s", "reproduction": "injected"}


@pytest.fixture
def parses(monkeypatch):
    """Counts ``ast.parse`` calls per file name while a submission is checked (core.python_source parses them)."""
    import core.python_source

    counted = Counter()
    real_parse = core.python_source.ast.parse

    def parse(source, filename="<unknown>", *args, **kwargs):
        counted[str(filename)] += 1
        return real_parse(source, filename, *args, **kwargs)

    monkeypatch.setattr(core.python_source.ast, "parse", parse)
    return counted


def uploads():
    return [SimpleUploadedFile(name, text.encode()) for name, text in FILES.items()]


@pytest.mark.django_db
def test_a_web_submission_parses_each_python_file_once(client, parses):
    client.force_login(UserFactory())
    response = client.post("/submit/", {**BUG, "reproducer_name": "cpu", "files": uploads()})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert ReproducerVersion.objects.get().files == FILES
    assert {name: parses[name] for name in ("repro.py", "helper.py")} == {"repro.py": 1, "helper.py": 1}


@pytest.mark.django_db
def test_an_api_submission_parses_each_python_file_once(parses):
    response = client_for(UserFactory()).post("/api/submissions/", {**BUG, "files": uploads()})
    assert response.status_code == 201, response.json()
    assert {name: parses[name] for name in ("repro.py", "helper.py")} == {"repro.py": 1, "helper.py": 1}


@pytest.mark.django_db
def test_the_form_still_reports_the_code_and_the_fields_at_once(client, parses):
    client.force_login(UserFactory())
    broken = {**FILES, "helper.py": "def broken(:\n"}
    page = client.post("/submit/", {**BUG, "bug_id": "not an id", "reproducer_name": "cpu",
                                    "files": [SimpleUploadedFile(n, t.encode()) for n, t in broken.items()]})
    text = page.content.decode()
    assert page.status_code == 200 and "is not a bug ID" in text and "helper.py, line 1" in text
    assert parses["helper.py"] == 1 and ReproducerVersion.objects.count() == 0


# --- 4. the detector plugin declares fit() -----------------------------------------------------------

def test_a_plugin_that_needs_a_fit_but_has_no_fit_says_so():
    class HalfDone(DetectorPlugin):
        name = "half_done"
        needs_fit = True

    with pytest.raises(NotImplementedError, match="half_done"):
        HalfDone().fit([], Path("/nonexistent"), {}, None, {})
    assert issubclass(NotImplementedError, RuntimeError)  # so ensure_fit reports it as a FitError


def plugin_attributes_used_by_fitting():
    """Names fitting.py reads on a plugin (``plugin.X``), and those it calls (``plugin.X(...)``)."""
    import runners.detector_versions.fitting

    tree = ast.parse(inspect.getsource(runners.detector_versions.fitting))
    used, called = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "plugin":
            used.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "plugin":
            called.add(node.func.attr)
    return used, called


def test_the_base_declares_everything_fitting_uses_on_a_plugin():
    used, called = plugin_attributes_used_by_fitting()
    assert {"fit", "tool_version"} <= called
    for name in used:
        assert hasattr(DetectorPlugin, name), f"fitting.py uses plugin.{name}, which DetectorPlugin lacks"
    for name in called:
        method = getattr(DetectorPlugin, name)
        assert callable(method) and inspect.getdoc(method), f"DetectorPlugin.{name} needs a docstring"
    def parameters(method):
        return [(name, parameter.kind) for name, parameter in inspect.signature(method).parameters.items()]

    assert parameters(DetectorPlugin.fit) == parameters(TrainCheck.fit)
    assert list(inspect.signature(DetectorPlugin.fit).parameters) == [
        "self", "programs", "workdir", "env", "limits", "config"]
    assert DetectorPlugin().tool_version() == ""


# --- 5. messages name modules that exist -------------------------------------------------------------

@pytest.mark.django_db
def test_the_no_delete_message_names_the_real_deprecation_action():
    bug = BugFactory()
    with pytest.raises(ValidationError) as raised:
        bug.delete()
    named = re.search(r"\(([\w.]+)\)", raised.value.messages[0]).group(1)
    module, function = named.rsplit(".", 1)
    assert named == "bugs.actions.do_deprecate_bug"
    assert callable(getattr(importlib.import_module(module), function))
    assert Bug.objects.filter(pk=bug.pk).exists()
