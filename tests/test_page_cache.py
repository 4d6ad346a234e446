"""What a stored evaluation or a completed campaign makes immutable is computed once and kept in the shared cache
(core/caching.py); whatever could change it is a new key, so no surface ever shows the old numbers: a retabulated
or a newer evaluation, a campaign reopened by a retry, a new stability check. The runs API pages by cursor. The
default cache is files that every process of a host shares."""
import os
import re
import subprocess
import sys

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, Permission
from django.core.cache import cache
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.template import Context, Template
from django.template.loader import render_to_string
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bugs.models import Bug, BugStatus, Reproducer, ReproducerVersion
from core import audit, caching
from core.enums import AuditAction
from evaluation.actions import do_retabulate_evaluation, do_store_evaluation
from evaluation.models import Evaluation, tables_digest_of
from runners.actions.campaigns import do_complete_campaign, do_create_campaign, do_retry_failed_runs
from runners.actions.detectors import do_record_detector
from runners.models import Campaign, Run, RunStatus
from runners.plans import CampaignPlan

from .factories import (
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EnvironmentFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    StabilityCheckFactory,
    UserFactory,
)
from .helpers import client_for, make_runs, table

pytestmark = pytest.mark.django_db
# Every surface that shows an evaluation's numbers, and the false-positive count of param_not_updated on each.
SURFACES = ["/results/", "/leaderboard/", "/results/false-positives.csv", "/results/false-positives.tex",
            "/api/results/", "/results/detection.json", "/"]


def get(client, url):
    """(queries made, the response's text without its per-response nonces)."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(captured), re.sub(r'nonce="[^"]*"', 'nonce=""', response.content.decode())


def completed_evaluation():
    """An evaluation stored over a completed campaign (helpers.make_runs): param_not_updated raised an alarm on
    one of its two clean runs."""
    campaign = CampaignFactory(name="evaluation")
    runs = make_runs(campaign=campaign)
    assert do_complete_campaign(campaign)
    evaluation = do_store_evaluation(campaign, None, [], [], {"seeds": 2}, 1.0, acting_user=None)
    return evaluation, runs


def false_alarms(client, url):
    """The clean runs of param_not_updated with an alarm, as ``url`` shows them."""
    _, body = get(client, url)
    if url == "/results/":
        return table(body, "false-positives")[0]["With alarm"]
    if url == "/leaderboard/":
        return re.search(r"param_not_updated</a>.*?Its clean runs: (\d+) of \d+ alarmed", body, re.S).group(1)
    if url.endswith(".csv"):
        return next(line.split(",")[2] for line in body.splitlines() if line.startswith("param_not_updated,"))
    if url.endswith(".tex"):
        return re.search(r"param\\_not\\_updated & \d+ & (\d+) &", body).group(1)
    if url == "/api/results/":
        return str(next(row for row in client.get(url).json()["false_positives"]
                        if row["detector"] == "param_not_updated")["clean_runs_with_alarm"])
    return str(sum(row["fixed_runs_with_alarm"] for row in client.get(url).json()  # detection.json
                   if row["detector"] == "param_not_updated"))


def test_every_surface_of_a_stored_evaluation_is_computed_once(client):
    completed_evaluation()
    for url in SURFACES:
        cache.clear()  # the surfaces share parts (the tables): each is measured from an empty cache
        first, body = get(client, url)
        again, same = get(client, url)
        assert again < first and same == body, url


def test_a_retabulated_evaluation_shows_its_new_tables_everywhere(client):
    """Retabulating changes the stored tables, not the campaign's completion: the tables' digest is in the key."""
    evaluation, runs = completed_evaluation()
    before = {url: false_alarms(client, url) for url in SURFACES[:-1]}
    assert set(before.values()) == {"1"}
    AlarmFactory(run=runs["clean"], step=5, rule="no_parameter_updated")  # the other clean run alarms too
    do_retabulate_evaluation(evaluation, acting_user=None)
    assert {url: false_alarms(client, url) for url in SURFACES[:-1]} == dict.fromkeys(SURFACES[:-1], "2")


def test_a_newer_evaluation_replaces_the_latest_everywhere(client):
    first, _ = completed_evaluation()
    for url in SURFACES:
        client.get(url)
    campaign = CampaignFactory(name="second")
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-NEW")))
    RunFactory(reproducer_version=version, detector=do_record_detector("nan_inf"), campaign=campaign,
               status="succeeded", trigger_step=1, steps=3, manifested=True)
    assert do_complete_campaign(campaign)
    second = do_store_evaluation(campaign, None, [], [], {"seeds": 1}, 1.0, acting_user=None)
    assert f"Stored tables of evaluation #{second.pk}" in get(client, "/results/")[1]
    assert f'Evaluation <a href="/results/?evaluation={second.pk}">#{second.pk}</a>' in get(client, "/leaderboard/")[1]
    assert f"Evaluation #{second.pk} (" in get(client, "/catalog/")[1]
    assert [row["bug"] for row in client.get("/results/detection.json").json()] == ["TEST-NEW"]
    assert client.get("/api/results/").json()["evaluation"] == second.pk
    assert f"Stored tables of evaluation #{first.pk}" in get(client, f"/results/?evaluation={first.pk}")[1]


def test_an_open_evaluation_campaign_is_judged_live(client):
    """A retry reopens the evaluation's campaign: its runs may change, so nothing of it is cached meanwhile."""
    evaluation, runs = completed_evaluation()
    Run.objects.filter(pk=runs["clean"].pk).update(status=RunStatus.FAILED)
    evaluation.campaign.refresh_from_db()
    do_retry_failed_runs(evaluation.campaign, acting_user=None)
    first, body = get(client, "/results/")
    assert get(client, "/results/")[0] == first and "1 queued" not in body  # computed again, not from the cache



def test_an_evaluation_s_digest_follows_its_tables():
    """The digest that names a stored evaluation's tables in every key is set by each save of them: storing,
    retabulating (the actions), and any other save."""
    evaluation, runs = completed_evaluation()
    stored = evaluation.tables_digest
    assert Evaluation.objects.get(pk=evaluation.pk).tables_digest == stored == tables_digest_of(evaluation.tables)
    AlarmFactory(run=runs["clean"], step=5, rule="no_parameter_updated")
    do_retabulate_evaluation(evaluation, acting_user=None)
    assert Evaluation.objects.get(pk=evaluation.pk).tables_digest not in ("", stored)
    evaluation.wall_seconds = 2.0
    evaluation.save(update_fields=["wall_seconds"])
    assert Evaluation.objects.get(pk=evaluation.pk).tables_digest == tables_digest_of(evaluation.tables)


# --- Pages kept whole: named by the rows of the tables they show ---

def test_the_state_of_rows_changes_with_every_write():
    """PostgreSQL tells each change of a table's rows, update() and deletions included, without reading them; the
    other databases do not, and the pages that use it are then computed as before."""
    bug = BugFactory()
    state = caching.rows_state("bugs.Bug", "bugs.Reproducer")
    if connection.vendor != "postgresql":
        assert state is None
        return
    assert caching.rows_state("bugs.Bug", "bugs.Reproducer") == state
    Bug.objects.filter(pk=bug.pk).update(title="changed")
    changed = caching.rows_state("bugs.Bug", "bugs.Reproducer")
    assert changed[0] != state[0] and changed[1] == state[1]
    Bug.objects.filter(pk=bug.pk).update(title=bug.title)  # the same values again: a new row version all the same
    assert caching.rows_state("bugs.Bug", "bugs.Reproducer")[0] not in (state[0], changed[0])
    again = caching.rows_state("bugs.Bug", "bugs.Reproducer")
    ReproducerFactory(bug=bug)
    assert caching.rows_state("bugs.Bug", "bugs.Reproducer")[1] != again[1]
    Reproducer.objects.all().delete()
    assert caching.rows_state("bugs.Bug", "bugs.Reproducer")[1] == state[1] is None  # an empty table


def test_a_page_is_kept_only_when_none_of_its_parts_may_still_change():
    computed = []

    def page(part_key):
        computed.append(part_key)
        return caching.cached(part_key, lambda: "part")

    assert caching.cached_unless_changing("kept", lambda: page("immutable")) == "part"
    caching.cached_unless_changing("kept", lambda: page("immutable"))
    caching.cached_unless_changing("live", lambda: page(None))
    caching.cached_unless_changing("live", lambda: page(None))
    outer = caching.cached_unless_changing("outer", lambda: caching.cached_unless_changing(
        "inner", lambda: page(None)))  # a live part makes every page around it live
    caching.cached_unless_changing("outer", lambda: computed.append("outer again"))
    assert computed == ["immutable", None, None, None, "outer again"] and outer == "part"

    def kept_inside_a_live_page():  # a kept part, then a live one: the page around both is live
        caching.cached_unless_changing("inner kept", lambda: page("immutable 2"))
        return page(None)

    caching.cached_unless_changing("outer 2", kept_inside_a_live_page)
    caching.cached_unless_changing("outer 2", kept_inside_a_live_page)
    assert computed[5:] == ["immutable 2", None, None]  # the outer page computed twice; the inner part once


def test_a_page_kept_whole_shows_each_change_to_a_row_it_shows(client):
    """update() leaves no trace but the row itself: the results page, the leaderboard and the exports show it."""
    evaluation, _ = completed_evaluation()
    for url in SURFACES:
        client.get(url)
    Evaluation.objects.filter(pk=evaluation.pk).update(parameters={"seeds": 7, "command": "manage.py evaluate-now"})
    assert "7 seeds" in get(client, "/results/")[1]
    assert "manage.py evaluate-now" in get(client, "/leaderboard/")[1]
    assert "7 seeds" in get(client, "/catalog/")[1]
    Bug.objects.filter(bug_id="TEST-A").update(status=BugStatus.SUBMITTED)  # hidden from the public now
    assert "TEST-A" not in get(client, "/results/detection.csv")[1] and "TEST-A" not in get(client, "/catalog/")[1]



def test_a_bug_page_shows_each_change_to_its_runs_and_history(client):
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-PAGE")))
    run = RunFactory(reproducer_version=version, status=RunStatus.QUEUED)
    url = "/bugs/TEST-PAGE/"

    def runs():
        """The status cell of each run listed, newest first (a failed run's reason follows its status)."""
        return [row["Status"] for row in table(get(client, url)[1], "runs")]

    assert runs() == runs() == ["Queued"]
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, failure_reason="out of memory")
    assert runs() == ["Failedout of memory"]
    RunFactory(reproducer_version=version, status=RunStatus.RUNNING)
    assert runs() == ["Running", "Failedout of memory"]
    audit.record(None, AuditAction.DEPRECATE, version.reproducer.bug, "a change of the bug's history")
    assert "a change of the bug&#x27;s history" in get(client, url)[1]



def test_a_kept_bug_page_carries_each_request_s_own_nonce(client):
    """The bug page's plot needs plotly's style element under the request's nonce: it is drawn around the kept
    content at each request, never kept in it (another request's nonce would be refused by this one's policy)."""
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-NONCE")))
    StabilityCheckFactory(reproducer_version=version)
    for _ in range(2):
        response = client.get("/bugs/TEST-NONCE/")
        nonce = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"])[1]
        page = response.content.decode()
        assert 'class="plot" data-figure=' in page  # the stability chart
        assert set(re.findall(r'nonce="([^"]*)"', page)) == {nonce}
        assert '<style id="plotly.js-style-global" nonce="' in page


def test_only_a_page_s_title_and_content_are_kept(rf):
    """The leaderboard's blocks are kept and placed in templates/page.html; a page with scripts (which carry the
    request's nonce) is refused rather than shown without them."""
    request = rf.get("/")
    request.user = AnonymousUser()
    blocks = caching.rendered_blocks("evaluation/leaderboard.html", {"summary": {}}, request)
    assert set(blocks) == {"title", "content"} and blocks["title"] == "Leaderboard"
    with pytest.raises(ValueError, match="scripts"):
        caching.rendered_blocks("evaluation/results.html", {}, request)



def test_a_page_kept_whole_follows_its_reader_s_permissions(client):
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-PERM")))
    user = UserFactory()
    client.force_login(user)
    assert "New campaign" not in get(client, "/bugs/TEST-PERM/")[1]
    user.user_permissions.add(Permission.objects.get(codename="trigger_campaign"))
    assert "New campaign" in get(client, "/bugs/TEST-PERM/")[1]
    client.logout()
    assert "New campaign" not in get(client, "/bugs/TEST-PERM/")[1]


# --- Completed campaigns ---

def campaign_with_a_failure():
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-CAMPAIGN")))
    campaign = do_create_campaign("c", CampaignPlan.build([version], [do_record_detector("nan_inf")], seeds=[0, 1]),
                                  enqueue=False, acting_user=None)
    Run.objects.filter(campaign=campaign).update(status=RunStatus.SUCCEEDED, environment=EnvironmentFactory(
        host="host-one"))
    failed = campaign.runs.order_by("id").first()
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.FAILED, failure_kind="time_limit",
                                            failure_reason="Over its time limit.")
    assert do_complete_campaign(campaign)
    return campaign, failed


def progress(page):
    """The campaign page's line of counts by status."""
    return page.split('id="campaign-progress"', 1)[1].split("</p>", 1)[0]


def finished(client):
    """The campaign list's "finished / runs" of each campaign."""
    return re.findall(r"(\d+ / \d+) runs", get(client, "/campaigns/")[1])


def test_a_bug_page_reads_the_runs_of_open_campaigns_and_shows_a_retry(client):
    """A completed campaign's runs change only by a retry, which reopens it: the bug page shows the retried run."""
    campaign, failed = campaign_with_a_failure()
    url = "/bugs/TEST-CAMPAIGN/"
    assert get(client, url)[1] == get(client, url)[1] and "Over its time limit." in get(client, url)[1]
    do_retry_failed_runs(campaign, acting_user=None)
    assert "Over its time limit." not in table(get(client, url)[1], "runs")[0]["Status"]
    assert [row["Status"] for row in table(get(client, url)[1], "runs")].count("Queued") == 1
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.RUNNING)  # the campaign is open: read at each request
    assert [row["Status"] for row in table(get(client, url)[1], "runs")].count("Running") == 1


def test_a_completed_campaign_is_counted_once_until_a_retry_reopens_it(client):
    campaign, failed = campaign_with_a_failure()
    url = f"/campaigns/{campaign.pk}/"
    first, body = get(client, url)
    again, same = get(client, url)
    assert again < first and same == body
    assert "3 succeeded" in body and "1 failed" in body and "host-one" in body and "Over its time limit." in body
    assert finished(client) == ["4 / 4"]

    do_retry_failed_runs(campaign, acting_user=None)  # open again: the failed run is queued
    reopened = progress(get(client, url)[1])
    assert "1 queued" in reopened and "failed" not in reopened
    assert finished(client) == ["3 / 4"]
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.SUCCEEDED, environment=EnvironmentFactory(
        host="host-two"))
    assert do_complete_campaign(campaign)
    done = get(client, url)[1]
    assert "4 succeeded" in progress(done) and "failed" not in progress(done) and "host-two" in done
    rows = table(done, "runs")
    assert [row["Status"] for row in rows] == ["Succeeded"] * 4


def test_the_campaigns_api_counts_a_reopened_campaign_anew(client):
    campaign, failed = campaign_with_a_failure()
    progress = client.get("/api/campaigns/").json()["results"][0]["progress"]
    assert progress["counts"]["failed"] == 1 and progress["done"] == 4
    do_retry_failed_runs(campaign, acting_user=None)
    progress = client.get("/api/campaigns/").json()["results"][0]["progress"]
    assert progress["counts"]["failed"] == 0 and progress["counts"]["queued"] == 1 and progress["done"] == 3


def test_a_new_stability_check_is_drawn(client):
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-STABLE")))
    StabilityCheckFactory(reproducer_version=version, environment=EnvironmentFactory(host="first-host"))
    url = "/bugs/TEST-STABLE/"
    assert "first-host" in get(client, url)[1] and "second-host" not in get(client, url)[1]
    StabilityCheckFactory(reproducer_version=version, environment=EnvironmentFactory(host="second-host"))
    assert "second-host" in get(client, url)[1]


# --- Rendered once for the same content: parts of pages named by what was read ---

class Probe:
    """Counts the renderings of a fragment that shows it."""

    def __init__(self):
        self.renderings = 0

    def __str__(self):
        self.renderings += 1
        return str(self.renderings)


def test_a_fragment_is_rendered_once_for_the_same_rows():
    bug = Bug.objects.get(pk=BugFactory(title="first").pk)  # as a page reads it
    page = Template("{% load fragments %}{% cached_fragment 'test' bug live %}{{ probe }} {{ bug.title }}"
                    "{% endcached_fragment %}")
    probe = Probe()

    def render(bug, live="no"):
        return page.render(Context({"probe": probe, "bug": bug, "live": live}))

    assert render(bug) == "1 first" and render(Bug.objects.get(pk=bug.pk)) == "1 first"
    Bug.objects.filter(pk=bug.pk).update(title="second")  # as an update() does: updated_at stays as it was
    assert render(Bug.objects.get(pk=bug.pk)) == "2 second"
    assert render(bug, live=None) == "3 first" and render(bug, live=None) == "4 first"  # None: what may still change


def test_what_was_read_names_the_related_rows_and_reads_nothing_more():
    version = ReproducerVersionFactory()
    bugs = Bug.objects.prefetch_related("reproducers__versions")
    before = caching.digest(caching.loaded_state(bugs.get(pk=version.reproducer.bug_id)))  # children point back
    assert caching.digest(caching.loaded_state(bugs.get(pk=version.reproducer.bug_id))) == before
    ReproducerVersion.objects.filter(pk=version.pk).update(review_state="rejected")
    assert caching.digest(caching.loaded_state(bugs.get(pk=version.reproducer.bug_id))) != before
    deferred = Bug.objects.only("bug_id").get(pk=version.reproducer.bug_id)
    with CaptureQueriesContext(connection) as captured:
        assert "title" not in dict(caching.loaded_state(deferred)[1:])
    assert len(captured) == 0


def test_the_catalog_shows_each_change_to_its_rows(client):
    evaluation, runs = completed_evaluation()
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-C", title="first")))

    def rows():
        return {row["ID"]: row for row in table(get(client, "/catalog/")[1], "bug-list")}

    assert rows() == rows() and rows()["TEST-A"]["Caught by"] == "param_not_updated"
    assert rows()["TEST-C"]["Title"] == "first" and rows()["TEST-C"]["Stability"] == "not verified"
    Bug.objects.filter(bug_id="TEST-C").update(title="second")  # updated_at stays as it was
    StabilityCheckFactory(reproducer_version=version, seeds=3, buggy_manifested=2)
    AlarmFactory(run=runs["clean"], step=5, rule="no_parameter_updated")  # now on the fixed twin too
    do_retabulate_evaluation(evaluation, acting_user=None)
    changed = rows()
    assert changed["TEST-C"]["Title"] == "second" and changed["TEST-C"]["Stability"].startswith("Flaky 2/3")
    assert changed["TEST-A"]["Caught by"] == "none"


def test_the_bugs_api_shows_each_change_to_a_bug(client):
    reproducer = ReproducerFactory(bug=BugFactory(bug_id="TEST-API", title="first"))
    ReproducerVersionFactory(reproducer=reproducer)

    def listed():
        return client.get("/api/bugs/").json()["results"]

    assert listed() == listed() and listed()[0]["title"] == "first"
    Bug.objects.filter(bug_id="TEST-API").update(title="second")
    Reproducer.objects.filter(pk=reproducer.pk).update(fidelity_note="changed")  # as a new version's manifest does
    pending = ReproducerVersionFactory(reproducer=reproducer, files={"repro.py": "print(2)\n"}, review_state="pending")
    [bug] = listed()
    assert bug["title"] == "second" and bug["reproducers"][0]["fidelity_note"] == "changed"
    assert len(bug["reproducers"][0]["versions"]) == 1  # the pending version is not the public's
    ReproducerVersion.objects.filter(pk=pending.pk).update(review_state="approved")
    assert len(listed()[0]["reproducers"][0]["versions"]) == 2


def test_a_bug_judged_from_a_running_campaign_shows_each_run_as_it_finishes(client):
    """No stored evaluation ran the bug: its page judges the latest campaign's runs of it, once for the same runs."""
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-LIVE")))
    campaign, guard = CampaignFactory(), do_record_detector("param_not_updated")  # not completed: still running

    def run(seed, **fields):
        return RunFactory(reproducer_version=version, detector=guard, campaign=campaign, seed=seed, steps=10,
                          trigger_step=3, **fields)

    AlarmFactory(run=run(0, status="succeeded", manifested=True, finished_at=timezone.now()), step=5,
                 rule="no_parameter_updated")
    running = run(1, status="running")

    def detected():
        return table(get(client, "/bugs/TEST-LIVE/")[1], "bug-detections")[0]["Detected / buggy runs"]

    assert detected() == "1/1" and detected() == "1/1"
    Run.objects.filter(pk=running.pk).update(status=RunStatus.SUCCEEDED, manifested=True, finished_at=timezone.now())
    assert detected() == "1/2"
    AlarmFactory(run=running, step=4, rule="no_parameter_updated")  # retried, it finished again with an alarm
    Run.objects.filter(pk=running.pk).update(attempts=2, finished_at=timezone.now())
    assert detected() == "2/2"


# --- The runs API: pages by cursor ---

def test_the_runs_api_pages_by_cursor_at_the_same_cost(client):
    version = ReproducerVersionFactory()
    RunFactory.create_batch(120, reproducer_version=version, detector=do_record_detector("plain"))
    seen, url, costs = [], "/api/runs/", []
    while url:
        with CaptureQueriesContext(connection) as captured:
            page = client.get(url).json()
        costs.append(len(captured))
        assert "count" not in page  # a count would read every matching run
        seen += [run["id"] for run in page["results"]]
        url = page["next"]
    assert [len(seen), len(set(seen))] == [120, 120] and seen == sorted(seen, reverse=True)
    assert len(set(costs)) == 1
    assert all("OFFSET" not in query["sql"].upper() for query in captured.captured_queries)
    last = client.get(client.get(client.get("/api/runs/").json()["next"]).json()["previous"]).json()
    assert [run["id"] for run in last["results"]] == seen[:50]


def test_a_runs_api_page_is_rendered_once_for_its_runs_state_and_address(client):
    """A page of runs seen before is read from the cache as rendered: no run read whole, no serializing; a change
    to one of its runs, another address (its cursor links are absolute) or another format is another key."""
    RunFactory.create_batch(50, detector=do_record_detector("plain"))
    runs = RunFactory.create_batch(3, detector=do_record_detector("plain"), status=RunStatus.QUEUED)  # the newest
    first, body = get(client, "/api/runs/")
    again, same = get(client, "/api/runs/")
    assert again < first and same == body
    Run.objects.filter(pk=runs[-1].pk).update(status=RunStatus.RUNNING, started_at=timezone.now())
    changed = client.get("/api/runs/").json()["results"]
    assert [run["status"] for run in changed if run["id"] == runs[-1].pk] == ["running"]
    assert client.get("/api/runs/", secure=True).json()["next"].startswith("https://testserver/api/runs/?cursor=")
    assert client.get("/api/runs/").json()["next"].startswith("http://testserver/")
    browsable = client.get("/api/runs/?format=api", HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200 and browsable["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("first", ["public", "maintainer"])
def test_a_kept_runs_page_links_each_reader_to_their_own_next_page(first):
    """The same 50 runs are one page for the public and a maintainer, but only the maintainer has a next page: the
    5 runs of a held-out bug before them. Whoever asks first, neither gets the other's links: the maintainer is
    not cut off from the held-out runs, the public is not told that hidden runs exist."""
    held_out = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(held_out=True)))
    RunFactory.create_batch(5, reproducer_version=held_out, detector=do_record_detector("plain"))
    RunFactory.create_batch(50, detector=do_record_detector("plain"))
    readers = {"public": client_for(), "maintainer": client_for(MaintainerFactory())}
    order = [first, *(reader for reader in readers if reader != first)]
    pages = {reader: readers[reader].get("/api/runs/").json() for reader in order}
    assert [run["id"] for run in pages["public"]["results"]] == [run["id"] for run in pages["maintainer"]["results"]]
    assert pages["public"]["next"] is None and pages["maintainer"]["next"] is not None


def test_the_campaign_list_shows_each_change_to_its_campaigns_and_their_runs(client, monkeypatch):
    """The list's content is kept for the same campaigns, run counts and creators: a live campaign's progress, a
    renamed campaign or creator and a new campaign each show at once. An empty list and a campaign with no creator
    (the operator's) have a state too."""
    import runners.views

    rendered = []
    monkeypatch.setattr(runners.views, "render_to_string", lambda *args: rendered.append(args) or (
        render_to_string(*args)))
    assert "No campaigns yet" in get(client, "/campaigns/")[1]
    creator = UserFactory(username="ada")
    live = CampaignFactory(name="sweep", created_by=creator)
    run = RunFactory(campaign=live, status=RunStatus.QUEUED)
    CampaignFactory(name="by the operator", created_by=None)
    body = get(client, "/campaigns/")[1]
    assert "0 / 1 runs" in body and "ada" in body and "by the operator" in body
    before = len(rendered)
    assert get(client, "/campaigns/")[1] == body
    assert len(rendered) == before + (connection.vendor != "postgresql")  # only PostgreSQL tells the rows' state
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    assert "1 / 1 runs" in get(client, "/campaigns/")[1]
    Campaign.objects.filter(pk=live.pk).update(name="nightly sweep")
    type(creator).objects.filter(pk=creator.pk).update(username="ada-l")
    body = get(client, "/campaigns/")[1]
    assert "nightly sweep" in body and "ada-l" in body
    CampaignFactory(name="newest")
    assert "newest" in get(client, "/campaigns/")[1]


def test_the_runs_of_one_campaign_page_by_cursor(client):
    """The campaign filter bounds the IDs by the campaign's newest run; every run of it, and only those, comes."""
    old, new = CampaignFactory(), CampaignFactory()
    for n in range(60):
        RunFactory(campaign=old if n % 3 else new, detector=do_record_detector("plain"))
    RunFactory(detector=do_record_detector("plain"))  # newer than all, in no campaign
    seen, url = [], f"/api/runs/?campaign={old.pk}&detector__name=plain"
    while url:
        page = client.get(url).json()
        seen += [(run["id"], run["campaign"]) for run in page["results"]]
        url = page["next"]
    assert seen == [(pk, old.pk) for pk in old.runs.order_by("-id").values_list("id", flat=True)] and len(seen) == 40
    assert client.get("/api/runs/?campaign=999999").status_code == 400  # no such campaign, as before


# --- The cache itself ---

def test_the_file_cache_is_shared_and_makes_its_folder_on_first_write(tmp_path):
    folder = tmp_path / "cache"
    one, other = caching.FileCache(folder, {}), caching.FileCache(folder, {})  # as two processes open it
    assert one.get("key") is None and not folder.exists()
    one.set("key", {"tables": [1, 2]})
    assert other.get("key") == {"tables": [1, 2]}


def test_the_file_cache_drops_entries_past_its_limit(tmp_path, monkeypatch):
    """It lists its folder on one write in CULL_EVERY (here every write) and drops a third past MAX_ENTRIES."""
    monkeypatch.setattr(caching.FileCache, "CULL_EVERY", 1)
    files = caching.FileCache(tmp_path / "cache", {"OPTIONS": {"MAX_ENTRIES": 9}})
    for n in range(30):
        files.set(f"key-{n}", n)
    assert len(list((tmp_path / "cache").iterdir())) <= 9 and files.get("key-29") == 29


def test_another_version_of_the_code_computes_anew(monkeypatch):
    computed = []
    monkeypatch.setattr(caching, "code_version", lambda: "one")
    assert caching.cached("k", lambda: computed.append(1) or "first") == "first"
    assert caching.cached("k", lambda: computed.append(2) or "again") == "first"
    monkeypatch.setattr(caching, "code_version", lambda: "two")
    assert caching.cached("k", lambda: computed.append(3) or "new") == "new"
    assert caching.cached(None, lambda: computed.append(4) or "live") == "live"
    assert computed == [1, 3, 4]


def test_a_question_is_asked_once_per_reading_request():
    asked = []

    @caching.per_request
    def question(user):
        asked.append(user)
        return len(asked)

    def send(signal, **arguments):
        """A request's signal, as Django's test client sends it (without closing the test's database connection)."""
        signal.disconnect(close_old_connections)
        try:
            signal.send(sender=None, **arguments)
        finally:
            signal.connect(close_old_connections)

    assert [question(None), question(None)] == [1, 2]  # outside a request: every time
    send(request_started, environ={"REQUEST_METHOD": "GET"})
    assert [question(None), question(None), question("someone"), question(None)] == [3, 3, 4, 3]
    send(request_finished)
    assert question(None) == 5
    send(request_started, environ={"REQUEST_METHOD": "POST"})  # it may change what the answer depends on
    assert [question(None), question(None)] == [6, 7]
    send(request_finished)


def check(tmp_path, **variables):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DJANGO_", "SILENTBENCH_", "DATABASE_URL", "CELERY_"))}
    script = ("import django; django.setup(); from django.conf import settings; "
              "print(settings.CACHES['default']['BACKEND'], settings.CACHES['default']['LOCATION'])")
    return subprocess.run([sys.executable, "-c", script], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          env={**env, "DJANGO_SETTINGS_MODULE": "benchmark_site.settings",
                               "SILENTBENCH_VAR_DIR": str(tmp_path), **variables}, timeout=120)


def test_the_cache_is_files_under_the_var_directory_or_the_redis_named(tmp_path):
    assert check(tmp_path).stdout.split() == ["core.caching.FileCache", str(tmp_path / "cache")]
    redis = check(tmp_path, DJANGO_CACHE_URL="redis://127.0.0.1:6379/11")
    assert redis.stdout.split() == ["django.core.cache.backends.redis.RedisCache", "redis://127.0.0.1:6379/11"]
    refused = check(tmp_path, DJANGO_CACHE_URL="memcached://127.0.0.1:11211")
    assert refused.returncode != 0 and "DJANGO_CACHE_URL='memcached://127.0.0.1:11211' is not a Redis URL" in (
        refused.stderr.strip().splitlines()[-1])
