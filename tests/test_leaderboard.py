"""The leaderboard (/leaderboard/) and its box on the catalog page: ranking by bugs caught beyond the fixed twin,
the cells, plain as the baseline, links to the runs behind each number, and what each role may count."""
import re
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from bugs.models import BugStatus
from core.enums import ReviewState
from evaluation.models import SensitivityEvaluation
from runners.actions.detectors import do_record_detector
from runners.models import CampaignPurpose

from .factories import (
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EnvironmentFactory,
    EvaluationFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    UserFactory,
)
from .helpers import table

pytestmark = pytest.mark.django_db
TRIGGER = 3


def run(version, detector, variant, alarms=(), seed=0, **fields):
    """A run, succeeded unless ``fields`` say otherwise, with alarms given as {step: rule}."""
    made = RunFactory(reproducer_version=version, detector=do_record_detector(detector), variant=variant, seed=seed,
                      steps=10, trigger_step=TRIGGER, trigger_time=100.0, manifested=variant == "buggy",
                      **{"status": "succeeded", **fields})
    for step, rule in dict(alarms).items():
        AlarmFactory(run=made, step=step, rule=rule, time=100.0 + (step - TRIGGER) / 2)
    return made


def version_of(bug_id, **bug_fields):
    return ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id=bug_id, **bug_fields)))


@pytest.fixture
def runs():
    """Two bugs. traincheck detects both, but its rule fires on each fixed twin too; grad_health detects one bug
    with a rule its fixed twin does not raise; nan_inf detects nothing; plain runs both."""
    environment = EnvironmentFactory(torch="2.13.0+cpu")
    first, second = version_of("TEST-A"), version_of("TEST-B")
    for version in (first, second):
        run(version, "traincheck", "buggy", {5: "invariant"}, environment=environment)
        run(version, "traincheck", "fixed", {6: "invariant"}, environment=environment)
        run(version, "nan_inf", "buggy", environment=environment, seed=1)
        run(version, "nan_inf", "fixed", environment=environment, seed=1)
        run(version, "plain", "buggy", environment=environment)
        run(version, "plain", "fixed", environment=environment)
    run(first, "grad_health", "buggy", {4: "exploding_gradient"}, environment=environment)
    run(first, "grad_health", "fixed", environment=environment)
    run(second, "grad_health", "buggy", environment=environment)
    run(second, "grad_health", "fixed", environment=environment)
    return first, second


def rows_by_detector(page):
    return {row["Detector"]: row for row in table(page, "leaderboard")}


def hrefs(page, detector):
    """The links of a detector's row of the selection's ranking (table ``leaderboard``), in column order."""
    ranking = re.search(r'<table id="leaderboard".*?</table>', page, re.S).group(0)
    row = re.search(rf"<tr[^>]*><td>[^<]*</td>\s*<td><a [^>]*>{detector}</a>.*?</tr>", ranking, re.S).group(0)
    return [unescape(href) for href in re.findall(r'href="([^"]+)"', row)]


def test_a_detector_that_also_fires_on_the_fixed_twin_ranks_below_one_that_does_not(client, runs):
    page = client.get(reverse("leaderboard")).content.decode()
    rows = rows_by_detector(page)
    ranked = [row["Detector"] for row in table(page, "leaderboard") if row["Rank"] != "baseline"]
    assert ranked == ["grad_health", "traincheck", "nan_inf"]
    assert (rows["grad_health"]["Rank"], rows["traincheck"]["Rank"], rows["nan_inf"]["Rank"]) == ("1", "2", "2")
    assert rows["traincheck"]["Bugs caught"] == "2/2"  # caught more, but tells no bug from its fix
    assert rows["traincheck"]["Bugs caught beyond the fixed twin"] == "0/2"
    assert rows["grad_health"]["Bugs caught"] == rows["grad_health"]["Bugs caught beyond the fixed twin"] == "1/2"
    assert rows["traincheck"]["FP rate per clean run [Wilson 95%]"] == "1.0 [0.342, 1.0]"
    assert rows["grad_health"]["FP rate per clean run [Wilson 95%]"] == "0.0 [0.0, 0.658]"
    assert rows["grad_health"]["Median latency"] == "1 steps · 0.5 s"
    assert rows["nan_inf"]["Median latency"] == "–"


def test_plain_is_the_baseline_not_a_competitor(client, runs):
    page = client.get(reverse("leaderboard")).content.decode()
    rows = table(page, "leaderboard")
    assert [row["Detector"] for row in rows if row["Rank"] == "baseline"] == ["plain"]
    assert rows[-1]["Detector"] == "plain" and rows[-1]["Overhead vs plain"] == "×1 (the baseline)"
    assert re.search(r'<tbody class="baseline">\s*<tr class="baseline"><td>baseline</td>', page)


def test_the_page_says_what_it_shows(client, runs):
    page = client.get(reverse("leaderboard")).content.decode()
    assert "All runs." in page and "not a result to cite" in page
    summary = " ".join(re.search(r'id="runs-summary">(.*?)</p>', page, re.S).group(1).split())
    assert summary.startswith("16 runs (16 succeeded") and "seeds 0, 1" in summary and "torch 2.13.0+cpu" in summary
    assert rows_by_detector(page)["traincheck"]["Overhead vs plain"] == "not timed"  # no pairs: said, not a dash


def test_every_number_links_to_the_runs_behind_it(client, runs):
    page = client.get(reverse("leaderboard")).content.decode()
    links = hrefs(page, "traincheck")
    detector_page, beyond, caught, same_rule_as_fixed, no_fixed_twin, fp_rate, latency = links
    assert detector_page == reverse("detector", args=["traincheck"])
    assert beyond == caught == same_rule_as_fixed == no_fixed_twin and latency.endswith("#latency")
    # Readable pages of exactly the runs counted, never the JSON browser: its 2 detections, its 2 false alarms.
    detected = client.get(caught).content.decode()
    assert "Detected buggy runs of traincheck" in detected
    assert [(row["Variant"], row["Detected"].startswith("at step")) for row in table(detected, "runs")] == [
        ("buggy", True), ("buggy", True)]
    alarmed = client.get(fp_rate).content.decode()
    assert "Clean (fixed) runs with a false alarm of traincheck" in alarmed
    assert [row["Variant"] for row in table(alarmed, "runs")] == ["fixed", "fixed"]
    assert client.get(latency).status_code == 200


def test_detections_without_a_fixed_twin_are_counted_apart_from_those_the_twin_repeats(client):
    """traincheck detects TEST-A at seeds 0, 1 and 2: at seed 0 its fixed twin raised the same rule, at seed 1 the
    fixed twin failed, at seed 2 there is none; at seed 3 a rule the twin did not raise makes it beyond the fixed."""
    version = version_of("TEST-A")
    for seed in range(4):
        run(version, "traincheck", "buggy", {5: f"invariant {seed}"}, seed=seed)
    run(version, "traincheck", "fixed", {6: "invariant 0"}, seed=0)
    run(version, "traincheck", "fixed", {6: "invariant 1"}, seed=1, status="failed")
    run(version, "traincheck", "fixed", seed=3)
    page = client.get(reverse("leaderboard")).content.decode()
    row = rows_by_detector(page)["traincheck"]
    assert row["Bugs caught beyond the fixed twin"] == "1/1" and "Bugs caught" not in row
    assert "Folded away, as they say nothing on these data: bugs caught (on every row the same as beyond the fixed " \
           "twin)" in " ".join(page.split())
    assert row["Detected runs, same rule on fixed"] == "1/4"
    assert row["Detected runs, no fixed twin"] == "2/4"


@pytest.fixture
def evaluation():
    """A stored evaluation: its tables say grad_health leads; its campaign holds a run of each detector."""
    campaign = CampaignFactory(name="evaluation", purpose="evaluation")
    overhead_campaign = CampaignFactory(name="overhead", purpose="overhead")
    detection = [
        {"bug": "TEST-A", "reproducer": "cpu", "detector": detector, "buggy_runs": 1, "detected_runs": detected,
         "detected_beyond_fixed_runs": beyond, "fixed_runs": 1, "fixed_runs_with_alarm": 0,
         "pre_trigger_false_alarm_runs": 0, "outcome": "detected" if detected else "missed"}
        for detector, detected, beyond in (("traincheck", 1, 0), ("grad_health", 1, 1), ("nan_inf", 0, 0))]
    false_positives = [{"detector": "traincheck", "clean_runs": 2, "clean_runs_with_alarm": 2, "fp_rate": 1.0,
                        "fp_ci_low": 0.342, "fp_ci_high": 1.0, "per_check_fp_rate": 0.1023}]
    latency = [{"detector": "grad_health", "bugs_detected": 1, "detected_runs": 1, "median_latency_steps": 2,
                "median_latency_seconds": 0.25}]
    overhead = [{"detector": "traincheck", "pairs": 5, "pairs_planned": 5, "median_step_time_ratio": 1.1391,
                 "median_end_to_end_ratio": 5.7526}]
    version = version_of("TEST-A")
    for detector in ("traincheck", "grad_health", "nan_inf"):
        run(version, detector, "buggy", campaign=campaign)
    run(ReproducerVersionFactory(reproducer=ReproducerFactory(bug=None, name="clean-mlp")), "traincheck", "fixed",
        campaign=overhead_campaign)
    return EvaluationFactory(campaign=campaign, overhead_campaign=overhead_campaign,
                             parameters={"seeds": 1, "torch": "2.13.0+cpu", "command": "manage.py evaluate"},
                             tables={"detection": detection, "false_positives": false_positives, "latency": latency,
                                     "overhead": overhead})


def test_a_stored_evaluation_is_ranked_from_its_stored_tables(client, evaluation):
    page = client.get(reverse("leaderboard")).content.decode()
    assert f"Evaluation <a href=\"{evaluation.get_absolute_url()}\">#{evaluation.pk}</a>" in page
    assert "All runs." not in page
    rows = rows_by_detector(page)
    assert [(row["Rank"], row["Detector"]) for row in table(page, "leaderboard")] == [
        ("1", "grad_health"), ("2", "traincheck"), ("2", "nan_inf"), ("baseline", "plain")]
    assert rows["traincheck"]["Per-check FP rate"] == "0.1023"
    # its detection table predates the count of runs without a fixed twin: the split is not made up
    assert rows["traincheck"]["Detected runs, same rule on fixed"] == "not split"
    assert rows["traincheck"]["Detected runs, no fixed twin"] == "not split"
    assert rows["traincheck"]["Overhead vs plain"] == "×1.1391 step · ×5.7526 end to end"
    assert rows["grad_health"]["Median latency"] == "2 steps · 0.25 s"
    overhead_runs = client.get(hrefs(page, "traincheck")[-1]).content.decode()
    assert f'campaign <a href="/campaigns/{evaluation.overhead_campaign_id}/">' in overhead_runs
    assert [row["Bug"] for row in table(overhead_runs, "runs")] == ["pipeline/clean-mlp"]
    buggy = client.get(hrefs(page, "traincheck")[1]).content.decode()  # the runs of the evaluation's campaign
    assert f'evaluation <a href="{evaluation.get_absolute_url()}">#{evaluation.pk}</a>' in buggy


def test_the_catalog_shows_the_top_of_the_stored_leaderboard(client, evaluation):
    page = client.get(reverse("bugs:list")).content.decode()
    box = re.search(r'<section id="leaderboard-box".*?</section>', page, re.S).group(0)
    assert f"Evaluation #{evaluation.pk}" in box
    assert [row["Detector"] for row in table(box, "leaderboard")] == ["grad_health", "traincheck", "nan_inf"]
    assert "baseline" not in [row["Rank"] for row in table(box, "leaderboard")]
    assert reverse("leaderboard") in box


def test_the_catalog_box_does_not_judge_live_runs(client, runs):
    page = client.get(reverse("bugs:list")).content.decode()
    box = re.search(r'<section id="leaderboard-box".*?</section>', page, re.S).group(0)
    assert "No evaluation is stored yet" in box and 'id="leaderboard"' not in box


def test_the_empty_leaderboard_says_what_to_do(client):
    page = client.get(reverse("leaderboard")).content.decode()
    assert 'id="empty"' in page and "manage.py evaluate" in page and 'id="leaderboard"' not in page


def test_an_unknown_evaluation_is_not_found(client):
    assert client.get(reverse("leaderboard") + "?evaluation=999").status_code == 404


@pytest.mark.parametrize(("role", "caught"), [("anonymous", "1/2"), ("other", "1/2"), ("maintainer", "2/3")])
def test_runs_of_unreviewed_code_count_only_for_who_may_see_them(client, runs, role, caught):
    hidden_bug = BugFactory(bug_id="HIDDEN-1", status=BugStatus.SUBMITTED, submitted_by=UserFactory())
    pending = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=hidden_bug),
                                       review_state=ReviewState.PENDING)
    run(pending, "grad_health", "buggy", {5: "exploding_gradient"})
    run(pending, "grad_health", "fixed")
    if role != "anonymous":
        client.force_login(MaintainerFactory() if role == "maintainer" else UserFactory())
    rows = rows_by_detector(client.get(reverse("leaderboard")).content.decode())
    assert rows["grad_health"]["Bugs caught beyond the fixed twin"] == caught
    assert rows["grad_health"]["Bugs caught"] == caught


def test_the_queries_do_not_grow_with_the_runs(client, runs):
    def queries(url):
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200
        return len(captured)

    urls = [reverse("leaderboard"), reverse("bugs:list"), reverse("methodology")]
    for url in urls:
        client.get(url)
    small = {url: queries(url) for url in urls}
    for n in range(3):
        version = version_of(f"TEST-M{n}")
        run(version, "traincheck", "buggy", {5: "invariant"}, seed=n)
        run(version, "traincheck", "fixed", seed=n)
    for url in urls:  # warm again: the catalog's content is kept for the same bugs, and these are new ones
        client.get(url)
    assert {url: queries(url) for url in urls} == small


def test_the_ranked_table_comes_first_and_an_empty_table_offers_no_download(client, runs):
    page = client.get(reverse("leaderboard")).content.decode()
    assert page.index('id="leaderboard"') < page.index('id="terms"') < page.index('id="open-leaderboard"')
    open_board = page[page.index('id="open-leaderboard"'):]
    assert "No detector version has completed its scoring yet" in open_board and "entries.tex" not in open_board
    assert 'href="/methodology/#terms"' in page
    methodology = client.get(reverse("methodology")).content.decode()
    terms = re.search(r'<section id="terms">(.*?)</section>', methodology, re.S).group(1)
    assert "<td>missed, 1 false alarm before the trigger</td>" in terms and "[0.061, 0.792]" in terms
    assert methodology.index('id="task"') < methodology.index('id="terms"') < methodology.index('id="lifecycle"')


def test_the_sensitivity_column_shows_the_latest_sensitivity_evaluation_and_never_changes_the_rank(client, evaluation):
    before = client.get(reverse("leaderboard")).content.decode()
    assert "Sensitivity (mutants)" not in before  # none stored: no column
    SensitivityEvaluation.objects.create(
        campaign=CampaignFactory(purpose=CampaignPurpose.SENSITIVITY), parameters={},
        tables={"by_class": [
            {"detector": "nan_inf", "fault_class": "hardware", "manifested": 10, "caught": 9},
            {"detector": "nan_inf", "fault_class": "software", "manifested": 10, "caught": 1},
            {"detector": "grad_health", "fault_class": "hardware", "manifested": 10, "caught": 0}],
            "thresholds": [{"detector": "nan_inf", "fault_class": "hardware", "severity_50": 5, "severity_90": 5},
                           {"detector": "grad_health", "fault_class": "hardware", "severity_50": None,
                            "severity_90": None}]})
    page = client.get(reverse("leaderboard")).content.decode()  # a new sensitivity evaluation: not the kept page
    rows = rows_by_detector(page)
    assert rows["nan_inf"]["Sensitivity (mutants)"] == "0.50 [0.30, 0.70] · 50 % at exp-hi"
    assert rows["grad_health"]["Sensitivity (mutants)"] == "0.00 [0.00, 0.28]"
    assert rows["traincheck"]["Sensitivity (mutants)"] == "–" and rows["plain"]["Sensitivity (mutants)"] == "–"
    assert [(row["Rank"], row["Detector"]) for row in table(page, "leaderboard")] == [
        ("1", "grad_health"), ("2", "traincheck"), ("2", "nan_inf"), ("baseline", "plain")]
