"""Who sees and does what, endpoint by endpoint and role by role (docs/accounts.md, "Who sees what").

Every URL the site resolves, the API's routes included, must be classified in ``CASES`` (or in
``NOT_ABOUT_THE_CATALOG`` with a reason): ``test_every_endpoint_is_classified`` fails for a new one. Each
case is requested by each role against one catalog holding hidden submissions (a bug waiting for its first
approval; versions pending and rejected, one of them a new reproducer of a public bug; a run, an alarm, a
campaign and a stored result row made from hidden code, as they would be were code hidden after it ran).
The status must be the one in the table, a response that the role may not see hidden things in must not
contain any of them, and a refused request must change nothing."""
from dataclasses import dataclass, field

import pytest
from django.test import Client
from django.urls import get_resolver, reverse

from accounts.actions import do_create_api_token
from accounts.models import ApiToken
from bugs.models import Bug, BugStatus, Reproducer, ReproducerVersion
from core.enums import ReviewState
from evaluation.models import Bisection
from runners.models import Campaign, DetectorVersion, Run

from .factories import (
    GOOD_REPRODUCER,
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EvaluationFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)
from .helpers import url_names

pytestmark = pytest.mark.django_db

SECRET = "UNREVIEWED-7f3a"  # in every hidden object's text
HIDDEN_BUG = "HIDDEN-1"
ROLES = ["anonymous", "submitter", "other", "maintainer", "staff"]
SEES_HIDDEN = {"submitter", "maintainer"}  # every hidden object below is the submitter's


@dataclass
class World:
    users: dict
    ids: dict = field(default_factory=dict)
    markers: list = field(default_factory=list)


def hidden_code(tag):
    return {"repro.py": f"{GOOD_REPRODUCER}# {SECRET} {tag}\n"}


def build_world():
    submitter = UserFactory()
    users = {"anonymous": None, "submitter": submitter, "other": UserFactory(), "maintainer": MaintainerFactory(),
             "staff": UserFactory(is_staff=True)}
    world = World(users)
    public_bug = BugFactory(bug_id="TEST-PUBLIC", submitted_by=submitter)
    cpu = ReproducerFactory(bug=public_bug)
    public_version = ReproducerVersionFactory(reproducer=cpu)
    pending = ReproducerVersionFactory(reproducer=cpu, files=hidden_code("newer"), review_state=ReviewState.PENDING,
                                       submitted_by=submitter)
    rejected = ReproducerVersionFactory(reproducer=cpu, files=hidden_code("rejected"), submitted_by=submitter,
                                        review_state=ReviewState.REJECTED, review_note="no")
    new_reproducer = ReproducerVersionFactory(
        reproducer=ReproducerFactory(bug=public_bug, name="extra", strategy_note=SECRET), files=hidden_code("extra"),
        review_state=ReviewState.PENDING, submitted_by=submitter)
    hidden_bug = BugFactory(bug_id=HIDDEN_BUG, title=SECRET, status=BugStatus.SUBMITTED, submitted_by=submitter)
    unreviewed = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=hidden_bug), files=hidden_code("bug"),
                                          review_state=ReviewState.PENDING, submitted_by=submitter)
    pipeline = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=None, name="clean-mlp"))

    public_campaign = CampaignFactory(name="public campaign")
    public_run = RunFactory(reproducer_version=public_version, campaign=public_campaign, status="succeeded",
                            manifested=True, trigger_step=1)
    hidden_campaign = CampaignFactory(name=f"{SECRET} campaign")
    hidden_run = RunFactory(reproducer_version=pending, campaign=hidden_campaign, status="failed",
                            failure_reason=SECRET)
    detection_row = {"bug": "TEST-PUBLIC", "reproducer": "cpu", "detector": "plain", "outcome": "missed"}
    EvaluationFactory(campaign=public_campaign,
                      tables={"detection": [detection_row, {**detection_row, "bug": HIDDEN_BUG}]})
    world.ids = {
        "public_bug": public_bug.bug_id, "hidden_bug": hidden_bug.bug_id, "public_version": public_version.pk,
        "pending": pending.pk, "unreviewed": unreviewed.pk, "pipeline": pipeline.reproducer.name,
        "public_run": public_run.pk, "hidden_run": hidden_run.pk, "detector": public_run.detector_id,
        "public_alarm": AlarmFactory(run=public_run).pk,
        "hidden_alarm": AlarmFactory(run=hidden_run, message=SECRET).pk,
        "public_campaign": public_campaign.pk, "hidden_campaign": hidden_campaign.pk,
        "token": do_create_api_token("laptop", acting_user=submitter)[0].pk,
        "pending_detector": DetectorVersion.objects.create(
            name="secret_watch", version="1", code=f"# {SECRET}\n", code_hash="ab" * 32, submitted_by=submitter,
            interface={"integration": "drop-in"}, description=SECRET).pk,
        "hidden_bisection": Bisection.objects.create(bug=hidden_bug, reproducer_version=unreviewed, good="2.9.0",
                                                     bad="2.13.0", seeds=[0]).pk,
    }
    world.markers = [SECRET, HIDDEN_BUG] + [v.short_hash for v in (pending, rejected, new_reproducer, unreviewed)]
    return world


def expect(anonymous, submitter, other, maintainer, staff=None):
    """Statuses by role (staff, not a maintainer, gets what another contributor gets unless given)."""
    return {"anonymous": anonymous, "submitter": submitter, "other": other, "maintainer": maintainer,
            "staff": other if staff is None else staff}


PUBLIC = expect(200, 200, 200, 200)
HIDDEN = expect(404, 200, 404, 200)  # a hidden object: its submitter and the maintainers only
SIGNED_IN = expect(302, 200, 200, 200)  # a page that sends the anonymous to the login page
SIGNED_IN_API = expect(401, 200, 200, 200)
MAINTAINERS = expect(403, 403, 403, 200)


@dataclass(frozen=True)
class Case:
    name: str  # the URL's name, as reverse() takes it
    kwargs: dict  # URL arguments: a key of World.ids stands for that object's ID
    expected: dict
    method: str = "get"
    query: str = ""  # "{hidden_campaign}" stands for that object's ID
    data: dict = field(default_factory=dict)

    def url(self, world):
        kwargs = {key: world.ids.get(value, value) for key, value in self.kwargs.items()}
        return reverse(self.name, kwargs=kwargs) + (f"?{self.query.format(**world.ids)}" if self.query else "")

    def __str__(self):
        return f"{self.method.upper()} {self.name}({','.join(map(str, self.kwargs.values()))}){self.query}"


CASES = [
    # --- the catalog ---
    Case("bugs:list", {}, PUBLIC),
    Case("bugs:list", {}, PUBLIC, query="status=submitted"),
    Case("bugs:export", {"fmt": "csv"}, PUBLIC),
    Case("bugs:export", {"fmt": "md"}, PUBLIC, query=f"q={HIDDEN_BUG[:3]}"),
    Case("bugs:detail", {"bug_id": "public_bug"}, PUBLIC),
    Case("bugs:detail", {"bug_id": "hidden_bug"}, HIDDEN),
    Case("bugs:resubmit", {"bug_id": "public_bug"}, expect(302, 200, 403, 200)),
    Case("bugs:resubmit", {"bug_id": "hidden_bug"}, expect(302, 200, 404, 200)),
    Case("bugs:resubmit", {"bug_id": "hidden_bug"}, expect(302, 200, 404, 200), method="post"),
    Case("bugs:held_out", {"bug_id": "public_bug"}, expect(403, 403, 403, 400), method="post"),
    Case("bugs:submit", {}, SIGNED_IN),
    Case("bugs:submit", {}, SIGNED_IN, method="post"),
    Case("bugs:my_submissions", {}, SIGNED_IN),
    Case("bugs:review_queue", {}, MAINTAINERS),
    Case("bugs:review", {"pk": "unreviewed"}, MAINTAINERS),
    Case("bugs:review", {"pk": "unreviewed"}, MAINTAINERS, method="post", data={"decision": "reject"}),
    Case("bugs:pipelines", {}, PUBLIC),
    Case("bugs:pipeline", {"name": "pipeline"}, PUBLIC),
    Case("sensitivity:mutants", {}, PUBLIC),
    Case("sensitivity:mutant", {"mutant_id": "MUT-none"}, expect(404, 404, 404, 404)),
    Case("evaluation:sensitivity", {}, PUBLIC),
    Case("evaluation:sensitivity-export", {"table": "by_class", "fmt": "csv"}, expect(404, 404, 404, 404)),
    # --- runs and campaigns ---
    Case("runners:run", {"pk": "public_run"}, PUBLIC),
    Case("runners:run", {"pk": "hidden_run"}, HIDDEN),
    Case("runners:run_record", {"pk": "public_run"}, PUBLIC),
    Case("runners:run_record", {"pk": "hidden_run"}, HIDDEN),
    Case("runners:campaigns", {}, PUBLIC),
    Case("runners:campaign", {"pk": "public_campaign"}, PUBLIC),
    Case("runners:campaign", {"pk": "hidden_campaign"}, HIDDEN),
    Case("runners:campaign_live", {"pk": "public_campaign"}, PUBLIC),
    Case("runners:campaign_live", {"pk": "hidden_campaign"}, HIDDEN),
    Case("runners:campaign_new", {}, MAINTAINERS),
    Case("runners:campaign_new", {}, MAINTAINERS, method="post"),
    Case("runners:workers", {}, MAINTAINERS),
    Case("runners:campaign_cancel", {"pk": "public_campaign"}, expect(403, 403, 403, 302), method="post"),
    Case("runners:campaign_retry", {"pk": "hidden_campaign"}, expect(403, 403, 403, 302), method="post"),
    # --- results ---
    Case("evaluation:results", {}, PUBLIC),
    Case("evaluation:runs", {}, PUBLIC, query="campaign={public_campaign}"),
    Case("evaluation:runs", {}, expect(404, 404, 404, 200), query="campaign={hidden_campaign}"),
    Case("evaluation:results", {}, PUBLIC, query="campaign={public_campaign}"),
    Case("evaluation:results", {}, expect(404, 404, 404, 200), query="campaign={hidden_campaign}"),
    Case("evaluation:export", {"table": "detection", "fmt": "csv"}, PUBLIC),
    Case("evaluation:export", {"table": "detection", "fmt": "csv"}, expect(400, 400, 400, 200),
         query=f"bug={HIDDEN_BUG}"),
    Case("evaluation:export", {"table": "matrix", "fmt": "tex"}, PUBLIC),
    Case("evaluation:export", {"table": "leaderboard", "fmt": "csv"}, PUBLIC),
    Case("evaluation:export", {"table": "leaderboard", "fmt": "csv"}, expect(404, 404, 404, 200),
         query="campaign={hidden_campaign}"),
    Case("leaderboard", {}, PUBLIC),
    Case("leaderboard", {}, expect(404, 404, 404, 200), query="campaign={hidden_campaign}"),
    Case("methodology", {}, PUBLIC),
    Case("home", {}, PUBLIC),
    Case("citation_bib", {}, PUBLIC),
    Case("leaderboard-detector", {"name": "nan_inf"}, expect(301, 301, 301, 301)),
    Case("docs:index", {}, PUBLIC),
    Case("docs:page", {"name": "accounts"}, PUBLIC),
    Case("docs:page", {"name": "no-such-document"}, expect(404, 404, 404, 404)),
    Case("evaluation:compare", {}, PUBLIC),
    Case("evaluation:compare", {}, PUBLIC, query="a=campaign:{public_campaign}&b=campaign:{hidden_campaign}"),
    Case("evaluation:compare-export", {"fmt": "csv"}, expect(400, 400, 400, 200),
         query="a=campaign:{public_campaign}&b=campaign:{hidden_campaign}"),
    Case("evaluation:versions", {}, PUBLIC),
    Case("evaluation:versions-export", {"fmt": "csv"}, expect(404, 404, 404, 404)),  # no version-matrix campaign
    Case("evaluation:bisections", {}, PUBLIC),
    Case("evaluation:bisection", {"pk": "hidden_bisection"}, HIDDEN),
    Case("evaluation:bisection-start", {}, expect(403, 403, 403, 400), method="post", data={"bug": HIDDEN_BUG}),
    # --- the API ---
    Case("api-root", {}, PUBLIC),
    Case("bug-list", {}, PUBLIC),
    Case("bug-detail", {"bug_id": "public_bug"}, PUBLIC),
    Case("bug-detail", {"bug_id": "hidden_bug"}, HIDDEN),
    Case("reproducer-version-list", {}, PUBLIC),
    Case("reproducer-version-list", {}, PUBLIC, query="review_state=pending"),
    Case("reproducer-version-list", {}, PUBLIC, query="review_state=rejected"),
    Case("reproducer-version-detail", {"pk": "public_version"}, PUBLIC),
    Case("reproducer-version-detail", {"pk": "pending"}, HIDDEN),
    Case("reproducer-version-detail", {"pk": "unreviewed"}, HIDDEN),
    Case("reproducer-version-review", {"pk": "unreviewed"}, expect(401, 403, 403, 400), method="post",
         data={"decision": "reject"}),
    Case("submission-list", {}, SIGNED_IN_API),
    Case("submission-list", {}, expect(401, 400, 400, 400), method="post"),
    Case("submission-detail", {"pk": "unreviewed"}, expect(401, 200, 404, 404)),
    Case("detector-list", {}, PUBLIC),
    Case("detector-detail", {"pk": "detector"}, PUBLIC),
    Case("campaign-list", {}, PUBLIC),
    Case("campaign-list", {}, expect(401, 403, 403, 400), method="post"),
    Case("campaign-detail", {"pk": "public_campaign"}, PUBLIC),
    Case("campaign-detail", {"pk": "hidden_campaign"}, HIDDEN),
    Case("campaign-preview", {}, expect(401, 403, 403, 400), method="post"),
    Case("campaign-cancel", {"pk": "public_campaign"}, expect(401, 403, 403, 200), method="post"),
    Case("campaign-retry", {"pk": "hidden_campaign"}, expect(401, 403, 403, 200), method="post"),
    Case("run-list", {}, PUBLIC),
    Case("run-detail", {"pk": "public_run"}, PUBLIC),
    Case("run-detail", {"pk": "hidden_run"}, HIDDEN),
    Case("alarm-list", {}, PUBLIC),
    Case("alarm-detail", {"pk": "public_alarm"}, PUBLIC),
    Case("alarm-detail", {"pk": "hidden_alarm"}, HIDDEN),
    Case("api-results", {}, PUBLIC),
    Case("api-results", {}, expect(400, 400, 400, 200), query=f"bug={HIDDEN_BUG}"),
    Case("api-results", {}, expect(404, 404, 404, 200), query="campaign={hidden_campaign}"),
    Case("token-list", {}, SIGNED_IN_API),
    Case("token-list", {}, expect(401, 201, 201, 201), method="post", data={"name": "ci"}),
    Case("token-detail", {"pk": "token"}, expect(401, 200, 404, 404)),
    Case("token-detail", {"pk": "token"}, expect(401, 204, 404, 404), method="delete"),
    Case("token-revoke", {"pk": "token"}, expect(401, 200, 404, 404), method="post"),
    Case("api-token", {}, expect(405, 405, 405, 405)),
    Case("api-schema", {}, PUBLIC),
    Case("api-docs", {}, PUBLIC),
    Case("detector-submission-list", {}, SIGNED_IN_API),
    Case("detector-submission-list", {}, expect(401, 400, 400, 400), method="post"),
    Case("detector-submission-detail", {"pk": "pending_detector"}, expect(401, 200, 404, 200)),
    Case("detector-submission-review", {"pk": "pending_detector"}, expect(401, 403, 403, 400), method="post"),
    Case("runners:submit_detector", {}, SIGNED_IN),
    Case("runners:my_detectors", {}, SIGNED_IN),
    Case("runners:detector_review_queue", {}, MAINTAINERS),
    Case("runners:review_detector", {"pk": "pending_detector"}, MAINTAINERS),
    Case("runners:review_detector", {"pk": "pending_detector"}, MAINTAINERS, method="post",
         data={"decision": "reject"}),
    Case("leaderboard-entries", {"fmt": "csv"}, PUBLIC),
    Case("leaderboard-entry", {"pk": "pending_detector"}, expect(404, 404, 404, 404)),  # never scored
    Case("detector", {"name": "secret_watch"}, HIDDEN),  # its only version is pending
    # --- accounts ---
    Case("accounts:signup", {}, PUBLIC),
    Case("accounts:account", {}, SIGNED_IN),
    Case("accounts:tokens", {}, SIGNED_IN),
    Case("accounts:revoke_token", {"pk": "token"}, expect(302, 302, 404, 404), method="post"),
    Case("login", {}, PUBLIC),
    Case("logout", {}, expect(405, 405, 405, 405)),
    Case("password_change", {}, SIGNED_IN),
    Case("password_change_done", {}, SIGNED_IN),
    Case("password_reset", {}, PUBLIC),
    Case("password_reset_done", {}, PUBLIC),
    Case("password_reset_confirm", {"uidb64": "x", "token": "y"}, PUBLIC),
    Case("password_reset_complete", {}, PUBLIC),
    # --- the rest ---
    Case("admin:index", {}, expect(302, 302, 302, 302, staff=200)),
    Case("admin:bugs_reproducerversion_changelist", {}, expect(302, 302, 302, 302, staff=403)),
    Case("plotly-js", {}, PUBLIC),
]
# Not about the catalog, and served the same to everyone.
NOT_ABOUT_THE_CATALOG = {"healthz": "liveness probe", "healthz-ready": "readiness probe (database and broker)"}


def test_every_endpoint_is_classified():
    classified = {case.name for case in CASES} | set(NOT_ABOUT_THE_CATALOG)
    classified |= {"admin:*"} if any(name.startswith("admin:") for name in classified) else set()
    resolved = set(url_names(get_resolver().url_patterns))
    assert not resolved - classified, f"classify these in tests/test_visibility.py: {sorted(resolved - classified)}"
    assert not {name for name in classified if name != "admin:*" and not name.startswith("admin:")} - resolved


def state():
    """What a refused request must leave as it was."""
    return (Bug.objects.count(), sorted(ReproducerVersion.objects.values_list("pk", "review_state")),
            sorted(Campaign.objects.values_list("pk", "cancelled_at", "completed_at")),
            sorted(Run.objects.values_list("pk", "status")),
            sorted(ApiToken.objects.values_list("pk", "revoked_at")))


def client_of(user):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_who_sees_and_does_what(case, role):
    world = build_world()
    url = case.url(world)
    before = state()
    response = getattr(client_of(world.users[role]), case.method)(url, case.data)
    assert response.status_code == case.expected[role], f"{role}: {case.method.upper()} {url}"
    if response.status_code >= 400 or "/login/" in response.get("Location", ""):
        assert state() == before, f"{role}: a refused {case.method.upper()} {url} changed something"
    if role not in SEES_HIDDEN and response.status_code == 200:
        body = b"".join(response.streaming_content) if response.streaming else response.content
        leaked = [marker for marker in world.markers if marker.encode() in body]
        assert not leaked, f"{role}: {url} shows hidden {leaked}"


ADMIN_LISTS = ["bugs_bug", "bugs_reproducer", "bugs_reproducerversion", "runners_run", "runners_campaign"]


@pytest.mark.parametrize("maintainer", [False, True], ids=["staff", "staff maintainer"])
def test_the_admin_shows_staff_only_what_they_may_see(maintainer):
    """Staff allowed to view every catalog and run model still see hidden submissions only as maintainers."""
    from django.contrib.auth.models import Permission

    world = build_world()
    staff = MaintainerFactory(is_staff=True) if maintainer else UserFactory(is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__regex=r"^(view|change)_",
                                                          content_type__app_label__in=["bugs", "runners"]))
    client = client_of(staff)
    for model in ADMIN_LISTS:
        body = client.get(reverse(f"admin:{model}_changelist")).content
        shown = [marker for marker in world.markers if marker.encode() in body]
        assert bool(shown) == maintainer, f"{model}: {shown}"
    pending = client.get(reverse("admin:bugs_reproducerversion_change", args=[world.ids["pending"]]))
    assert (pending.status_code == 200) == maintainer
    # a reproducer's page is read-only: no choice of bug lists the hidden one, whoever looks
    public = Reproducer.objects.get(bug__bug_id="TEST-PUBLIC", name="cpu")
    page = client.get(reverse("admin:bugs_reproducer_change", args=[public.pk]))
    assert page.status_code == 200 and HIDDEN_BUG.encode() not in page.content
    bug_page = client.get(reverse("admin:bugs_bug_change", args=[public.bug.pk]))  # its reproducers, inline
    assert bug_page.status_code == 200 and (b'value="extra"' in bug_page.content or b">extra<" in bug_page.content) \
        == maintainer


@pytest.mark.parametrize(("role", "count"), [("anonymous", "1 version"), ("other", "1 version"),
                                             ("submitter", "3 versions"), ("maintainer", "3 versions")])
def test_a_bug_page_counts_only_the_versions_its_reader_may_see(role, count):
    """The public reproducer has one approved version, a pending and a rejected one: a count of three would
    tell the public that hidden versions exist."""
    import re

    world = build_world()
    page = client_of(world.users[role]).get(reverse("bugs:detail", kwargs={"bug_id": world.ids["public_bug"]}))
    counts = re.findall(r"\((\d+ versions?)\)", page.content.decode())
    extra = ["1 version"] if role in SEES_HIDDEN else []  # the pending new reproducer's card
    assert sorted(counts) == sorted([count, *extra])


@pytest.mark.parametrize("hidden_runs", [False, True], ids=["no hidden code ran", "hidden code ran"])
def test_runs_are_filtered_by_a_subquery_whatever_the_number_of_hidden_versions(hidden_runs):
    """Rejected versions accumulate: the runs, alarms and campaigns of the public are filtered by a subquery
    (no list of version IDs whose length grows past a database's bind parameters), after one EXISTS query that
    leaves them unfiltered while no hidden version has runs."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runners.selectors import visible_alarms, visible_campaigns, visible_runs

    campaign = CampaignFactory()
    public = RunFactory(reproducer_version=ReproducerVersionFactory(), campaign=campaign)
    hidden = [ReproducerVersionFactory(review_state=ReviewState.REJECTED, review_note="no") for _ in range(30)]
    if hidden_runs:
        for version in hidden[:20]:
            RunFactory(reproducer_version=version, campaign=campaign)
    for select in (visible_runs, visible_alarms, visible_campaigns):
        with CaptureQueriesContext(connection) as queries:
            query = select(None)
        assert len(queries) == 1 and "EXISTS" in queries[0]["sql"].upper(), queries.captured_queries
        sql, params = query.query.sql_with_params()
        assert len(params) < 10, f"{select.__name__}: {len(params)} parameters"
        assert ("WHERE" in sql) == hidden_runs, sql
    assert list(visible_runs(None).values_list("pk", flat=True)) == [public.pk]
    assert list(visible_campaigns(None)) == ([] if hidden_runs else [campaign])
    assert visible_runs(MaintainerFactory()).count() == 1 + 20 * hidden_runs
