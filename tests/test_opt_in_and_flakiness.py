"""Issue 15's headline rules: every detector is labelled drop-in or opt-in, opt-in detectors are ranked apart from
drop-in ones on every surface, the detections that do not tell a bug from its fix are counted per detector, and the
runs that disagree with their bug's verification verdict (or with their other seeds) are listed as flakiness."""
import csv
import io
import re

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from bugs.models import Bug, BugStatus
from evaluation.actions import do_store_evaluation
from evaluation.results_doc import headline, render
from evaluation.tables import flakiness_table
from runners.actions.detectors import do_record_detector
from runners.detectors import all_plugins, base, campaign_plugins
from runners.models import Run

from .factories import (
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EvaluationFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
)
from .helpers import client_for, table

pytestmark = pytest.mark.django_db
TRIGGER = 3


def run(version, detector, variant, alarms=(), seed=0, manifested=None, **fields):
    """A run, succeeded unless ``fields`` say otherwise, with alarms given as {step: rule}; by default it manifests
    exactly when it is buggy."""
    made = RunFactory(reproducer_version=version, detector=do_record_detector(detector), variant=variant, seed=seed,
                      steps=10, trigger_step=TRIGGER, trigger_time=100.0,
                      manifested=(variant == "buggy") if manifested is None else manifested,
                      **{"status": "succeeded", **fields})
    for step, rule in dict(alarms).items():
        AlarmFactory(run=made, step=step, rule=rule, time=100.0 + step - TRIGGER)
    return made


def version_of(bug_id, status=BugStatus.APPROVED):
    return ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id=bug_id, status=status)))


# --- the label ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("integration", ["", "plug-and-play", None])
def test_a_detector_must_say_whether_it_is_drop_in_or_opt_in(monkeypatch, integration):
    monkeypatch.setattr(base, "registered_plugins", {})

    class Unlabelled(base.DetectorPlugin):
        name = "unlabelled"

    if integration is not None:
        Unlabelled.integration = integration
    with pytest.raises(ValueError, match="'unlabelled' sets integration"):
        base.register(Unlabelled)
    assert base.registered_plugins == {}
    Unlabelled.integration = base.OPT_IN
    base.register(Unlabelled)
    assert base.registered_plugins["unlabelled"].integration == "opt-in"


def test_every_registered_detector_is_labelled_and_the_api_says_which():
    plugins = all_plugins()
    assert {name: plugin.integration for name, plugin in plugins.items() if plugin.integration != base.DROP_IN} == {
        "differential": base.OPT_IN}
    assert plugins["plain"].integration == plugins["traincheck"].integration == base.DROP_IN
    listed = client_for().get("/api/detectors/").json()["results"]
    assert {item["name"]: item["integration"] for item in listed} == {
        name: plugin.integration for name, plugin in campaign_plugins().items()}  # the bundle is no campaign's


# --- the headline keeps them apart -------------------------------------------------------------------------------

@pytest.fixture
def opt_in_catches_more():
    """differential catches both bugs beyond the fixed twin; grad_health, drop-in, only the first; traincheck
    catches both but raises the same rule on each fixed twin."""
    first, second = version_of("TEST-A"), version_of("TEST-B")
    for version in (first, second):
        run(version, "differential", "buggy", {4: "mismatch:loss"})
        run(version, "differential", "fixed")
        run(version, "traincheck", "buggy", {5: "invariant"})
        run(version, "traincheck", "fixed", {6: "invariant"})
    run(first, "grad_health", "buggy", {4: "exploding_gradient"})
    run(first, "grad_health", "fixed")
    return first, second


def test_an_opt_in_detector_that_catches_more_does_not_rank_above_a_drop_in_one(client, opt_in_catches_more):
    page = client.get(reverse("leaderboard")).content.decode()
    headline_rows = [(row["Rank"], row["Detector"]) for row in table(page, "leaderboard")]
    assert headline_rows == [("1", "grad_health"), ("2", "traincheck"), ("baseline", "plain")]
    opt_in = table(page, "leaderboard-opt-in")
    assert [(row["Rank"], row["Detector"], row["Bugs caught beyond the fixed twin"]) for row in opt_in] == [
        ("1", "differential", "2/2")]
    assert page.index('id="leaderboard"') < page.index('id="leaderboard-opt-in"')
    assert "Opt-in detectors, ranked apart" in page


def test_the_leaderboard_export_labels_and_orders_the_groups(client, opt_in_catches_more):
    rows = list(csv.DictReader(io.StringIO(client.get("/results/leaderboard.csv").content.decode())))
    assert [(r["rank"], r["detector"], r["integration"]) for r in rows] == [
        ("1", "grad_health", "drop-in"), ("2", "traincheck", "drop-in"), ("1", "differential", "opt-in")]
    latex = client.get("/results/leaderboard.tex").content.decode()
    # two blocks, each ranked from 1 under its label: two rows of rank 1 read as what they are
    drop_in = latex.index(r"\emph{Drop-in detectors (they observe the unmodified program)}")
    opt_in = latex.index(r"\emph{Ranked apart: opt-in detectors (the reproducer computes their reference) and any no "
                         "longer registered}")
    assert drop_in < latex.index("1 & grad\\_health") < opt_in < latex.index("1 & differential")


def test_the_results_page_and_its_tables_carry_the_label(client, opt_in_catches_more):
    page = client.get(reverse("evaluation:results")).content.decode()
    integrations = " ".join(re.search(r'id="integrations">(.*?)</p>', page, re.S).group(1).split())
    assert "<strong>drop-in</strong>: grad_health, traincheck · <strong>opt-in</strong>: differential" in integrations
    assert {row["Detector"]: row["Integration"] for row in table(page, "false-positives")} == {
        "differential": "opt-in", "grad_health": "drop-in", "traincheck": "drop-in"}
    api = client.get("/api/results/").json()
    assert {(row["detector"], row["integration"]) for row in api["detection"]} == {
        ("differential", "opt-in"), ("grad_health", "drop-in"), ("traincheck", "drop-in")}


def test_the_results_document_ranks_the_groups_apart(opt_in_catches_more):
    campaign = CampaignFactory(name="evaluation")
    Run.objects.update(campaign=campaign)
    evaluation = do_store_evaluation(campaign, None, [], [], {"seeds": 1}, 1.0, acting_user=None)
    drop_in, opt_in = headline(evaluation.tables)
    assert "| 1 | grad_health | drop-in | 1/1 | 1/1 | 0/1 runs | 0/1 runs |" in drop_in
    assert "differential" not in drop_in
    assert "| 1 | differential | opt-in | 2/2 | 2/2 | 0/2 runs | 0/2 runs |" in opt_in
    text = render(evaluation)
    assert text.index("| 1 | grad_health |") < text.index("### Opt-in detectors") < text.index("| 1 | differential |")
    assert "| bug | differential (opt-in) | grad_health | traincheck |" in text


# --- =fixed: the detections that do not tell the bug from its fix, and those with no fix to tell them from -------

def test_the_leaderboard_counts_the_detections_whose_rules_the_fixed_twin_raised_too(client, opt_in_catches_more):
    page = client.get(reverse("leaderboard")).content.decode()
    rows = {row["Detector"]: row for row in table(page, "leaderboard")}
    assert rows["traincheck"]["Detected runs, same rule on fixed"] == "2/2"  # twice, each with the twin's rule
    assert rows["traincheck"]["Detected runs, no fixed twin"] == "0/2"  # both twins ran
    assert rows["grad_health"]["Detected runs, same rule on fixed"] == "0/1"
    board = {row["detector"]: row for row in client.get("/results/leaderboard.json").json()}
    assert (board["traincheck"]["same_rule_as_fixed_runs"], board["traincheck"]["no_fixed_twin_runs"],
            board["traincheck"]["detected_runs"]) == (2, 0, 2)


def test_a_detection_whose_fixed_twin_is_missing_or_failed_is_not_counted_as_the_same_rule(client):
    """traincheck's rule fires on the buggy run of seeds 0, 1 and 2; the fixed twin raises it too at seed 0, fails at
    seed 1 and never ran at seed 2. Only seed 0 is noise; seeds 1 and 2 have nothing to be told apart from."""
    version = version_of("TEST-A")
    for seed in range(3):
        run(version, "traincheck", "buggy", {5: "invariant"}, seed=seed)
    run(version, "traincheck", "fixed", {6: "invariant"}, seed=0)
    run(version, "traincheck", "fixed", {6: "invariant"}, seed=1, status="failed")
    page = client.get(reverse("leaderboard")).content.decode()
    row = {row["Detector"]: row for row in table(page, "leaderboard")}["traincheck"]
    assert row["Bugs caught beyond the fixed twin"] == "0/1"
    assert (row["Detected runs, same rule on fixed"], row["Detected runs, no fixed twin"]) == ("1/3", "2/3")
    board = {row["detector"]: row for row in client.get("/results/leaderboard.json").json()}
    assert (board["traincheck"]["same_rule_as_fixed_runs"], board["traincheck"]["no_fixed_twin_runs"]) == (1, 2)
    [cell] = client.get("/api/results/").json()["detection"]
    assert (cell["detected_runs"], cell["detected_beyond_fixed_runs"], cell["detected_without_fixed_twin_runs"]) == (
        3, 0, 2)
    matrix = client.get("/results/matrix.json").json()
    assert [row["traincheck"] for row in matrix] == ["3/3 (=fixed) FA"]  # seed 0's twin repeats the rule
    Run.objects.filter(variant="fixed", seed=0).delete()
    matrix = client.get("/results/matrix.json").json()
    assert [row["traincheck"] for row in matrix] == ["3/3 (no fixed twin)"]  # no detected run has a twin left
    page = client.get(reverse("evaluation:results")).content.decode()
    assert ">no fixed twin</abbr>" in page and ">=fixed</abbr>" not in page


# --- flakiness ---------------------------------------------------------------------------------------------------

@pytest.fixture
def disagreements():
    """A verified bug whose third buggy seed did not manifest and one of whose fixed runs did; a flaky bug whose
    buggy seeds disagree under plain but agree under nan_inf."""
    verified = version_of("TEST-VERIFIED", BugStatus.VERIFIED)
    flaky = version_of("TEST-FLAKY", BugStatus.FLAKY)
    made = {
        "missed": run(verified, "nan_inf", "buggy", seed=2, manifested=False),
        "fixed_manifested": run(verified, "nan_inf", "fixed", seed=1, manifested=True),
        "flaky_yes": run(flaky, "plain", "buggy", seed=0, manifested=True),
        "flaky_no": run(flaky, "plain", "buggy", seed=1, manifested=False),
    }
    agreeing = [run(verified, "nan_inf", "buggy", seed=seed) for seed in (0, 1)]
    agreeing += [run(verified, "nan_inf", "fixed", seed=seed) for seed in (0, 2)]
    agreeing += [run(flaky, "nan_inf", "buggy", seed=seed, manifested=False) for seed in (0, 1)]
    return made, agreeing


def test_runs_that_disagree_with_the_verdict_or_their_seeds_are_listed(disagreements):
    made, agreeing = disagreements
    rows = flakiness_table(Run.objects.all()).to_dict("records")
    assert [(r["run"], r["bug"], r["variant"], r["detector"], r["seed"], r["manifested"], r["expected"],
             r["seeds_manifested"], r["disagrees_with"]) for r in rows] == [
        (made["flaky_yes"].pk, "TEST-FLAKY", "buggy", "plain", 0, True, None, "1/2", "seeds"),
        (made["flaky_no"].pk, "TEST-FLAKY", "buggy", "plain", 1, False, None, "1/2", "seeds"),
        (made["missed"].pk, "TEST-VERIFIED", "buggy", "nan_inf", 2, False, True, "2/3", "verdict"),
        (made["fixed_manifested"].pk, "TEST-VERIFIED", "fixed", "nan_inf", 1, True, False, "1/3", "verdict"),
    ]
    assert not {run.pk for run in agreeing} & {r["run"] for r in rows}


def test_flakiness_is_stored_shown_with_links_and_downloadable(client, disagreements):
    made, _ = disagreements
    campaign = CampaignFactory(name="evaluation")
    Run.objects.update(campaign=campaign)
    evaluation = do_store_evaluation(campaign, None, [], [], {"seeds": 3}, 1.0, acting_user=None)
    assert {row["run"] for row in evaluation.tables["flakiness"]} == {run.pk for run in made.values()}
    page = client.get(reverse("evaluation:results")).content.decode()
    shown = table(page, "flakiness-table")
    assert [row["Run"] for row in shown] == [f"#{made[name].pk}" for name in
                                             ("flaky_yes", "flaky_no", "missed", "fixed_manifested")]
    assert shown[2]["Disagrees with"] == "its bug's verdict (verified)"
    assert shown[0]["Disagrees with"] == "its other seeds"
    assert f'href="{reverse("runners:run", args=[made["missed"].pk])}"' in page
    assert "predates this table" not in page
    rows = list(csv.DictReader(io.StringIO(client.get("/results/flakiness.csv").content.decode())))
    assert [int(r["run"]) for r in rows] == [row["run"] for row in evaluation.tables["flakiness"]]
    assert "## Flakiness" in render(evaluation) and "No run disagreed" not in render(evaluation)


def test_no_disagreement_is_said_not_hidden(client):
    verified = version_of("TEST-STEADY", BugStatus.VERIFIED)
    run(verified, "nan_inf", "buggy")
    run(verified, "nan_inf", "fixed")
    page = client.get(reverse("evaluation:results")).content.decode()
    assert 'id="no-flakiness">No run disagreed' in page


# --- evaluations stored before these tables ----------------------------------------------------------------------

@pytest.fixture
def old_evaluation(disagreements):
    """An evaluation stored before the flakiness table and the labels, with a detector no longer registered."""
    campaign = CampaignFactory(name="evaluation")
    Run.objects.update(campaign=campaign)
    detection = [{"bug": "TEST-VERIFIED", "reproducer": "cpu", "detector": detector, "buggy_runs": 3,
                  "detected_runs": detected, "detected_beyond_fixed_runs": detected, "fixed_runs": 3,
                  "fixed_runs_with_alarm": 0, "pre_trigger_false_alarm_runs": 0,
                  "outcome": "detected" if detected else "missed"}
                 for detector, detected in (("nan_inf", 0), ("crystal_ball", 3), ("differential", 3))]
    return EvaluationFactory(campaign=campaign, parameters={"seeds": 3}, tables={
        "detection": detection, "false_positives": [], "latency": [], "overhead": []})


def test_an_evaluation_stored_before_these_tables_still_renders(client, old_evaluation):
    query = {"evaluation": old_evaluation.pk}
    page = client.get(reverse("evaluation:results"), query).content.decode()
    assert "predates this table" in page and f"--retabulate {old_evaluation.pk}" in page
    assert len(table(page, "flakiness-table")) == 4  # computed from its runs meanwhile
    board = client.get(reverse("leaderboard"), query).content.decode()
    assert [row["Detector"] for row in table(board, "leaderboard")] == ["nan_inf", "plain"]
    assert [row["Detector"] for row in table(board, "leaderboard-opt-in")] == [
        "crystal_ball (no longer registered)", "differential"]
    api = client.get("/api/results/", query).json()
    assert len(api["flakiness"]) == 4 and {r["integration"] for r in api["detection"]} == {
        "drop-in", "opt-in", "not registered"}
    for name in ("flakiness", "leaderboard", "detection"):
        assert client.get(f"/results/{name}.csv", query).status_code == 200
    assert "predates this table" in render(old_evaluation)


def test_retabulating_gives_an_old_evaluation_the_new_tables(old_evaluation, tmp_path):
    results = tmp_path / "results.md"
    call_command("evaluate", "--retabulate", str(old_evaluation.pk), "--results", str(results))
    old_evaluation.refresh_from_db()
    assert len(old_evaluation.tables["flakiness"]) == 4
    assert {row["detector"] for row in old_evaluation.tables["detection"]} == {"nan_inf", "plain"}
    text = results.read_text()
    assert "## Flakiness" in text and "predates this table" not in text and "### Opt-in detectors" in text


def test_a_campaigns_flakiness_follows_its_bugs_verdicts_of_today(client, disagreements):
    """A completed campaign's tables are cached; its flakiness judges by the bugs' current verdicts, so a verdict
    that changes is shown at once."""
    made, _ = disagreements
    campaign = CampaignFactory(name="live", completed_at=timezone.now())
    Run.objects.update(campaign=campaign)

    def disagreement_of_the_missed_run():
        page = client.get(reverse("evaluation:results"), {"campaign": campaign.pk}).content.decode()
        return next(row["Disagrees with"] for row in table(page, "flakiness-table")
                    if row["Run"] == f"#{made['missed'].pk}")

    assert disagreement_of_the_missed_run() == "its bug's verdict (verified)"
    Bug.objects.filter(bug_id="TEST-VERIFIED").update(status=BugStatus.FLAKY)
    assert disagreement_of_the_missed_run() == "its other seeds"
