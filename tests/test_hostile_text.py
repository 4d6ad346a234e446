"""Every text field is hostile: a script tag in a title, a reproducer, an error log, an alarm, a campaign
name, an environment or a user name is shown as text on every page, and stays inert in every export."""
import pytest
from django.utils import timezone

from bugs.actions import do_submit_reproducer
from bugs.models import BugStatus
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.plans import CampaignPlan

from .factories import (
    GOOD_REPRODUCER,
    AlarmFactory,
    BugFactory,
    EnvironmentFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    StabilityCheckFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert('pwned')</script>"
IMAGE = '"><img src=x onerror=alert(1)>'
HOSTILE = SCRIPT + IMAGE
ESCAPED = "&lt;script&gt;alert("
FORMULA = "=HYPERLINK(\"http://evil\")"


@pytest.fixture
def hostile_world():
    """A bug, a submitted version, runs with logs and alarms, a campaign and an environment, all hostile."""
    submitter = UserFactory(username="mallory")
    bug = BugFactory(bug_id="TEST-EVIL", title=HOSTILE, symptom=HOSTILE, root_cause=HOSTILE, fix=HOSTILE,
                     root_cause_category=HOSTILE, framework_versions=HOSTILE, submitted_by=submitter)
    code = GOOD_REPRODUCER + f"\n# {HOSTILE}\nprint('</script><script>alert(2)</script>')\n"
    approved = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug, strategy_note=HOSTILE,
                                                                     oracle_check=HOSTILE, fidelity_note=HOSTILE),
                                        files={"repro.py": code})
    pending = do_submit_reproducer({"repro.py": code + "\n", "reproducer.yaml": (
        "entrypoint: repro.py\nstrategy: injected\ndefault_steps: 3\nneeds: {}\noracle: {symptom: loss, check: x}\n"
        "fidelity_note: x\n")}, bug=bug, acting_user=submitter)
    environment = EnvironmentFactory(fingerprint="evil", host=HOSTILE, cpu=HOSTILE, gpu=HOSTILE, python="3.11",
                                     torch=HOSTILE, facts={"note": HOSTILE})
    campaign = do_create_campaign(HOSTILE,
                                  CampaignPlan.build([approved], [do_record_detector("param_not_updated")],
                                                     ["buggy", "fixed"], [0]), enqueue=False, acting_user=None)
    runs = []
    for run in campaign.runs.all():
        RunFactory._meta.model.objects.filter(pk=run.pk).update(
            status="failed" if run.variant == "fixed" else "succeeded", failure_reason=HOSTILE, stdout=HOSTILE,
            stderr=HOSTILE, oracle_summary=HOSTILE, manifested=run.variant == "buggy", trigger_step=1,
            environment=environment, finished_at=timezone.now(), wall_seconds=1.0,
            step_records=[{"step": s, "rank": 0, "loss": 1.0, "time": 1.0 + s, "metrics": {}} for s in range(3)])
        AlarmFactory(run=run, step=2, rule=HOSTILE + FORMULA, message=HOSTILE, evidence={"x": HOSTILE})
        runs.append(run)
    StabilityCheckFactory(reproducer_version=approved, campaign=campaign, environment=environment, seeds=1,
                          buggy_manifested=1, fixed_manifested=0, verdict="verified")
    bug.status = BugStatus.VERIFIED
    bug.save()
    return {"bug": bug, "pending": pending, "campaign": campaign, "runs": runs, "environment": environment,
            "submitter": submitter}


def pages(world):
    campaign, run = world["campaign"], world["runs"][0]
    return [
        "/", "/catalog/", "/catalog/?q=TEST", "/bugs/TEST-EVIL/", f"/runs/{run.pk}/", f"/runs/{world['runs'][1].pk}/",
        "/campaigns/",
        f"/campaigns/{campaign.pk}/", f"/campaigns/{campaign.pk}/live/",
        f"/campaigns/{campaign.pk}/live/?status=failed",
        f"/results/?campaign={campaign.pk}", f"/results/compare/?a=campaign:{campaign.pk}&b=environment:"
        f"{world['environment'].pk}", "/review/", f"/review/{world['pending'].pk}/", "/submissions/mine/",
        "/account/", "/account/tokens/", "/campaigns/new/",
    ]


def test_every_page_shows_hostile_text_as_text(client, hostile_world):
    maintainer = MaintainerFactory(username=HOSTILE[:150])
    for user in (hostile_world["submitter"], maintainer):
        client.force_login(user)
        for url in pages(hostile_world):
            response = client.get(url)
            if response.status_code == 403:  # a contributor on a maintainer's page
                continue
            assert response.status_code == 200, url
            body = response.content.decode()
            assert SCRIPT not in body and "<img src=x" not in body, url
            assert "alert(2)</script>" not in body, url
    client.force_login(maintainer)
    assert ESCAPED in client.get("/bugs/TEST-EVIL/").content.decode()
    assert ESCAPED in client.get(f"/runs/{hostile_world['runs'][0].pk}/").content.decode()


def test_charts_carry_hostile_text_inside_json_script_only(client, hostile_world):
    body = client.get(f"/runs/{hostile_world['runs'][0].pk}/").content.decode()
    # plotly reads a few tags in labels, so they are entity-escaped, and json_script escapes "&" and "<" again
    assert 'type="application/json"' in body and "\\u0026lt;script\\u0026gt;" in body


LATEX = r"\input{/etc/passwd} & 100% $x$ #1"


def test_the_catalog_table_escapes_latex(client):
    BugFactory(bug_id="TEST-LATEX", title=LATEX)
    tex = client.get("/catalog.tex").content.decode()
    assert "\\input{" not in tex
    assert r"\textbackslash input\{/etc/passwd\} \& 100\% \$x\$ \#1" in tex


def test_csv_exports_defuse_spreadsheet_formulas(client):
    BugFactory(bug_id="TEST-FORMULA", title=FORMULA)
    csv = client.get("/catalog.csv").content.decode()
    assert "'=HYPERLINK" in csv and ",=HYPERLINK" not in csv


def test_the_admin_the_browsable_api_and_error_pages_show_hostile_text_as_text(client, hostile_world):
    """The pages the site's templates do not draw: Django's admin, DRF's browsable API, the 404 page."""
    run = hostile_world["runs"][0]
    client.force_login(UserFactory(username=HOSTILE[:150], is_staff=True, is_superuser=True))
    urls = [
        "/admin/bugs/bug/", f"/admin/bugs/bug/{hostile_world['bug'].pk}/change/",
        "/admin/bugs/reproducerversion/", f"/admin/bugs/reproducerversion/{hostile_world['pending'].pk}/change/",
        "/admin/runners/run/", f"/admin/runners/run/{run.pk}/change/",
        "/admin/runners/campaign/", f"/admin/runners/campaign/{hostile_world['campaign'].pk}/change/",
        f"/admin/runners/environment/{hostile_world['environment'].pk}/change/", "/admin/auth/user/",
        "/api/bugs/", "/api/bugs/TEST-EVIL/", "/api/runs/", f"/api/runs/{run.pk}/", "/api/alarms/",
        "/api/campaigns/", "/api/submissions/",
    ]
    for url in urls:
        response = client.get(url, HTTP_ACCEPT="text/html")
        assert response.status_code == 200 and response["Content-Type"].startswith("text/html"), url
        body = response.content.decode()
        assert SCRIPT not in body and "<img src=x" not in body and "alert(2)</script>" not in body, url
        assert ESCAPED in body or "\\u003Cscript\\u003E" in body or "\\u003cscript\\u003e" in body, url
    missing = client.get("/bugs/%3Cscript%3Ealert(1)%3C/script%3E/")
    assert missing.status_code == 404 and b"<script>alert(1)" not in missing.content
