"""Schemathesis drives every operation of our OpenAPI schema with generated requests, as an anonymous
caller and with a maintainer's token: no request may end in a server error (5xx).

The schema is the one the app serves (drf-spectacular's generator); requests go through the WSGI
application in-process, inside the test's transaction. Runs that a campaign or an approval would queue
are enqueued only when a transaction commits, which never happens here, so no operation is excluded
and no worker is needed.

The maintainer gets Schemathesis' coverage phase (boundary and wrongly typed values of every field,
unexpected methods) and fuzzing; the anonymous caller, whose writes are refused before any input is
read, gets fuzzing only. Derandomized, so CI sees the same requests every time. The requests that were
server errors before (tests/test_hostile_input.py: huge numbers, deep nesting, aliases and values a tag's
constructor cannot convert in a manifest, NUL in a path, a query or a JSON body, a number past 64 bits in a
JSON body) are explicit cases as well, answered in JSON, and so is a multipart body without its boundary
(once Django's HTML 400). bin/test runs this file on SQLite and again on PostgreSQL, where NUL and integers
past 2**31 are what the database refuses.
"""
import pytest
import schemathesis
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from rest_framework.throttling import SimpleRateThrottle
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from accounts.actions import do_create_api_token
from runners.actions.detectors import do_record_detector

from .factories import BugFactory, MaintainerFactory, ReproducerFactory, ReproducerVersionFactory, RunFactory
from .helpers import BUG_FORM, FILES, SUBMISSION_MANIFEST

OPENAPI = SchemaGenerator().get_schema(request=None, public=True)
APP = get_wsgi_application()


def load(config):
    schema = schemathesis.openapi.from_dict(OPENAPI, config=SchemathesisConfig.from_dict(config))
    schema.app = APP
    return schema


full = load({})
fuzzing_only = load({"phases": {"coverage": {"enabled": False}}})
bounded = settings(max_examples=10, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))


@pytest.fixture
def app_in_test_transaction(db, monkeypatch):
    """Like Django's test client: requests must not close the connection that holds the test's
    transaction. Throttling is lifted (tests/test_security.py covers it): this is about server errors."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"anon": None, "user": None, "token": None})
    bug = BugFactory(bug_id="TEST-ST")  # real objects, for the ids the generator tries
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug))
    ReproducerVersionFactory(reproducer=version.reproducer, files={"repro.py": "print(1)"}, review_state="pending")
    RunFactory(reproducer_version=version, detector=do_record_detector("plain"))
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@fuzzing_only.parametrize()
@bounded
def test_anonymous_requests_cause_no_server_error(case, app_in_test_transaction):
    case.call_and_validate(checks=[not_a_server_error])


@pytest.fixture
def maintainer_token(app_in_test_transaction):
    return do_create_api_token("schemathesis", acting_user=MaintainerFactory())[1]


@full.parametrize()
@bounded
def test_maintainer_requests_cause_no_server_error(case, maintainer_token):
    case.call_and_validate(headers={"Authorization": f"Token {maintainer_token}"}, checks=[not_a_server_error])



def submission(manifest_text):
    """POST /api/submissions/ of the valid reproducer with this reproducer.yaml, as a multipart body."""
    files = [SimpleUploadedFile(name, text.encode())
             for name, text in {**FILES, "reproducer.yaml": manifest_text}.items()]
    return full["/api/submissions/"]["POST"].Case(body=encode_multipart(BOUNDARY, {**BUG_FORM, "files": files}),
                                                  media_type="multipart/form-data",
                                                  headers={"Content-Type": MULTIPART_CONTENT})


def preview(bugs):
    return full["/api/campaigns/preview/"]["POST"].Case(body={"detectors": ["plain"], "bugs": bugs},
                                                        media_type="application/json")


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


MANIFEST = yaml.safe_dump(SUBMISSION_MANIFEST)
HOSTILE_CASES = {  # name: (case, the status it gets)
    "memory_mb past any column": (lambda: submission(MANIFEST.replace("1024", "99999999999999999999")), 400),
    "YAML nested 5000 deep": (lambda: submission(MANIFEST + "deep: " + "[" * 5000 + "]" * 5000), 400),
    "a YAML alias": (lambda: submission(MANIFEST + "a: &a [1]\nb: [*a, *a]\n"), 400),
    "YAML !!float abc": (lambda: submission(MANIFEST + "x: !!float abc\n"), 400),
    "YAML !!bool maybe": (lambda: submission(MANIFEST + "x: !!bool maybe\n"), 400),
    'YAML !!int ""': (lambda: submission(MANIFEST + 'x: !!int ""\n'), 400),
    "YAML hexadecimal of 3700 digits": (lambda: submission(MANIFEST + "x: 0x" + "f" * 3700 + "\n"), 400),
    "YAML \\U00110000": (lambda: submission(MANIFEST + 'x: "\\U00110000"\n'), 400),
    "YAML \\UFFFFFFFF": (lambda: submission(MANIFEST + 'x: "\\UFFFFFFFF"\n'), 400),
    "YAML with an ESC character": (lambda: submission(MANIFEST + "x: a\x1bb\n"), 400),
    "a multipart body without its boundary": (
        lambda: full["/api/token/"]["POST"].Case(body=b"abc", media_type="multipart/form-data",
                                                 headers={"Content-Type": "multipart/form-data"}), 400),
    "NUL in a path": (lambda: full["/api/bugs/{bug_id}/"]["GET"].Case(path_parameters={"bug_id": "\x00"}), 400),
    "NUL in a query": (lambda: full["/api/bugs/"]["GET"].Case(query={"q": "\x00"}), 400),
    "a run ID past any column": (
        lambda: full["/api/runs/{id}/"]["GET"].Case(path_parameters={"id": 99999999999999999999}), 404),
    "JSON nested 500 deep": (lambda: preview(nested(500)), 400),
    "NUL in a JSON body": (lambda: preview(["GH-\x00"]), 400),
    "a number past 64 bits in a JSON body": (lambda: preview([2**64]), 400),
}


@pytest.mark.parametrize("name", HOSTILE_CASES)
def test_requests_that_were_server_errors_are_client_errors(name, maintainer_token):
    make_case, status = HOSTILE_CASES[name]
    response = make_case().call_and_validate(headers={"Authorization": f"Token {maintainer_token}"},
                                             checks=[not_a_server_error])
    assert response.status_code == status, response.text
    assert isinstance(response.json(), dict), response.text  # DRF's or the middleware's JSON, not an HTML page
