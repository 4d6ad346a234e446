"""The open leaderboard: one ranked entry per approved detector version, built in or submitted, scored on its own
campaign (or, for a built-in without one, the published evaluation), with its public and held-out scores apart,
its history, a citation and what exactly it was scored on; and its exports, LaTeX compiled."""
import csv
import io
import json

import pytest
from django.core.management import call_command
from django.utils import timezone

from bugs.actions import do_hold_out_bug, do_publish_bug
from bugs.models import Bug
from core.enums import ReviewState
from evaluation.actions import run_tables
from evaluation.entries import entries_export, open_entries
from evaluation.tables import UNREGISTERED, integration_of
from runners.actions.detectors import do_record_submitted_detector
from runners.models import CampaignPurpose, DetectorVersion

from .factories import (
    AlarmFactory,
    CampaignFactory,
    EnvironmentFactory,
    EvaluationFactory,
    MaintainerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)
from .helpers import make_runs

pytestmark = pytest.mark.django_db

SUBMITTED = '''from runners.detectors.base import DROP_IN, DetectorPlugin


class StepWatch(DetectorPlugin):
    name = "step_watch"
    version = "2"
    integration = DROP_IN

    def install(self, probe):
        pass
'''


@pytest.fixture
def board():
    """A published evaluation of the built-ins (helpers.make_runs: param_not_updated catches TEST-A beyond its fixed
    twin) and a researcher's approved step_watch 2, scored by a completed scoring campaign in which it caught TEST-A
    and TEST-B (an alarm after the trigger, nothing on the fixed run); a maintainer had held TEST-B out before."""
    campaign = CampaignFactory(name="evaluation")
    make_runs(campaign=campaign, environment=EnvironmentFactory(torch="2.13.0+cpu"))
    evaluation = EvaluationFactory(campaign=campaign, tables=run_tables(campaign.runs.all()))
    researcher = UserFactory(username="grace")
    version = DetectorVersion.objects.create(
        name="step_watch", version="2", code=SUBMITTED, code_hash="ab" * 32, submitted_by=researcher,
        interface={"integration": "drop-in"}, description="Watches steps.", link="https://example.org/paper",
        review_state=ReviewState.APPROVED, reviewed_at=timezone.now())
    record = do_record_submitted_detector(version)
    maintainer = MaintainerFactory()
    first, second = (Bug.objects.get(bug_id=bug_id) for bug_id in ("TEST-A", "TEST-B"))
    do_hold_out_bug(second, acting_user=maintainer)
    scoring = CampaignFactory(name="scoring step_watch 2", purpose=CampaignPurpose.SCORING)
    for bug in (first, second):
        reproducer_version = bug.reproducers.first().versions.first()
        for variant, alarm in (("buggy", True), ("fixed", False)):
            run = RunFactory(campaign=scoring, reproducer_version=reproducer_version, detector=record,
                             variant=variant, status="succeeded", steps=10, trigger_step=3, trigger_time=100.0,
                             manifested=variant == "buggy", environment=EnvironmentFactory(torch="2.13.0+cpu"),
                             step_records=[{"step": s, "rank": 0, "loss": 1.0, "time": 100.0 + s} for s in range(10)])
            if alarm:
                AlarmFactory(run=run, step=4, rule="step_watch", message="late", time=104.0)
    pipeline = ReproducerVersionFactory(reproducer__bug=None, reproducer__name="clean-mlp")
    RunFactory(campaign=scoring, reproducer_version=pipeline, detector=record, variant="fixed", status="succeeded",
               steps=10, step_records=[{"step": s, "rank": 0, "loss": 1.0, "time": 100.0 + s} for s in range(10)])
    scoring.completed_at = timezone.now()
    scoring.save()
    return {"evaluation": evaluation, "version": version, "scoring": scoring, "maintainer": maintainer,
            "researcher": researcher}


def test_every_approved_version_is_ranked_on_its_own_scoring(board):
    ranked, opt_in, baseline = open_entries(None)
    by_name = {entry.name: entry for entry in ranked}
    mine = by_name["step_watch"]
    assert mine.campaign == board["scoring"] and mine.evaluation is None and mine.recorded_code
    assert (mine.public.beyond_fixed, mine.public.bugs) == (1, 1)  # TEST-A
    assert (mine.held_out.beyond_fixed, mine.held_out_total) == (1, 1)  # TEST-B, counted, never named
    assert mine.submitter == "grace" and mine.standing.false_positives["clean_runs"] == 3  # 2 fixed runs, 1 pipeline
    builtin = by_name["param_not_updated"]
    assert builtin.evaluation == board["evaluation"] and builtin.version.builtin and builtin.recorded_code
    assert baseline.name == "plain" and baseline.rank is None and "plain" not in by_name
    assert [entry.rank for entry in ranked] == sorted(entry.rank for entry in ranked)
    citation = mine.citation()
    assert f"scoring campaign #{board['scoring'].pk}" in citation and "code sha256 abababab" in citation
    assert "seeds 0" in citation and "torch 2.13.0+cpu" in citation and "(grace)" in citation


def test_a_built_in_entry_credits_the_code_its_runs_recorded(board):
    """A built-in module edited after the evaluation is a new version that never ran there: the evaluation's numbers
    stay with the version its runs recorded, and the new one waits for a scoring of its own."""
    ran = next(entry for entry in open_entries(None)[0] if entry.name == "param_not_updated").version
    edited = DetectorVersion.objects.create(
        name="param_not_updated", version=ran.version, code=ran.code + "\n# edited\n", code_hash="ef" * 32,
        builtin=True, interface=ran.interface, review_state=ReviewState.APPROVED, reviewed_at=timezone.now())
    entries = [entry for entry in open_entries(None)[0] if entry.name == "param_not_updated"]
    assert [(entry.version, entry.recorded_code) for entry in entries] == [(ran, True)]
    assert edited not in [entry.version for entry in entries]


def test_a_submitted_detector_is_labelled_by_its_declared_integration(client, board):
    """The results' tables know a submitted detector's integration from its approved code, not "not registered":
    ranked with the drop-in detectors of its campaign."""
    assert integration_of("step_watch") == "drop-in" and integration_of("never_submitted") == UNREGISTERED
    page = client.get(f"/leaderboard/?campaign={board['scoring'].pk}").content.decode()
    ranking = page[page.index('<table id="leaderboard"'):]
    assert ">step_watch</a>" in ranking[:ranking.index("</table>")]


def test_a_bug_held_out_after_the_scoring_counts_only_in_a_later_campaign(board):
    """Held out again after the scoring campaign was made, TEST-B counts in neither split of it (a detector may have
    been tuned on it while it was public); a rescore made afterwards counts it in the held-out split."""
    second = Bug.objects.get(bug_id="TEST-B")
    do_publish_bug(second, acting_user=board["maintainer"])
    do_hold_out_bug(Bug.objects.get(pk=second.pk), acting_user=board["maintainer"])
    mine = next(entry for entry in open_entries(None)[0] if entry.name == "step_watch")
    assert (mine.public.bugs, mine.held_out_total) == (1, 0)
    rescore = CampaignFactory(name="rescore", purpose=CampaignPurpose.SCORING)
    record = do_record_submitted_detector(board["version"])
    for bug in (Bug.objects.get(bug_id="TEST-A"), second):  # the whole corpus again: caught on the held-out one
        for variant in ("buggy", "fixed"):
            run = RunFactory(campaign=rescore, reproducer_version=bug.reproducers.first().versions.first(),
                             detector=record, variant=variant, status="succeeded", steps=10, trigger_step=3,
                             trigger_time=100.0, manifested=variant == "buggy",
                             step_records=[{"step": s, "rank": 0, "loss": 1.0, "time": 100.0 + s} for s in range(10)])
            if variant == "buggy" and bug == second:
                AlarmFactory(run=run, step=5, rule="step_watch", message="late", time=105.0)
    rescore.completed_at = timezone.now()
    rescore.save()
    mine = next(entry for entry in open_entries(None)[0] if entry.name == "step_watch")
    assert mine.campaign == rescore
    assert (mine.public.beyond_fixed, mine.public.bugs, mine.held_out.beyond_fixed, mine.held_out_total) == (0, 1, 1, 1)


def test_the_pages_show_entries_history_citation_and_what_was_scored(client, board):
    page = client.get("/leaderboard/").content.decode()
    assert 'id="open-leaderboard"' in page and "step_watch" in page and "grace" in page
    assert f'href="/leaderboard/entries/{board["version"].pk}/"' in page and "/leaderboard/entries.tex" in page
    entry = client.get(f"/leaderboard/entries/{board['version'].pk}/").content.decode()
    assert "sha256 " + "ab" * 32 in entry and f"scoring campaign #{board['scoring'].pk}" in entry
    assert "TEST-A" in entry and "TEST-B" not in entry and "1 more that you may not see" in entry
    assert "TEST-B" in client_as(client, board["maintainer"]).get(
        f"/leaderboard/entries/{board['version'].pk}/").content.decode()
    client.logout()
    history = client.get("/detectors/step_watch/").content.decode()
    assert ">2</a>" in history and "grace" in history and "Not a built-in detector" in history
    assert client.get("/detectors/nothing_here/").status_code == 404
    assert client.get("/leaderboard/entries/999999/").status_code == 404
    published = client.get(f"/leaderboard/?evaluation={board['evaluation'].pk}").content.decode()
    assert 'id="open-leaderboard"' not in published


def test_a_pending_version_is_in_its_submitter_s_history_only(client, board):
    DetectorVersion.objects.create(name="step_watch", version="3", code=SUBMITTED + "\n", code_hash="cd" * 32,
                                   submitted_by=board["researcher"], interface={"integration": "drop-in"})
    assert ">3<" not in client.get("/detectors/step_watch/").content.decode()
    client_as(client, board["researcher"])
    assert "Waiting for review" in client.get("/detectors/step_watch/").content.decode()


def test_the_entries_export_in_every_format(client, board, tmp_path):
    from .test_latex import compiled

    rows = list(csv.DictReader(io.StringIO(client.get("/leaderboard/entries.csv").content.decode())))
    mine = next(row for row in rows if row["detector"] == "step_watch")
    assert (mine["public_beyond_fixed"], mine["public_bugs"], mine["code_sha256"]) == ("1", "1", "ab" * 32)
    assert [row["rank"] for row in rows][-1] == "baseline"
    assert json.loads(client.get("/leaderboard/entries.json").content)[0]["citation"].startswith(rows[0]["detector"])
    assert "| step_watch |" in client.get("/leaderboard/entries.md").content.decode()
    latex = client.get("/leaderboard/entries.tex").content.decode()
    assert r"\label{tab:silentbench-open-leaderboard}" in latex and r"\toprule" in latex
    text, pages = compiled(latex, tmp_path)
    assert pages == 1 and "step watch" in text.replace("_", " ") and "open leaderboard" in text
    out = io.StringIO()
    call_command("export", "entries", "--format", "csv", stdout=out)
    assert out.getvalue() == entries_export().text("csv")
    assert client.get("/leaderboard/entries.xls").status_code == 404


def client_as(client, user):
    client.force_login(user)
    return client
