"""Security guarantees of issue 6, one section each (docs/security.md lists them with their tests):

1. unapproved code never executes, by any path: web, API, admin, task replay, retry;
2. anonymous users and contributors cannot trigger runs or approve, on the site, the API or the admin;
3. CSRF is enforced on every state-changing form and on the session-authenticated API;
4. production settings: secure cookies, HSTS, HTTPS redirect, no built-in secret key, `check --deploy`;
5. upload limits hold before anything is stored;
6. a reproducer cannot read the secret key, database credentials or broker URL;
7. API throttling is on, and counts each client by an address no header can forge;
8. every page is served under a Content-Security-Policy that no template needs to weaken.
(Sign-in lock-outs: tests/test_accounts.py. Hostile text: tests/test_hostile_text.py. Schemathesis:
tests/test_schemathesis.py.)
"""
import json
import os
import re
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client, RequestFactory
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from accounts.actions import do_create_api_token
from accounts.models import ApiToken
from benchmark_site.security import client_ip
from bugs.models import Bug, ReproducerVersion
from core.enums import ReviewState
from runners import execution
from runners.actions.campaigns import do_create_campaign, do_retry_failed_runs
from runners.actions.detectors import do_record_detector
from runners.models import Campaign, Run, RunStatus
from runners.plans import CampaignPlan
from runners.tasks import execute_run
from runners.worker.local import database_url

from .factories import (
    GOOD_REPRODUCER,
    PROGRAM_PREAMBLE,
    BugFactory,
    CampaignFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)
from .helpers import BUG_FORM, FILES, uploads

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parent.parent


# --- 1. Unapproved code never executes -------------------------------------------------------------------

@pytest.fixture
def marker():
    """A word the reproducer below prints if it ever runs (a sealed run can leave nothing outside its
    directory, so its output is the proof)."""
    return f"ran-{uuid.uuid4().hex}"


def marking_code(marker):
    return f"print({marker!r})\n" + GOOD_REPRODUCER


def ran(marker):
    return Run.objects.filter(stdout__contains=marker).exists()


@pytest.fixture
def sandbox_calls(monkeypatch, settings, tmp_path):
    """Every program the runner starts, recorded (and still started); runs get a directory of their own."""
    settings.SILENTBENCH_RUN_DIR = tmp_path / "runs"
    calls = []
    real = execution.run_sandboxed

    def recording(argv, workdir, *args, **kwargs):
        calls.append((argv, workdir))
        return real(argv, workdir, *args, **kwargs)

    monkeypatch.setattr(execution, "run_sandboxed", recording)
    return calls


def assert_refused_and_nothing_ran(run, marker, sandbox_calls):
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "Refused" in run.failure_reason and "not approved" in run.failure_reason
    assert run.exit_code is None and run.stdout == "" and run.wall_seconds is None
    assert sandbox_calls == [], "a process was started"
    assert not ran(marker), "the unapproved reproducer ran"
    run_dir = Path(django_settings.SILENTBENCH_RUN_DIR)
    assert not run_dir.exists() or not any(run_dir.iterdir()), "a run directory was made"


def test_the_marker_proves_execution_when_the_version_is_approved(marker, sandbox_calls):
    """Positive control: the same reproducer, approved, runs and leaves its marker."""
    run = RunFactory(reproducer_version=ReproducerVersionFactory(files={"repro.py": marking_code(marker)}))
    execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.failure_reason
    assert marker in run.stdout and len(sandbox_calls) == 1


@pytest.mark.parametrize("state", [ReviewState.PENDING, ReviewState.REJECTED])
@pytest.mark.parametrize("replay", ["call", "apply"])
def test_task_replay_of_an_unapproved_version_is_refused(state, replay, marker, sandbox_calls):
    """A message replayed by hand (or forged in the broker) names a run whose version is not approved."""
    version = ReproducerVersionFactory(files={"repro.py": marking_code(marker)}, review_state=state)
    run = RunFactory(reproducer_version=version)
    if replay == "call":
        execute_run(run.pk)
    else:
        execute_run.apply(args=[run.pk])
    assert_refused_and_nothing_ran(run, marker, sandbox_calls)


def test_services_refuse_to_queue_unapproved_versions():
    pending = ReproducerVersionFactory(review_state=ReviewState.PENDING)
    with pytest.raises(Exception, match="Not approved"):
        do_create_campaign("operator", CampaignPlan.build([pending], [do_record_detector("plain")]), acting_user=None)
    assert not Run.objects.exists()


def test_retrying_a_run_of_an_unapproved_version_still_refuses_it(marker, sandbox_calls,
                                                                   django_capture_on_commit_callbacks):
    """Retry clears a failed run and queues it again; the approval is checked again when it executes."""
    version = ReproducerVersionFactory(files={"repro.py": marking_code(marker)}, review_state=ReviewState.PENDING)
    campaign = CampaignFactory(name="forged")
    run = RunFactory(reproducer_version=version, campaign=campaign, status=RunStatus.FAILED)
    response = token_client(MaintainerFactory()).post(f"/api/campaigns/{campaign.pk}/retry/")
    assert response.json() == {"runs": [run.pk]}
    execute_run(run.pk)
    assert_refused_and_nothing_ran(run, marker, sandbox_calls)


def test_a_retried_run_executes_the_exact_version_it_names(marker, sandbox_calls):
    """Versions are immutable and approval is per version: a newer, unreviewed version of the same
    reproducer changes nothing about the runs of the approved one, retried or not."""
    approved = ReproducerVersionFactory()
    campaign = do_create_campaign("c", CampaignPlan.build([approved], [do_record_detector("plain")], ["buggy"], [0]),
                                  enqueue=False, acting_user=None)
    Run.objects.filter(campaign=campaign).update(status=RunStatus.FAILED)
    newer = ReproducerVersionFactory(reproducer=approved.reproducer, files={"repro.py": marking_code(marker)},
                                     review_state=ReviewState.PENDING)
    [run_id] = do_retry_failed_runs(campaign, acting_user=None)
    execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED and run.reproducer_version_id == approved.pk
    assert not ran(marker) and newer.runs.count() == 0


@pytest.fixture
def pending_only():
    """A bug whose only reproducer version waits for review, and a bug with an approved version plus a
    newer pending one."""
    alone = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-PENDING")),
                                     review_state=ReviewState.PENDING, files={"repro.py": "pending = 1"})
    approved = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-MIXED")))
    newer = ReproducerVersionFactory(reproducer=approved.reproducer, review_state=ReviewState.PENDING,
                                     files={"repro.py": "newer = 1"})
    return alone, approved, newer


def test_the_campaign_builder_offers_and_queues_approved_versions_only(client, pending_only):
    alone, approved, newer = pending_only
    client.force_login(MaintainerFactory())
    page = client.get("/campaigns/new/").content.decode()
    assert "TEST-MIXED" in page and "TEST-PENDING" not in page
    form = {"name": "n", "bugs": ["TEST-PENDING"], "detectors": ["plain"], "variants": ["buggy"], "seeds": "0",
            "confirm": "1"}
    response = client.post("/campaigns/new/", form)
    assert "TEST-PENDING is not one of the available choices" in str(response.context["form"].errors["bugs"])
    preview = client.post("/campaigns/new/", {**form, "bugs": ["TEST-MIXED"], "confirm": ""}).content.decode()
    plan = re.search(r'name="plan" value="(\w+)"', preview)[1]
    client.post("/campaigns/new/", {**form, "bugs": ["TEST-MIXED"], "plan": plan})
    assert set(Run.objects.values_list("reproducer_version_id", flat=True)) == {approved.pk}


def test_the_api_creates_and_previews_campaigns_of_approved_versions_only(pending_only):
    alone, approved, newer = pending_only
    api = token_client(MaintainerFactory())
    body = {"name": "n", "bugs": ["TEST-PENDING"], "detectors": ["plain"]}
    for url in ("/api/campaigns/", "/api/campaigns/preview/"):
        response = api.post(url, body, format="json")
        assert response.status_code == 400 and "no approved CPU reproducer" in str(response.json())
    assert api.post("/api/campaigns/", {**body, "bugs": ["TEST-MIXED"]}, format="json").status_code == 201
    assert set(Run.objects.values_list("reproducer_version_id", flat=True)) == {approved.pk}


def test_submitting_queues_nothing(client, django_capture_on_commit_callbacks):
    """Through the form and the API: a submission is stored for review, and no run exists or is queued."""
    contributor = UserFactory()
    client.force_login(contributor)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post("/submit/", {**BUG_FORM, "files": uploads(FILES)}).status_code == 302
        assert token_client(contributor).post("/api/submissions/", {
            **BUG_FORM, "bug_id": "GH-4243", "files": uploads(FILES)}, format="multipart").status_code == 201
    assert ReproducerVersion.objects.filter(review_state=ReviewState.PENDING).count() == 2
    assert not Run.objects.exists() and not Campaign.objects.exists()


# --- the admin ---

ADMIN_ACTIONS = {"delete_selected", "revoke", "cancel", "retry_failed_runs",
                 "cleanup_expired_attempts",  # django-axes: forget sign-in failures past their cool-off
                 "hold_out", "publish"}  # the held-out split: do_hold_out_bug / do_publish_bug, maintainers only


def test_the_admin_offers_no_action_that_runs_or_approves():
    """A tripwire: every admin action is known, and the two that queue or cancel runs go through the
    services (tested below). Approval has no admin action: it happens on the review page."""
    actions = {name for model_admin in admin.site._registry.values()
               for _, name, _ in model_admin._get_base_actions()}
    assert actions <= ADMIN_ACTIONS, actions - ADMIN_ACTIONS


def staff(*permissions, maintainer=False):
    user = (MaintainerFactory if maintainer else UserFactory)(is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def test_the_admin_cannot_approve_add_versions_or_add_runs(client, pending_only):
    alone, approved, newer = pending_only
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    url = f"/admin/bugs/reproducerversion/{alone.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and 'name="review_state"' not in page.content.decode()
    client.post(url, {"review_state": "approved", "review_note": "ok", "files": "{}"})
    alone.refresh_from_db()
    assert alone.review_state == ReviewState.PENDING
    for add in ("/admin/bugs/reproducerversion/add/", "/admin/runners/run/add/", "/admin/runners/campaign/add/"):
        assert client.get(add).status_code == 403, add
    run = RunFactory(reproducer_version=alone, status=RunStatus.FAILED)
    client.post(f"/admin/runners/run/{run.pk}/change/", {"status": "queued"})
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED


def test_admin_campaign_actions_need_the_maintainer_permission(client, marker, sandbox_calls):
    version = ReproducerVersionFactory(files={"repro.py": marking_code(marker)}, review_state=ReviewState.PENDING)
    campaign = CampaignFactory(name="c")
    run = RunFactory(reproducer_version=version, campaign=campaign, status=RunStatus.FAILED)
    action = {"action": "retry_failed_runs", "_selected_action": [campaign.pk]}

    client.force_login(staff("view_campaign", "change_campaign"))  # staff, but not a maintainer
    assert "retry_failed_runs" not in client.get("/admin/runners/campaign/").content.decode()  # not offered
    response = client.post("/admin/runners/campaign/", action, follow=True)
    assert "Queued" not in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED

    client.force_login(staff("view_campaign", "change_campaign", maintainer=True))
    response = client.post("/admin/runners/campaign/", action, follow=True)
    assert "Queued 1 run(s) again" in response.content.decode()
    execute_run(run.pk)  # queued again, and still refused where it would execute
    assert_refused_and_nothing_ran(run, marker, sandbox_calls)


# --- 2. Anonymous users and contributors cannot trigger runs or approve ----------------------------------

def token_client(user=None):
    api = APIClient()
    if user is not None:
        api.credentials(HTTP_AUTHORIZATION=f"Token {do_create_api_token('security', acting_user=user)[1]}")
    return api


@pytest.fixture
def world():
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-ROLES")))
    pending = ReproducerVersionFactory(reproducer=version.reproducer, review_state=ReviewState.PENDING,
                                       files={"repro.py": "x = 1"})
    campaign = do_create_campaign("c",
                                  CampaignPlan.build([version], [do_record_detector("plain")], ["buggy", "fixed"],
                                                     [0]), enqueue=False, acting_user=None)
    queued, failed = campaign.runs.order_by("id")
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.FAILED)
    return {"pending": pending, "campaign": campaign}


def state(world):
    return (Campaign.objects.count(), sorted(Run.objects.values_list("id", "status")),
            ReproducerVersion.objects.get(pk=world["pending"].pk).review_state)


@pytest.mark.parametrize("role", ["anonymous", "contributor"])
def test_web_views_refuse_to_trigger_or_approve(role, client, world):
    if role == "contributor":
        client.force_login(UserFactory())
    before = state(world)
    campaign, pending = world["campaign"].pk, world["pending"].pk
    requests = [("get", "/campaigns/new/", {}), ("get", "/review/", {}), ("get", f"/review/{pending}/", {}),
                ("post", "/campaigns/new/", {"name": "x", "bugs": ["TEST-ROLES"], "detectors": ["plain"],
                                             "variants": ["buggy"], "seeds": "0", "confirm": "1"}),
                ("post", f"/campaigns/{campaign}/cancel/", {}), ("post", f"/campaigns/{campaign}/retry/", {}),
                ("post", f"/review/{pending}/", {"decision": "approve", "note": ""})]
    for method, url, data in requests:
        response = getattr(client, method)(url, data)
        if role == "anonymous":
            assert response.status_code in (302, 403), url
            assert response.status_code == 403 or response["Location"].startswith("/accounts/login/"), url
        else:
            assert response.status_code == 403, url
    assert state(world) == before


@pytest.mark.parametrize("role", ["anonymous", "contributor"])
def test_api_refuses_to_trigger_or_approve(role, world):
    api = token_client(UserFactory() if role == "contributor" else None)
    before = state(world)
    campaign, pending = world["campaign"].pk, world["pending"].pk
    body = {"name": "x", "bugs": ["TEST-ROLES"], "detectors": ["plain"]}
    for url, data in [("/api/campaigns/", body), ("/api/campaigns/preview/", body),
                      (f"/api/campaigns/{campaign}/cancel/", {}), (f"/api/campaigns/{campaign}/retry/", {}),
                      (f"/api/reproducer-versions/{pending}/review/", {"decision": "approve"})]:
        response = api.post(url, data, format="json")
        assert response.status_code == (401 if role == "anonymous" else 403), (url, response.json())
    assert state(world) == before


def test_the_admin_is_closed_to_contributors_and_to_staff_without_maintainer_rights(client, world):
    client.force_login(UserFactory())
    assert client.get("/admin/").status_code == 302  # to the admin's own login
    assert client.get(f"/admin/runners/campaign/{world['campaign'].pk}/change/").status_code == 302
    before = state(world)
    client.force_login(staff("view_campaign", "change_campaign", "view_reproducerversion",
                             "change_reproducerversion"))
    client.post("/admin/runners/campaign/", {"action": "cancel", "_selected_action": [world["campaign"].pk]})
    client.post(f"/admin/bugs/reproducerversion/{world['pending'].pk}/change/", {"review_state": "approved"})
    assert state(world) == before


# --- 3. CSRF ---------------------------------------------------------------------------------------------

def csrf_cases(maintainer, contributor):
    """(url, form, who) of every state-changing web form."""
    bug = BugFactory(bug_id="TEST-CSRF", submitted_by=contributor)
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug))
    pending = ReproducerVersionFactory(reproducer=version.reproducer, review_state=ReviewState.PENDING,
                                       files={"repro.py": "y = 2"})
    campaign = do_create_campaign("c", CampaignPlan.build([version], [do_record_detector("plain")], ["buggy"], [0]),
                                  enqueue=False, acting_user=None)
    token, _ = do_create_api_token("t", acting_user=contributor)
    return [
        ("/submit/", {"bug_id": "TEST-CSRF2", "title": "t"}, contributor),
        ("/bugs/TEST-CSRF/submit/", {"reproducer_name": "cpu"}, contributor),
        (f"/review/{pending.pk}/", {"decision": "reject", "note": "no"}, maintainer),
        ("/bugs/TEST-CSRF/held-out/", {"held_out": "true"}, maintainer),
        ("/campaigns/new/", {"name": "n", "bugs": ["TEST-CSRF"], "detectors": ["plain"], "variants": ["buggy"],
                             "seeds": "0", "preview": "1"}, maintainer),
        (f"/campaigns/{campaign.pk}/cancel/", {}, maintainer),
        (f"/campaigns/{campaign.pk}/retry/", {}, maintainer),
        ("/account/tokens/", {"name": "new"}, contributor),
        (f"/account/tokens/{token.pk}/revoke/", {}, contributor),
        ("/accounts/logout/", {}, contributor),
        ("/accounts/login/", {"username": "x", "password": "y"}, None),
        ("/accounts/signup/", {"username": "newcomer"}, None),
    ]


def test_every_state_changing_form_needs_the_csrf_token():
    maintainer, contributor = MaintainerFactory(), UserFactory()
    for url, form, user in csrf_cases(maintainer, contributor):
        browser = Client(enforce_csrf_checks=True)
        if user is not None:
            browser.force_login(user)
        refused = browser.post(url, form)
        assert refused.status_code == 403 and b"CSRF" in refused.content, url
        browser.get("/accounts/login/")  # sets the CSRF cookie, as any page with a form does
        accepted = browser.post(url, {**form, "csrfmiddlewaretoken": browser.cookies["csrftoken"].value})
        assert accepted.status_code != 403, url  # the same request with its token gets through
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 1


def test_the_api_enforces_csrf_with_a_session_but_not_with_a_token():
    maintainer = MaintainerFactory()
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-CSRF-API")))
    body = {"name": "n", "bugs": ["TEST-CSRF-API"], "detectors": ["plain"]}
    session = APIClient(enforce_csrf_checks=True)
    session.force_login(maintainer)
    refused = session.post("/api/campaigns/preview/", body, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    session.get("/accounts/login/")
    accepted = session.post("/api/campaigns/preview/", body, format="json",
                            HTTP_X_CSRFTOKEN=session.cookies["csrftoken"].value)
    assert accepted.status_code == 200
    api = APIClient(enforce_csrf_checks=True)
    api.credentials(HTTP_AUTHORIZATION=f"Token {do_create_api_token('t', acting_user=maintainer)[1]}")
    assert api.post("/api/campaigns/preview/", body, format="json").status_code == 200


# --- 4. Production settings ------------------------------------------------------------------------------

PROBE_SETTINGS = """
import json, django
from django.conf import settings
from django.test import Client
django.setup()
from rest_framework.settings import api_settings
client = Client()
plain = client.get("/accounts/login/", HTTP_HOST="bench.example.org")
secure = client.get("/accounts/login/", HTTP_HOST="bench.example.org", HTTP_X_FORWARDED_PROTO="https")
health = client.get("/healthz", HTTP_HOST="bench.example.org")
csrf = secure.cookies.get("csrftoken")
print(json.dumps({
    "settings": {name: getattr(settings, name) for name in (
        "DEBUG", "PRODUCTION", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY",
        "SECURE_HSTS_SECONDS", "SECURE_SSL_REDIRECT", "SECURE_PROXY_SSL_HEADER", "SECURE_CONTENT_TYPE_NOSNIFF",
        "X_FRAME_OPTIONS", "SILENTBENCH_MAX_REQUEST_BYTES", "FILE_UPLOAD_MAX_MEMORY_SIZE",
        "SILENTBENCH_NUM_PROXIES")},
    "throttles": [c.__name__ for c in api_settings.DEFAULT_THROTTLE_CLASSES],
    "rates": api_settings.DEFAULT_THROTTLE_RATES,
    "plain": [plain.status_code, plain.get("Location")],
    "health": health.status_code,
    "headers": {name: secure.get(name) for name in (
        "Strict-Transport-Security", "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy",
        "Content-Security-Policy")},
    "csrf_cookie_secure": bool(csrf and csrf["secure"]),
}))
"""


def django_env(tmp_path, **env):
    """The environment of a fresh process: ours, less anything that would decide the mode for it."""
    decisive = ("DJANGO_", "SILENTBENCH_ANON_RATE", "SILENTBENCH_USER_RATE")
    base = {name: value for name, value in os.environ.items() if not name.startswith(decisive)}
    return {**base, "DJANGO_SETTINGS_MODULE": "benchmark_site.settings", "SILENTBENCH_VAR_DIR": str(tmp_path),
            "DATABASE_URL": f"sqlite:///{tmp_path}/unused.sqlite3", **env}


def run_python(args, env):
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


PRODUCTION_ENV = {"DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "DJANGO_ALLOWED_HOSTS": "bench.example.org",
                  "SILENTBENCH_ANON_RATE": "7/min", "SILENTBENCH_USER_RATE": "70/min"}


def test_production_settings_are_secure(tmp_path):
    """A DJANGO_SECRET_KEY (or DJANGO_ENV=production) means production: HTTPS only behind the proxy's
    X-Forwarded-Proto, secure and HTTP-only cookies, HSTS, no framing, no sniffing; /healthz stays on HTTP."""
    result = run_python(["-c", PROBE_SETTINGS], django_env(tmp_path, **PRODUCTION_ENV))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["settings"] == {
        "DEBUG": False, "PRODUCTION": True, "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True,
        "SESSION_COOKIE_HTTPONLY": True, "SECURE_HSTS_SECONDS": 365 * 24 * 3600, "SECURE_SSL_REDIRECT": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"], "SECURE_CONTENT_TYPE_NOSNIFF": True,
        "X_FRAME_OPTIONS": "DENY", "SILENTBENCH_MAX_REQUEST_BYTES": 2 * 1024 * 1024,
        "FILE_UPLOAD_MAX_MEMORY_SIZE": 2 * 1024 * 1024, "SILENTBENCH_NUM_PROXIES": 1}  # the proxy of X-Forwarded-Proto
    assert seen["plain"] == [301, "https://bench.example.org/accounts/login/"]
    assert seen["health"] != 301
    csp = seen["headers"].pop("Content-Security-Policy")
    assert seen["headers"] == {"Strict-Transport-Security": "max-age=31536000", "X-Frame-Options": "DENY",
                               "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert seen["csrf_cookie_secure"]
    assert seen["throttles"] == ["AnonRateThrottle", "UserRateThrottle", "ScopedRateThrottle"]
    assert seen["rates"] == {"anon": "7/min", "user": "70/min", "token": "10/min"}  # from the environment


def test_the_local_default_needs_no_secret_and_is_not_production(tmp_path):
    """bin/quickstart and the tests: no DJANGO_SECRET_KEY, plain HTTP on loopback."""
    result = run_python(["-c", PROBE_SETTINGS.replace("bench.example.org", "localhost")], django_env(tmp_path))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["settings"]["PRODUCTION"] is False and seen["settings"]["SESSION_COOKIE_SECURE"] is False
    assert seen["settings"]["SILENTBENCH_NUM_PROXIES"] == 0  # no proxy: X-Forwarded-For is ignored
    assert seen["plain"][0] == 200


@pytest.mark.parametrize("env", [
    {"DJANGO_ENV": "production"},
    {"DJANGO_ENV": "production", "DJANGO_SECRET_KEY": "silentbench-local-development-key-not-for-production"},
    {"DJANGO_ENV": "staging"},
], ids=["no-key", "built-in-key", "unknown-env"])
def test_production_refuses_to_start_with_the_built_in_secret_key(env, tmp_path):
    result = run_python(["manage.py", "check"], django_env(tmp_path, **env))
    assert result.returncode != 0 and "ImproperlyConfigured" in result.stderr


def test_check_deploy_has_only_the_documented_hsts_opt_ins(tmp_path):
    """`manage.py check --deploy` in production: no warning but W005/W021 (HSTS for every subdomain, and
    browsers' preload list), which bind the whole domain and are the operator's opt-in (docs/security.md);
    with both opted in, none at all."""
    deploy = run_python(["manage.py", "check", "--deploy"], django_env(tmp_path, **PRODUCTION_ENV))
    assert deploy.returncode == 0, deploy.stderr
    assert set(re.findall(r"\(security\.(W\d+)\)", deploy.stderr + deploy.stdout)) == {"W005", "W021"}
    opted_in = run_python(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], django_env(
        tmp_path, **PRODUCTION_ENV, DJANGO_HSTS_INCLUDE_SUBDOMAINS="true", DJANGO_HSTS_PRELOAD="true"))
    assert opted_in.returncode == 0, opted_in.stderr
    assert "no issues" in opted_in.stdout


def test_check_deploy_warns_when_a_trusted_proxy_would_be_every_client(tmp_path):
    """X-Forwarded-Proto trusted (a proxy in front) with SILENTBENCH_NUM_PROXIES=0: every client would have the
    proxy's address, and anyone could lock every sign-in out; without a trusted proxy, 0 is right."""
    warned = run_python(["manage.py", "check", "--deploy"], django_env(
        tmp_path, **PRODUCTION_ENV, SILENTBENCH_NUM_PROXIES="0"))
    assert warned.returncode == 0, warned.stderr
    assert "(accounts.W001) SECURE_PROXY_SSL_HEADER trusts a proxy's X-Forwarded-Proto, but SILENTBENCH_NUM_PROXIES " \
           "is 0" in warned.stderr
    assert "SILENTBENCH_NUM_PROXIES to the number of proxies" in warned.stderr  # the hint
    for plain in ({"DJANGO_HTTPS": "false"}, {"DJANGO_TRUST_X_FORWARDED_PROTO": "false"}):
        quiet = run_python(["manage.py", "check", "--deploy"], django_env(
            tmp_path, **PRODUCTION_ENV, SILENTBENCH_NUM_PROXIES="0", **plain))
        assert quiet.returncode == 0 and "accounts.W00" not in quiet.stderr, quiet.stderr
        # the opposite mistake: a proxy count with no proxy (compose's 1, with DJANGO_HTTPS=false)
        spoofable = run_python(["manage.py", "check", "--deploy"], django_env(
            tmp_path, **PRODUCTION_ENV, SILENTBENCH_NUM_PROXIES="1", **plain))
        assert spoofable.returncode == 0 and "(accounts.W002) SILENTBENCH_NUM_PROXIES is 1 but no proxy" \
            in spoofable.stderr, spoofable.stderr


# --- 5. Upload limits ------------------------------------------------------------------------------------

def test_a_too_large_upload_is_refused_before_anything_is_stored(client, settings):
    settings.SILENTBENCH_MAX_REQUEST_BYTES = 64 * 1024
    contributor = UserFactory()
    big = {**FILES, "repro.py": FILES["repro.py"] + "# padding\n" * 10_000}  # 100 KB
    api = token_client(contributor).post("/api/submissions/", {**BUG_FORM, "files": uploads(big)},
                                         format="multipart")
    assert api.status_code == 413 and "Request too large" in api.json()["detail"]
    client.force_login(contributor)
    page = client.post("/submit/", {**BUG_FORM, "files": uploads(big)})
    assert page.status_code == 413 and b"the limit is 65536 bytes" in page.content
    assert not Bug.objects.exists() and not ReproducerVersion.objects.exists()
    assert client.post("/submit/", {**BUG_FORM, "files": uploads(FILES)}).status_code == 302  # within the cap


def test_uploads_within_the_request_cap_stay_in_memory():
    """Nothing of an upload touches the disk: the request cap is within the in-memory upload size."""
    assert django_settings.FILE_UPLOAD_MAX_MEMORY_SIZE >= django_settings.SILENTBENCH_MAX_REQUEST_BYTES
    assert django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE <= django_settings.SILENTBENCH_MAX_REQUEST_BYTES
    assert django_settings.SILENTBENCH_MAX_REQUEST_BYTES > django_settings.SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES


# --- 6. A reproducer cannot read the worker's secrets ----------------------------------------------------

SNOOPER = PROGRAM_PREAMBLE + """
import glob
SECRETS = {secrets!r}
NAMES = ("DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL")

def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as error:
        return None

sources = {{"os.environ": "\\n".join(f"{{k}}={{v}}" for k, v in os.environ.items()),
            "/proc/self/environ": read("/proc/self/environ")}}
worker = read(f"/proc/{{os.getppid()}}/environ")
try:
    open(f"/proc/{{os.getppid()}}/mem", "rb").close()
    worker_memory = True
except OSError:
    worker_memory = False
for path in glob.glob("/proc/[0-9]*/environ"):
    sources[path] = read(path)
found = sorted({{f"{{secret}} in {{where}}" for where, text in sources.items() if text
                for secret in SECRETS if secret in text}})
report(event="oracle", manifested=False, trigger_step=None, summary="snooped", evidence={{
    "found": found, "names": sorted(name for name in NAMES if name in os.environ),
    "worker_environ_readable": worker is not None, "worker_memory_readable": worker_memory, "uid": os.getuid(),
    "readable": sorted(p for p, text in sources.items() if text is not None and p.startswith("/proc/") and
                       p != "/proc/self/environ")}})
"""

WORKER = """
import sys, django
django.setup()
from runners.tasks import execute_run
execute_run(int(sys.argv[1]))
"""


@pytest.mark.django_db(transaction=True)
def test_a_reproducer_cannot_read_the_workers_secrets(tmp_path):
    """A real worker process, with a secret key, a database URL and a broker password in its environment,
    executes a hostile reproducer through the sandbox. The reproducer looks for them in its own
    environment, /proc/self/environ, its worker's /proc/<pid>/environ and every /proc/*/environ it
    can open: it finds none, and it cannot open the worker's memory.

    What keeps them out (runners/executor/): the run's environment is built from nothing; the worker
    is non-dumpable and wipes secret values from the block /proc/<pid>/environ shows; a reproducer
    running as another user (a root worker's ``nobody``) cannot open that file at all, and one running
    as root has no CAP_SYS_PTRACE, so no access to the worker's memory."""
    secret_key, broker_password = secrets.token_hex(24), secrets.token_hex(12)
    db_url = database_url(connection.settings_dict)
    worker_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmark_site.settings", "DJANGO_ENV": "production",
                  "DJANGO_SECRET_KEY": secret_key, "DATABASE_URL": db_url,
                  "CELERY_BROKER_URL": f"redis://:{broker_password}@127.0.0.1:9/0",
                  "SILENTBENCH_VAR_DIR": str(django_settings.VAR_DIR)}
    looked_for = [secret_key, broker_password, db_url]
    if connection.settings_dict.get("PASSWORD"):
        looked_for.append(connection.settings_dict["PASSWORD"])
    version = ReproducerVersionFactory(files={"repro.py": SNOOPER.format(secrets=looked_for)})
    run = RunFactory(reproducer_version=version)

    worker = run_python(["-c", WORKER, str(run.pk)], worker_env)
    assert worker.returncode == 0, worker.stderr[-3000:]
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, (run.failure_reason, run.stderr)
    evidence = run.oracle_evidence
    assert evidence["names"] == [] and evidence["found"] == [], evidence
    assert evidence["worker_memory_readable"] is False, evidence
    if evidence["uid"] != os.geteuid():  # the sandbox switched users: the worker's /proc entries are closed
        assert evidence["worker_environ_readable"] is False, evidence
    for secret in looked_for:
        assert secret not in run.stdout + run.stderr + json.dumps(evidence)


# --- 7. API throttling -----------------------------------------------------------------------------------

def test_api_throttling_answers_429_past_the_rate(monkeypatch):
    """Anonymous callers are counted by address, users (session or token) by account."""
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"anon": "3/min", "user": "5/min", "token": "1/min"})
    anonymous = APIClient()
    assert [anonymous.get("/api/bugs/").status_code for _ in range(4)] == [200, 200, 200, 429]
    refused = anonymous.get("/api/detectors/")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "throttled" in refused.json()["detail"].lower()
    alice, bob = token_client(UserFactory()), token_client(UserFactory())
    assert [alice.get("/api/bugs/").status_code for _ in range(6)] == [200] * 5 + [429]
    assert bob.get("/api/bugs/").status_code == 200  # each user has a bucket of their own


def test_a_new_x_forwarded_for_per_request_is_still_the_same_client(monkeypatch):
    """No proxy is trusted by default (SILENTBENCH_NUM_PROXIES=0): the header anyone can send is ignored,
    by the anonymous rate and by the password checks of /api/token/ alike."""
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"anon": "3/min", "user": None, "token": "2/min"})
    anonymous = APIClient()
    assert [anonymous.get("/api/bugs/", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}").status_code
            for n in range(4)] == [200, 200, 200, 429]
    guesses = [APIClient().post("/api/token/", {"username": f"guess{n}", "password": "x"}, REMOTE_ADDR="192.0.2.9",
                                HTTP_X_FORWARDED_FOR=f"203.0.113.{n}").status_code for n in range(3)]
    assert guesses == [400, 400, 429]


def test_behind_a_trusted_proxy_the_client_is_the_address_it_saw(monkeypatch, settings):
    """With one proxy, the last X-Forwarded-For entry (the one the proxy appended) is the client: what a
    client puts in front of it changes nothing, and clients behind the same proxy are apart; the password
    checks of /api/token/ count the same address."""
    settings.SILENTBENCH_NUM_PROXIES = 1
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"anon": "2/min", "user": None, "token": "1/min"})
    proxy = {"REMOTE_ADDR": "10.0.0.2"}
    spoofing = [APIClient().get("/api/bugs/", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}, 198.51.100.7", **proxy).status_code
                for n in range(3)]
    assert spoofing == [200, 200, 429]
    assert APIClient().get("/api/bugs/", HTTP_X_FORWARDED_FOR="198.51.100.8", **proxy).status_code == 200
    guesses = [APIClient().post("/api/token/", {"username": "x", "password": "x"}, **proxy,
                                HTTP_X_FORWARDED_FOR=f"203.0.113.{n}, 198.51.100.9").status_code for n in range(2)]
    assert guesses == [400, 429]
    assert APIClient().post("/api/token/", {"username": "x", "password": "x"}, **proxy,
                            HTTP_X_FORWARDED_FOR="198.51.100.10").status_code == 400
    request = RequestFactory().get("/", HTTP_X_FORWARDED_FOR="203.0.113.1, 198.51.100.7", **proxy)
    assert client_ip(request) == "198.51.100.7"


PROXY = "10.0.0.2"


@pytest.mark.parametrize(("proxies", "forwarded", "client"), [
    (0, "203.0.113.1", PROXY),  # no proxy trusted: the header is ignored
    (1, None, PROXY),
    (1, "203.0.113.1, 198.51.100.7", "198.51.100.7"),
    (2, "203.0.113.1, 198.51.100.7, 10.0.0.1", "198.51.100.7"),
    (2, "198.51.100.7", "198.51.100.7"),  # fewer entries than proxies: the first, which a proxy appended
    (1, "not-an-address", PROXY),  # not written by a proxy
    (3, "not-an-address, 198.51.100.7", PROXY),  # more proxies than the chain: the client's own entry...
    (3, "203.0.113.66, 198.51.100.7", "203.0.113.66"),  # ...which, when it is an address, the client chose
    (1, " 2001:DB8::1 ", "2001:db8::1"),
])
def test_the_throttles_and_the_lock_outs_count_the_same_address(settings, proxies, forwarded, client):
    """client_ip is django-axes' address and every API throttle's (DRF's own get_ident would key the anonymous
    and token rates by an entry that is not an address, which a client can change at every request)."""
    from rest_framework.settings import api_settings

    from accounts.api import ObtainApiTokenView

    settings.SILENTBENCH_NUM_PROXIES = proxies
    headers = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    request = RequestFactory().get("/", REMOTE_ADDR=PROXY, **headers)
    assert client_ip(request) == client
    assert django_settings.AXES_CLIENT_IP_CALLABLE == "benchmark_site.security.client_ip"
    throttles = [throttle() for throttle in api_settings.DEFAULT_THROTTLE_CLASSES]
    assert {throttle.get_ident(request) for throttle in throttles + ObtainApiTokenView().get_throttles()} == {client}


def test_an_anonymous_caller_never_counts_against_an_account(monkeypatch):
    """Two scopes, two identities: an anonymous caller whose address reads as a user's id (possible while
    any header could set it) does not spend that user's requests."""
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"anon": "100/min", "user": "2/min", "token": None})
    alice = UserFactory()
    impostor = APIClient(REMOTE_ADDR=str(alice.pk))
    assert [impostor.get("/api/bugs/").status_code for _ in range(3)] == [200, 200, 200]
    assert [token_client(alice).get("/api/bugs/").status_code for _ in range(3)] == [200, 200, 429]


SHARED_COUNT_PROBE = """
import django, json
django.setup()
from django.test import Client
print(json.dumps([Client(REMOTE_ADDR="{address}").get("/api/").status_code for _ in range(2)]))
"""


@pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL", "").startswith("redis://"),
                    reason="needs the Redis of bin/test's second pass")
def test_throttle_counts_are_shared_between_processes_through_redis(tmp_path):
    """Two web processes with DJANGO_CACHE_URL on Redis count one client's requests together."""
    address = f"192.0.2.{secrets.randbelow(250) + 1}"
    env = django_env(tmp_path, DJANGO_CACHE_URL=os.environ["CELERY_BROKER_URL"], SILENTBENCH_ANON_RATE="3/min")
    probe = SHARED_COUNT_PROBE.replace("{address}", address)
    first, second = (run_python(["-c", probe], env) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout.splitlines()[-1]) + json.loads(second.stdout.splitlines()[-1]) == [
        200, 200, 200, 429]


# --- 8. Content-Security-Policy --------------------------------------------------------------------------

INLINE = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|<style(?![^>]*\bnonce=)[^>]*>|\sstyle=|\son[a-z]+=|javascript:",
                    re.IGNORECASE)


def test_no_template_needs_inline_script_or_style():
    """A tripwire: scripts come from static files, style sheets too or carry the request's nonce; no inline
    event handler or style attribute (the policy would block them, and the browser tests would see it)."""
    found = [f"{path.relative_to(REPO)}: {match[0]}" for path in (REPO / "templates").rglob("*.html")
             for match in INLINE.finditer(path.read_text())]
    assert found == []


def test_pages_carry_the_policy_and_inline_styles_its_nonce(client):
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-CSP")))
    page = client.get(f"/bugs/{version.reproducer.bug.bug_id}/")
    policy = dict(directive.strip().split(" ", 1) for directive in page["Content-Security-Policy"].split(";"))
    assert policy["default-src"] == "'self'" and policy["script-src"] == "'self'"
    assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    nonce = re.search(r"'nonce-([^']+)'", policy["style-src"])[1]
    assert f'<style nonce="{nonce}">' in page.content.decode()
    assert "Content-Security-Policy" in client.get("/api/docs/")
