"""The held-out split (docs/methodology.md, "Held-out bugs"; docs/security.md): a held-out bug's ID, title, fields,
code and per-bug results reach maintainers only, on every surface; aggregates still count it; moves are audited;
its held-out score counts only campaigns created after it was held out.

``SURFACES`` lists every URL the site resolves, with the statuses each reader gets (``test_every_url_is_a_surface``
fails for a new URL until it is added, or exempted in ``NOT_ABOUT_BUGS`` with a reason). Each surface is requested by
a maintainer, then the contributor who submitted the held-out bug, then an anonymous reader, on one world: a public
bug and a held-out one run in the same evaluation campaign (stored with its tables), a campaign that ran only the
held-out bug, alarms, a failed run. The held-out bug's ID, title, root cause and code must not be in what the
contributor or the anonymous reader gets, and what the maintainer must see is named per surface. A surface that
filters by an ID answers a held-out bug's ID exactly as it answers an ID that does not exist."""
import re
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import get_resolver, reverse
from django.utils import timezone

from bugs.actions import do_hold_out_bug, do_publish_bug
from bugs.models import Bug, BugStatus
from core.exports import EXPORT_FORMATS
from core.models import AuditEvent
from evaluation.actions import run_tables
from evaluation.exports import EXPORT_TABLES
from evaluation.held_out import Split, held_out_scores, scores_of_evaluation, scores_of_runs
from evaluation.results import Results
from evaluation.results_doc import render
from runners.actions.detectors import do_record_detector
from runners.models import Campaign, CampaignPurpose, Run

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

HELD_ID = "GH-HELDOUT-77"
HELD_TITLE = "Optimizer state swapped quietly QX9"
HELD_ROOT_CAUSE = "ROOTCAUSE-held-4e1"
HELD_CODE = "HELDCODE-41c"
MARKERS = [HELD_ID, HELD_TITLE, HELD_ROOT_CAUSE, HELD_CODE]
NO_SUCH_ID = "GH-NOSUCH-77"
PUBLIC_ID = "TEST-PUBLIC"
READERS = ["maintainer", "contributor", "anonymous"]  # the maintainer first: nothing they were shown is kept for others


@dataclass
class World:
    users: dict
    ids: dict


def succeeded(version, detector, variant, campaign, alarm_steps=(), seed=0, message="an alarm", manifested=None):
    manifested = variant == "buggy" if manifested is None else manifested
    run = RunFactory(reproducer_version=version, detector=detector, variant=variant, status="succeeded", seed=seed,
                     steps=10, trigger_step=3, trigger_time=100.0, manifested=manifested, campaign=campaign,
                     step_records=[{"step": s, "rank": 0, "loss": 1.0, "time": 100.0 + s} for s in range(10)])
    for step in alarm_steps:
        AlarmFactory(run=run, step=step, rule="no_parameter_updated", message=message, time=100.0 + step)
    return run


def evaluation_of(campaign, command="manage.py evaluate"):
    """A stored evaluation of ``campaign``'s runs, its tables computed as ``manage.py evaluate`` computes them."""
    tables = run_tables(campaign.runs.all())
    tables["overhead"] = [{"detector": "param_not_updated", "pairs": 2, "pairs_planned": 2,
                           "median_step_time_ratio": 1.1, "median_end_to_end_ratio": 1.2}]
    return EvaluationFactory(campaign=campaign, tables=tables, parameters={"command": command})


def build_world():
    contributor, maintainer = UserFactory(), MaintainerFactory()
    public_bug = BugFactory(bug_id=PUBLIC_ID, status=BugStatus.VERIFIED)
    public = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=public_bug))
    held_bug = BugFactory(bug_id=HELD_ID, title=HELD_TITLE, root_cause=HELD_ROOT_CAUSE, status=BugStatus.VERIFIED,
                          submitted_by=contributor)
    held = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=held_bug), submitted_by=contributor,
                                    files={"repro.py": f"{GOOD_REPRODUCER}# {HELD_CODE}\n"})
    pipeline = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=None, name="clean-mlp"))
    do_hold_out_bug(held_bug, acting_user=maintainer)

    guard, plain = do_record_detector("param_not_updated"), do_record_detector("plain")
    reproducers = [str(public), str(held), str(pipeline)]
    # a maintainer may type a held-out bug's ID into a campaign's name: shown to the others withheld (shown_name)
    mixed = CampaignFactory(name=f"evaluation, {HELD_ID} again", purpose=CampaignPurpose.EVALUATION,
                            parameters={"reproducers": reproducers, "detectors": [str(guard)]})
    runs = {}
    for name, version in (("public", public), ("held", held)):
        runs[f"{name}_buggy"] = succeeded(version, guard, "buggy", mixed, [5], message=f"alarm of {version}")
        runs[f"{name}_fixed"] = succeeded(version, guard, "fixed", mixed)
        succeeded(version, plain, "buggy", mixed)
        succeeded(version, plain, "fixed", mixed, manifested=True)  # against the verdict: a flakiness row
    runs["held_failed"] = RunFactory(reproducer_version=held, detector=guard, variant="buggy", seed=1, campaign=mixed,
                                     status="failed", failure_reason=f"{HELD_ID} crashed")
    succeeded(pipeline, guard, "fixed", mixed, [4])
    mixed.completed_at = timezone.now()
    mixed.save()
    evaluation = evaluation_of(mixed, f"manage.py evaluate --bugs {PUBLIC_ID},{HELD_ID}")  # shown_command
    other = CampaignFactory(name="public only", parameters={"reproducers": [str(public)]})
    succeeded(public, guard, "buggy", other, [6])
    verification = CampaignFactory(name=f"verification k=1: {held.reproducer}", purpose=CampaignPurpose.VERIFICATION,
                                   parameters={"reproducers": [str(held)]})
    runs["held_verification"] = succeeded(held, plain, "buggy", verification)
    return World(users={"maintainer": maintainer, "contributor": contributor, "anonymous": None}, ids={
        "held": HELD_ID, "public": PUBLIC_ID, "no_such": NO_SUCH_ID, "held_version": held.pk,
        "public_version": public.pk, "pipeline": "clean-mlp", "mixed": mixed.pk, "other": other.pk,
        "verification": verification.pk, "evaluation": evaluation.pk, "detector": guard.pk, "code": guard.code_id,
        "held_alarm": runs["held_buggy"].alarms.get().pk, "public_alarm": runs["public_buggy"].alarms.get().pk,
        **{f"{name}_run": run.pk for name, run in runs.items()}})


def statuses(maintainer, contributor, anonymous):
    return {"maintainer": maintainer, "contributor": contributor, "anonymous": anonymous}


EVERYONE = statuses(200, 200, 200)
MAINTAINERS_ONLY = statuses(200, 404, 404)  # a held-out object: not found for anyone else
SIGNED_IN = statuses(200, 200, 302)
ID = (HELD_ID,)
ID_AND_TITLE = (HELD_ID, HELD_TITLE)


@dataclass(frozen=True)
class Surface:
    name: str  # the URL's name, as reverse() takes it
    kwargs: dict = field(default_factory=dict)  # a key of World.ids stands for that object's ID
    expected: dict = field(default_factory=lambda: EVERYONE)
    query: str = ""  # "{held}" and the like stand for World.ids
    maintainer_sees: tuple = ()  # the held-out bug's markers the maintainer's answer must hold
    method: str = "get"
    data: dict = field(default_factory=dict)

    @property
    def filters_by_id(self):
        return "{held}" in self.query

    def url(self, world, ids=None):
        ids = {**world.ids, **(ids or {})}
        kwargs = {key: ids.get(value, value) for key, value in self.kwargs.items()}
        return reverse(self.name, kwargs=kwargs) + (f"?{self.query.format(**ids)}" if self.query else "")

    def __str__(self):
        return f"{self.method.upper()} {self.name}({','.join(map(str, self.kwargs.values()))}){self.query}"


def exports(name, kwargs=None, query="", maintainer_sees=(), expected=EVERYONE, empty=None):
    """The surface in every export format; ``empty``: the statuses of the LaTeX export, which refuses a table without
    rows (core.exports.EmptyTable), when some reader's table has none."""
    return [Surface(name, {**(kwargs or {}), "fmt": fmt}, empty if fmt == "tex" and empty else expected, query,
                    maintainer_sees) for fmt in EXPORT_FORMATS]


SURFACES = [
    # --- the catalog ---
    Surface("bugs:list", maintainer_sees=ID_AND_TITLE),
    Surface("bugs:list", query="q={held}"),
    Surface("bugs:list", query="status=verified", maintainer_sees=ID_AND_TITLE),
    *exports("bugs:export", maintainer_sees=ID_AND_TITLE),
    *exports("bugs:export", query="q={held}", maintainer_sees=ID, empty=statuses(200, 404, 404)),
    Surface("bugs:detail", {"bug_id": "held"}, MAINTAINERS_ONLY, maintainer_sees=ID_AND_TITLE),
    Surface("bugs:detail", {"bug_id": "public"}),
    Surface("bugs:resubmit", {"bug_id": "held"}, statuses(200, 404, 302), maintainer_sees=ID),
    Surface("bugs:held_out", {"bug_id": "held"}, statuses(302, 403, 403), method="post", data={"held_out": "false"}),
    Surface("bugs:submit", expected=SIGNED_IN),
    Surface("bugs:my_submissions", expected=SIGNED_IN),
    Surface("bugs:review_queue", expected=statuses(200, 403, 403)),
    Surface("bugs:review", {"pk": "held_version"}, statuses(200, 403, 403), maintainer_sees=ID),
    Surface("bugs:pipelines"),
    Surface("bugs:pipeline", {"name": "pipeline"}),
    Surface("sensitivity:mutants"),
    Surface("sensitivity:mutant", {"mutant_id": "MUT-none"}, statuses(404, 404, 404)),  # the world has no mutant
    # --- runs and campaigns ---
    Surface("runners:run", {"pk": "held_buggy_run"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("runners:run", {"pk": "held_failed_run"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("runners:run", {"pk": "public_buggy_run"}),
    Surface("runners:run_record", {"pk": "held_buggy_run"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("runners:run_record", {"pk": "public_buggy_run"}),
    Surface("runners:campaigns"),
    Surface("runners:campaign", {"pk": "mixed"}, maintainer_sees=ID),
    Surface("runners:campaign", {"pk": "mixed"}, query="status=failed", maintainer_sees=ID),
    Surface("runners:campaign", {"pk": "verification"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("runners:campaign_live", {"pk": "mixed"}, maintainer_sees=ID),
    Surface("runners:campaign_live", {"pk": "verification"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("runners:campaign_new", expected=statuses(200, 403, 403), maintainer_sees=ID),
    Surface("runners:workers", expected=statuses(200, 403, 403)),  # hosts, queues, GPU checks: no bug
    Surface("runners:campaign_cancel", {"pk": "mixed"}, statuses(302, 403, 403), method="post"),
    Surface("runners:campaign_retry", {"pk": "mixed"}, statuses(302, 403, 403), method="post"),
    # --- detector submissions (their scoring campaigns are campaigns as above) ---
    Surface("runners:submit_detector", expected=SIGNED_IN),
    Surface("runners:my_detectors", expected=SIGNED_IN),
    Surface("runners:detector_review_queue", expected=statuses(200, 403, 403)),
    Surface("detector-submission-list", expected=statuses(200, 200, 401)),
    # --- results, leaderboard, comparison, version matrix, bisections ---
    Surface("evaluation:results", maintainer_sees=ID),
    Surface("evaluation:runs", query="evaluation={evaluation}", maintainer_sees=ID),
    Surface("evaluation:runs", query="campaign={mixed}&detector=param_not_updated&verdict=detected",
            maintainer_sees=ID),
    Surface("evaluation:results", query="evaluation={evaluation}", maintainer_sees=ID),
    Surface("evaluation:results", query="campaign={mixed}", maintainer_sees=ID),
    Surface("evaluation:results", query="campaign={verification}", expected=MAINTAINERS_ONLY),
    Surface("evaluation:results", query="bug={held}"),
    *[surface for table in EXPORT_TABLES for surface in exports(
        "evaluation:export", {"table": table}, maintainer_sees=() if table in ("leaderboard", "false-positives",
                                                                              "latency", "overhead") else ID)],
    *[surface for table in ("detection", "matrix", "flakiness") for surface in exports(
        "evaluation:export", {"table": table}, query="campaign={mixed}", maintainer_sees=ID)],
    *exports("evaluation:export", {"table": "detection"}, query="bug={held}", expected=statuses(200, 400, 400)),
    Surface("leaderboard", maintainer_sees=ID),  # the evaluation's command line
    Surface("leaderboard", query="campaign={mixed}"),
    *exports("leaderboard-entries"),
    Surface("detector", {"name": "param_not_updated"}),
    Surface("leaderboard-entry", {"pk": "code"}, maintainer_sees=ID),  # scored on the evaluation: its manifest
    Surface("methodology"),
    Surface("home"),
    Surface("citation_bib"),
    Surface("docs:index"),
    Surface("docs:page", {"name": "methodology"}),
    Surface("evaluation:compare", query="a=campaign:{mixed}&b=campaign:{other}"),
    Surface("evaluation:compare", query="a=campaign:{mixed}&b=campaign:{other}&bug={held}"),
    *exports("evaluation:compare-export", query="a=campaign:{mixed}&b=campaign:{other}"),
    Surface("evaluation:versions"),
    *exports("evaluation:versions-export", expected=statuses(404, 404, 404)),  # no version-matrix campaign
    Surface("evaluation:bisections"),
    Surface("evaluation:sensitivity"),
    *exports("evaluation:sensitivity-export", {"table": "by_class"}, expected=statuses(404, 404, 404)),  # none stored
    Surface("evaluation:bisection-start", expected=statuses(400, 403, 403), method="post", data={"bug": HELD_ID}),
    # --- the API ---
    Surface("api-root"),
    Surface("bug-list", maintainer_sees=ID_AND_TITLE),
    Surface("bug-list", query="q={held}"),
    Surface("bug-detail", {"bug_id": "held"}, MAINTAINERS_ONLY, maintainer_sees=ID_AND_TITLE),
    Surface("reproducer-version-list", maintainer_sees=ID),
    Surface("reproducer-version-list", query="reproducer__bug__bug_id={held}"),
    Surface("reproducer-version-detail", {"pk": "held_version"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("reproducer-version-review", {"pk": "held_version"}, statuses(400, 403, 401), method="post"),
    Surface("submission-list", expected=statuses(200, 200, 401)),
    Surface("submission-list", expected=statuses(400, 400, 401), method="post"),
    Surface("submission-detail", {"pk": "held_version"}, statuses(404, 404, 401)),
    Surface("detector-list"),
    Surface("detector-detail", {"pk": "detector"}),
    Surface("campaign-list", maintainer_sees=ID),
    Surface("campaign-detail", {"pk": "mixed"}, maintainer_sees=ID),
    Surface("campaign-detail", {"pk": "verification"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("campaign-preview", expected=statuses(400, 403, 401), method="post"),
    Surface("campaign-cancel", {"pk": "mixed"}, statuses(200, 403, 401), method="post"),
    Surface("campaign-retry", {"pk": "mixed"}, statuses(200, 403, 401), method="post"),
    Surface("run-list", maintainer_sees=ID),
    Surface("run-list", query="reproducer_version__reproducer__bug__bug_id={held}"),
    Surface("run-list", query="campaign={mixed}", maintainer_sees=ID),
    Surface("run-detail", {"pk": "held_buggy_run"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("alarm-list", maintainer_sees=(HELD_ID,)),
    Surface("alarm-detail", {"pk": "held_alarm"}, MAINTAINERS_ONLY, maintainer_sees=ID),
    Surface("alarm-detail", {"pk": "public_alarm"}),
    Surface("api-results", maintainer_sees=ID),
    Surface("api-results", query="campaign={mixed}", maintainer_sees=ID),
    Surface("api-results", query="bug={held}", expected=statuses(200, 400, 400)),
    Surface("api-schema"),
]
# URLs that show nothing of any bug or run, to anyone.
NOT_ABOUT_BUGS = {
    "healthz": "liveness probe", "healthz-ready": "readiness probe", "plotly-js": "a static script",
    "api-docs": "the API's static documentation page", "api-token": "exchanges a password for a token",
    "token-list": "the reader's own API tokens", "token-detail": "one of the reader's tokens",
    "token-revoke": "revokes one of the reader's tokens", "accounts:signup": "the sign-up form",
    "accounts:account": "the reader's account", "accounts:tokens": "the reader's tokens",
    "accounts:revoke_token": "revokes one of the reader's tokens", "login": "the login form", "logout": "logs out",
    "password_change": "a form", "password_change_done": "a message", "password_reset": "a form",
    "password_reset_done": "a message", "password_reset_confirm": "a form", "password_reset_complete": "a message",
    "admin:*": "staff only: test_the_admin_shows_staff_no_held_out_bug and "
               "test_admin_hides_held_out_bugs_from_staff_and_lets_maintainers_move_them",
    "runners:review_detector": "a detector version's review: its code, no bug",
    "leaderboard-detector": "a permanent redirect to the detector's page (detector)",
    "detector-submission-detail": "one detector submission, as detector-submission-list shows it",
    "detector-submission-review": "a maintainer's review of a detector version",
    "evaluation:bisection": "a bisection of a bug the reader may see (evaluation.views.visible_bisections: "
                            "visible_bugs), as evaluation:bisections lists them",
}


def test_every_url_is_a_surface():
    covered = {surface.name for surface in SURFACES} | set(NOT_ABOUT_BUGS)
    resolved = set(url_names(get_resolver().url_patterns))
    assert not resolved - covered, f"add these to SURFACES in tests/test_held_out.py: {sorted(resolved - covered)}"
    assert not covered - resolved


def client_of(user):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def body_of(response):
    return (b"".join(response.streaming_content) if response.streaming else response.content).decode()


# What differs between two answers to the same request: the CSP nonce and the CSRF token
PER_REQUEST = re.compile(r'(nonce="|nonce-|csrfmiddlewaretoken" value="|csrfToken = ")[^"\']+')


def answer(client, surface, world, ids=None):
    response = getattr(client, surface.method)(surface.url(world, ids), surface.data)
    return response.status_code, PER_REQUEST.sub(r"\1", body_of(response))


@pytest.mark.parametrize("surface", SURFACES, ids=str)
def test_a_held_out_bug_reaches_only_the_maintainers(surface):
    world = build_world()
    readers = READERS if surface.method == "get" else list(reversed(READERS))  # a maintainer's change comes last
    for reader in readers:
        client = client_of(world.users[reader])
        status, body = answer(client, surface, world)
        assert status == surface.expected[reader], f"{reader}: {surface.url(world)} -> {status}"
        if reader == "maintainer":
            missing = [marker for marker in surface.maintainer_sees if marker not in body]
            assert not missing, f"the maintainer misses {missing} in {surface.url(world)}"
            continue
        echoed = body.replace(HELD_ID, "") if surface.filters_by_id else body  # an ID in the query may be echoed
        leaked = [marker for marker in MARKERS if marker in echoed]
        assert not leaked, f"{reader}: {surface.url(world)} shows {leaked}"
        assert HELD_ID not in body or surface.filters_by_id, f"{reader}: {surface.url(world)} names the bug"
        if surface.filters_by_id:
            absent = answer(client, surface, world, {"held": NO_SUCH_ID})
            assert (status, body.replace(HELD_ID, NO_SUCH_ID)) == absent, (
                f"{reader}: {surface.url(world)} answers otherwise than for a bug that does not exist")


def test_the_public_sees_each_held_out_bug_by_its_label_only():
    world = build_world()
    second = BugFactory(bug_id="GH-HELDOUT-78", title="Another held-out one")
    do_hold_out_bug(second, acting_user=world.users["maintainer"])
    catalog = body_of(client_of(None).get(reverse("bugs:list")))
    assert "Held out: 2 more bugs (held-out #1, held-out #2)" in catalog
    assert "GH-HELDOUT" not in catalog and "Another held-out one" not in catalog
    maintainers = body_of(client_of(world.users["maintainer"]).get(reverse("bugs:list")))
    assert 'held-out #1</span>' in maintainers and HELD_ID in maintainers and "GH-HELDOUT-78" in maintainers
    api = client_of(world.users["maintainer"]).get(reverse("bug-detail", args=[HELD_ID])).json()
    assert api["held_out"] is True
    assert client_of(None).get(reverse("bug-detail", args=[PUBLIC_ID])).json()["held_out"] is False


def test_aggregates_count_held_out_runs_while_their_rows_stay_hidden():
    """The public's tables leave out the held-out bug's rows, yet their false-positive and latency rows count its runs:
    the same numbers as the maintainer's."""
    world = build_world()
    public, maintainer = (Results({"campaign": str(world.ids["mixed"])}, user)
                          for user in (None, world.users["maintainer"]))
    assert set(public.table("detection")["bug"]) == {PUBLIC_ID}
    assert set(maintainer.table("detection")["bug"]) == {PUBLIC_ID, HELD_ID}
    for name in ("false-positives", "latency"):
        assert public.table(name).to_dict("records") == maintainer.table(name).to_dict("records")
    guard = public.table("latency").set_index("detector").loc["param_not_updated"]
    assert guard["bugs_detected"] == 2  # the public bug and the held-out one
    assert set(public.run_latencies()["bug"]) == {PUBLIC_ID}
    # the leaderboard's split scores are the same for every reader: counts, never which bug
    scores = held_out_scores(public)
    assert scores == held_out_scores(maintainer)
    assert scores.of("param_not_updated") == (Split(1, 1, 1), Split(1, 1, 1)) and scores.held_out_total == 1
    every_run = Results({}, None)  # no selection: the latest evaluation's stored tables
    assert set(every_run.table("flakiness")["bug"]) == {PUBLIC_ID}


def test_nothing_kept_before_a_bug_is_held_out_is_shown_after():
    """Pages, tables and exports kept in the cache while the bug was public are not served once it is held out."""
    world = build_world()
    held = Bug.objects.get(bug_id=HELD_ID)
    do_publish_bug(held, acting_user=world.users["maintainer"])
    urls = [reverse("bugs:list"), reverse("evaluation:results"),
            reverse("evaluation:export", kwargs={"table": "matrix", "fmt": "csv"}),
            reverse("evaluation:export", args=["detection", "json"]) + f"?campaign={world.ids['mixed']}",
            reverse("runners:campaign", kwargs={"pk": world.ids["mixed"]}), reverse("api-results"),
            reverse("campaign-detail", kwargs={"pk": world.ids["mixed"]}), reverse("leaderboard")]
    client = client_of(None)
    before = {url: body_of(client.get(url)) for url in urls}
    assert all(HELD_ID in before[url] for url in urls[:-1]), [url for url in urls if HELD_ID not in before[url]]
    do_hold_out_bug(held, acting_user=world.users["maintainer"])
    leaked = [url for url in urls if HELD_ID in body_of(client.get(url))]
    assert not leaked


def test_moves_are_audited_and_labels_never_reused():
    world = build_world()
    maintainer, held = world.users["maintainer"], Bug.objects.get(bug_id=HELD_ID)
    other = BugFactory(bug_id="GH-OTHER-1")
    response = client_of(world.users["contributor"]).post(reverse("bugs:held_out", args=[PUBLIC_ID]),
                                                          {"held_out": "true"})
    assert response.status_code == 403 and not Bug.objects.get(bug_id=PUBLIC_ID).held_out
    assert client_of(maintainer).post(reverse("bugs:held_out", args=[HELD_ID]), {"held_out": "maybe"}).status_code \
        == 400
    response = client_of(maintainer).post(reverse("bugs:held_out", args=[HELD_ID]), {"held_out": "false"})
    assert response.status_code == 302 and not Bug.objects.get(bug_id=HELD_ID).held_out
    do_hold_out_bug(other, acting_user=maintainer)
    client_of(maintainer).post(reverse("bugs:held_out", args=[HELD_ID]), {"held_out": "true"})
    held.refresh_from_db()
    other.refresh_from_db()
    assert (held.held_out, held.held_out_label, other.held_out_label) == (True, "held-out #3", "held-out #2")
    events = list(AuditEvent.objects.about(held).filter(action__in=["hold-out", "publish"]).order_by("at", "id"))
    assert [(event.action, event.actor, event.detail["label"]) for event in events] == [
        ("hold-out", maintainer, "held-out #1"), ("publish", maintainer, "held-out #1"),
        ("hold-out", maintainer, "held-out #3")]
    assert events[-1].summary == f"held out {HELD_ID} as held-out #3"
    with pytest.raises(Exception, match="already held out"):
        do_hold_out_bug(held, acting_user=maintainer)
    page = body_of(client_of(maintainer).get(reverse("bugs:detail", args=[HELD_ID])))
    assert "Held out</strong> as held-out #3" in page and f"published {HELD_ID}" in page and 'value="false"' in page


def test_admin_hides_held_out_bugs_from_staff_and_lets_maintainers_move_them():
    from django.contrib.auth.models import Permission

    world = build_world()
    staff = UserFactory(is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_bug", "change_bug"]))
    changelist = reverse("admin:bugs_bug_changelist")
    assert HELD_ID not in body_of(client_of(staff).get(changelist))
    staff_maintainer = MaintainerFactory(is_staff=True)
    staff_maintainer.user_permissions.add(*Permission.objects.filter(codename__in=["view_bug", "change_bug"]))
    public = Bug.objects.get(bug_id=PUBLIC_ID)
    refused = client_of(staff).post(changelist, {"action": "hold_out", "_selected_action": [public.pk]})
    assert refused.status_code in (200, 302) and not Bug.objects.get(pk=public.pk).held_out
    client_of(staff_maintainer).post(changelist, {"action": "hold_out", "_selected_action": [public.pk]})
    assert Bug.objects.get(pk=public.pk).held_out
    assert AuditEvent.objects.about(public).get(action="hold-out").actor == staff_maintainer
    assert world.users["maintainer"] != staff_maintainer


ADMIN_PAGES = [  # (URL name, World.ids key, what a staff member who is no maintainer gets)
    ("admin:runners_campaign_changelist", None, 200),
    ("admin:runners_campaign_change", "mixed", 200),
    ("admin:runners_campaign_history", "mixed", 200),
    ("admin:runners_campaign_delete", "mixed", 403),  # its page would list every run: campaigns are not deleted
    ("admin:runners_campaign_change", "verification", 302),  # not found: back to the admin's index
    ("admin:runners_run_changelist", None, 200),
    ("admin:runners_run_change", "public_buggy_run", 200),  # its campaign is the mixed one
    ("admin:runners_run_change", "held_buggy_run", 302),
    ("admin:bugs_reproducerversion_change", "public_version", 200),
    ("admin:bugs_reproducerversion_change", "held_version", 302),
    ("admin:bugs_bug_change", "public_bug_pk", 200),
    ("admin:bugs_bug_change", "held_bug_pk", 302),
]


@pytest.mark.parametrize(("name", "key", "status"), ADMIN_PAGES, ids=[f"{n}({k})" for n, k, _ in ADMIN_PAGES])
def test_the_admin_shows_staff_no_held_out_bug(name, key, status):
    """Staff who may view and change every catalog and run model, but are no maintainers: the held-out bug is in no
    admin page, nor in a campaign's name or parameters; a staff maintainer sees it."""
    from django.contrib.auth.models import Permission

    world = build_world()
    ids = {**world.ids, "public_bug_pk": Bug.objects.get(bug_id=PUBLIC_ID).pk,
           "held_bug_pk": Bug.objects.get(bug_id=HELD_ID).pk}
    url = reverse(name, args=[ids[key]] if key else [])
    permissions = Permission.objects.filter(codename__regex=r"^(view|change|delete)_",
                                            content_type__app_label__in=["bugs", "runners"])
    staff, staff_maintainer = UserFactory(is_staff=True), MaintainerFactory(is_staff=True)
    for user in (staff, staff_maintainer):
        user.user_permissions.add(*permissions)
    response = client_of(staff).get(url)
    body = body_of(response)
    assert response.status_code == status, f"{url} -> {response.status_code}"
    assert not [marker for marker in MARKERS if marker in body], f"{url} shows the held-out bug"
    if name == "admin:runners_campaign_change" and key == "mixed":
        assert str(world.ids["mixed"]) in body and PUBLIC_ID in body  # the public bug's reproducer, in its parameters
        assert HELD_ID in body_of(client_of(staff_maintainer).get(url))
        assert client_of(staff).post(url, {"name": "renamed"}).status_code == 403  # nothing is changed there
        assert Campaign.objects.get(pk=world.ids["mixed"]).name == f"evaluation, {HELD_ID} again"


def test_a_campaign_name_or_command_that_names_a_held_out_bug_is_withheld_from_the_others():
    """A verification campaign is named by its count of reproducers, never by its bugs; a name or an evaluation's
    command line that holds a held-out bug's ID, in any case, is shown whole to the maintainers only."""
    from runners.actions.campaigns import do_start_verification
    from runners.selectors import shown_command, shown_name

    world = build_world()
    maintainer = world.users["maintainer"]
    secret = BugFactory(bug_id="ZZZ-SECRET", status=BugStatus.VERIFIED)
    versions = [Bug.objects.get(bug_id=PUBLIC_ID).reproducers.get().versions.get(),
                ReproducerVersionFactory(reproducer=ReproducerFactory(bug=secret))]
    campaign = do_start_verification(versions, seeds=2, acting_user=maintainer)
    assert campaign.name == "verification k=2: 2 reproducers"
    do_hold_out_bug(secret, acting_user=maintainer)
    for url in (reverse("runners:campaigns"), reverse("runners:campaign", args=[campaign.pk]),
                reverse("campaign-detail", args=[campaign.pk]), reverse("campaign-list")):
        body = body_of(client_of(None).get(url))
        assert campaign.name in body and "ZZZ-SECRET" not in body, url
    typed = CampaignFactory(name="rerun of zzz-secret")
    assert shown_name(typed, None) == f"campaign #{typed.pk} (name withheld)"
    assert shown_name(typed, world.users["contributor"]) == shown_name(typed, None)
    assert shown_name(typed, maintainer) == "rerun of zzz-secret"
    assert shown_name(CampaignFactory(name="rerun of ZZZ-SECRETS"), None) != "rerun of ZZZ-SECRETS"  # no guessing
    assert shown_name(Campaign.objects.get(pk=world.ids["other"]), None) == "public only"
    assert "ZZZ-SECRET" not in shown_command("manage.py evaluate --bugs zzz-secret", None)
    assert shown_command("manage.py evaluate --bugs TEST-PUBLIC", None) == "manage.py evaluate --bugs TEST-PUBLIC"
    leaderboard = body_of(client_of(None).get(reverse("leaderboard")))
    assert "its options are withheld" in leaderboard and HELD_ID not in leaderboard
    api = client_of(None).get(reverse("campaign-detail", args=[world.ids["mixed"]])).json()
    assert api["name"] == f"campaign #{world.ids['mixed']} (name withheld)"
    assert client_of(maintainer).get(reverse("campaign-detail", args=[world.ids["mixed"]])).json()["name"] == \
        f"evaluation, {HELD_ID} again"


def test_a_retry_record_lists_its_runs_to_the_maintainers_only():
    """A retry's audit record keeps what each run had been, the failure reason of a held-out bug's run included
    ("GH-HELDOUT-77 crashed"): a mixed campaign's page lists them to the maintainers only."""
    from runners.actions.campaigns import do_retry_failed_runs

    world = build_world()
    mixed = Campaign.objects.get(pk=world.ids["mixed"])
    assert do_retry_failed_runs(mixed, acting_user=world.users["maintainer"]) == [world.ids["held_failed_run"]]
    url = reverse("runners:campaign", args=[mixed.pk])
    for reader in ("contributor", "anonymous"):
        body = body_of(client_of(world.users[reader]).get(url))
        assert "queued 1 failed or cancelled run(s) again" in body and HELD_ID not in body, reader
    assert f"{HELD_ID} crashed" in body_of(client_of(world.users["maintainer"]).get(url))
    public = Campaign.objects.get(pk=world.ids["other"])  # a campaign of public bugs lists them to everyone
    public.runs.update(status="failed", failure_reason="public crash")
    do_retry_failed_runs(public, acting_user=world.users["maintainer"])
    assert "public crash" in body_of(client_of(None).get(reverse("runners:campaign", args=[public.pk])))


def bug_with_a_detection(bug_id, detector, campaign):
    """A bug whose buggy run ``detector`` detects beyond the fixed twin in ``campaign``."""
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id=bug_id)))
    succeeded(version, detector, "buggy", campaign, [5])
    succeeded(version, detector, "fixed", campaign)
    return version.reproducer.bug


def at(campaign, when):
    Campaign.objects.filter(pk=campaign.pk).update(created_at=when)
    campaign.refresh_from_db()
    return campaign


def test_a_held_out_score_counts_only_campaigns_created_after_the_bug_was_held_out():
    maintainer = MaintainerFactory()
    guard, nan_inf = do_record_detector("param_not_updated"), do_record_detector("nan_inf")
    now = timezone.now()
    before = at(CampaignFactory(name="tuned while public"), now - timedelta(days=2))
    bug = bug_with_a_detection("GH-TIMING-1", guard, before)
    public = bug_with_a_detection("GH-PUBLIC-1", guard, before)
    do_hold_out_bug(bug, acting_user=maintainer)
    Bug.objects.filter(pk=bug.pk).update(held_out_at=now - timedelta(days=1))
    after = at(CampaignFactory(name="after the hold-out"), now - timedelta(hours=12))
    version = bug.reproducers.get().versions.get()
    succeeded(version, nan_inf, "buggy", after, [5])
    succeeded(version, nan_inf, "fixed", after)

    scores = scores_of_runs(Run.objects.all())
    assert scores.of("param_not_updated") == (Split(1, 1, 1), Split())  # its catch predates the hold-out
    assert scores.of("nan_inf") == (Split(), Split(1, 1, 1))
    assert scores.held_out_total == 1
    # a stored evaluation is one campaign: the one that predates the hold-out scores nothing held out
    assert scores_of_evaluation(evaluation_of(before)).held_out == {}
    assert scores_of_evaluation(evaluation_of(after)).of("nan_inf")[1] == Split(1, 1, 1)
    # the same for the leaderboard's selection, whoever reads it, and for the runs of one campaign
    for user in (None, maintainer):
        assert held_out_scores(Results({"campaign": str(before.pk)}, user)).held_out == {}
    # (a campaign that ran only held-out bugs is the maintainers' alone: runners.selectors.visible_campaigns)
    assert held_out_scores(Results({"campaign": str(after.pk)}, maintainer)).held_out_total == 1

    do_publish_bug(bug, acting_user=maintainer)  # public again: every campaign counts, in the public split
    scores = scores_of_runs(Run.objects.all())
    assert scores.of("param_not_updated") == (Split(2, 2, 2), Split()) and scores.held_out_total == 0
    do_hold_out_bug(bug, acting_user=maintainer)  # held out anew: the campaign before is as old as the first
    scores = scores_of_runs(Run.objects.all())
    assert scores.held_out == {} and scores.held_out_total == 0
    assert public.bug_id in {row["bug"] for row in evaluation_of(before).tables["detection"]}


def test_results_md_written_for_everyone_leaves_out_held_out_rows():
    world = build_world()
    from evaluation.models import Evaluation

    text = render(Evaluation.objects.get(pk=world.ids["evaluation"]))
    assert PUBLIC_ID in text and not [marker for marker in MARKERS if marker in text]


def test_the_traincheck_comparison_written_to_docs_leaves_out_held_out_bugs():
    """docs/traincheck-paper.md's data: the benchmark's per-bug figures and the bugs its protocol run lists."""
    from evaluation.models import Evaluation
    from evaluation.traincheck_protocols.measuring import benchmark_figures, measure_runs
    from evaluation.traincheck_protocols.protocol import DETECTOR

    world = build_world()
    evaluation = Evaluation.objects.get(pk=world.ids["evaluation"])
    row = {"detector": DETECTOR, "buggy_runs": 1, "detected_runs": 1, "detected_beyond_fixed_runs": 1}
    evaluation.tables["detection"] += [{**row, "bug": PUBLIC_ID}, {**row, "bug": HELD_ID}]
    figures = benchmark_figures(evaluation)
    assert set(figures["per_bug"]) == {PUBLIC_ID} and figures["bugs"] == 1
    # neither bug has a relation the paper's protocol could state, so nothing runs: both would be listed unstated
    unstated, _, campaigns = measure_runs(None, 0, 1, write=False)
    assert [record["bug"] for record in unstated] == [PUBLIC_ID] and campaigns == []
