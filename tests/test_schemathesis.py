"""Schemathesis drives every operation of our OpenAPI schema with generated requests, as an anonymous
caller and with a maintainer's token: no request may end in a server error (5xx).

The schema is the one the app serves (drf-spectacular's generator); requests go through the WSGI
application in-process, inside the test's transaction. Runs that a campaign or an approval would queue
are enqueued only when a transaction commits, which never happens here, so no operation is excluded
and no worker is needed.

The maintainer gets Schemathesis' coverage phase (boundary and wrongly typed values of every field,
unexpected methods) and fuzzing; the anonymous caller, whose writes are refused before any input is
read, gets fuzzing only. Derandomized, so CI sees the same requests every time.
"""
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from rest_framework.throttling import SimpleRateThrottle
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from accounts.actions import do_create_api_token
from runners.registry import detector_record

from .factories import BugFactory, MaintainerFactory, ReproducerFactory, ReproducerVersionFactory, RunFactory

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
    RunFactory(reproducer_version=version, detector=detector_record("plain"))
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
