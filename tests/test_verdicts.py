"""Verdicts where people look (issue 16): the line that leads a run's page, the alarm and detection columns of
the run tables, the detectors that catch a bug (its page and the catalog), the catalog's stability column, and
records shown as key / value tables."""
import re

import pytest
from django.utils.html import strip_tags

from evaluation.metrics import AlarmPoint, judge_run
from evaluation.tables import cell_text
from evaluation.verdicts import table_verdicts
from runners.actions.detectors import do_record_detector
from runners.models import Run

from .factories import (
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EnvironmentFactory,
    EvaluationFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    StabilityCheckFactory,
)
from .helpers import HOSTILE, table

pytestmark = pytest.mark.django_db


@pytest.fixture
def version():
    return ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-V")))


def make_run(version, variant="buggy", alarm_steps=(), detector="param_not_updated", rule="r", **fields):
    fields = {"status": "succeeded", "trigger_step": 2, "manifested": variant == "buggy", **fields}
    run = RunFactory(reproducer_version=version, detector=do_record_detector(detector), variant=variant, **fields)
    for step in alarm_steps:
        AlarmFactory(run=run, step=step, rule=rule)
    return run


def verdict_line(client, run):
    page = client.get(f"/runs/{run.pk}/").content.decode()
    found = re.search(r'<p class="card" id="verdict">(.*?)</p>', page, re.S)
    return " ".join(strip_tags(found.group(1)).split())


@pytest.mark.parametrize("case, expected", [
    ({"alarm_steps": [1, 3, 4]}, "Verdict: detected at step 3 (trigger 2), 1 false alarm"),
    ({"alarm_steps": [3], "trigger_step": None}, "Verdict: detected at step 3 (no trigger step recorded: judged "
                                                 "from step 0), 0 false alarms"),
    ({"alarm_steps": [0, 1]}, "Verdict: missed: no alarm at or after the trigger (trigger 2), 2 false alarms"),
    ({"manifested": False}, "Verdict: missed: no alarm at or after the trigger (trigger 2), 0 false alarms; "
                            "the symptom did not manifest"),
    ({"variant": "fixed"}, "Verdict: clean run: no alarm"),
    ({"variant": "fixed", "alarm_steps": [0, 5]}, "Verdict: clean run: 2 false alarms"),
    ({"detector": "plain"}, "Verdict: no detector: symptom manifested (trigger step 2)"),
    ({"detector": "plain", "manifested": False}, "Verdict: no detector: no symptom"),
    ({"status": "failed", "failure_kind": "time_limit", "failure_reason": "Time limit of 30 s exceeded."},
     "Verdict: failed (time limit): Time limit of 30 s exceeded."),
    ({"status": "cancelled", "failure_kind": "cancelled", "failure_reason": "Cancelled by alice."},
     "Verdict: cancelled: Cancelled by alice."),
    ({"status": "queued"}, "Verdict: queued: no verdict yet"),
])
def test_the_run_page_leads_with_its_verdict(client, version, case, expected):
    assert verdict_line(client, make_run(version, **case)) == expected


def test_a_detection_the_fixed_twin_shares_says_so(client, version):
    buggy = make_run(version, alarm_steps=[3], rule="same")
    make_run(version, variant="fixed", alarm_steps=[3], rule="same", campaign=buggy.campaign)
    assert verdict_line(client, buggy).endswith("every qualifying rule also fired on the fixed run of this seed")
    other = make_run(version, alarm_steps=[3], rule="own", seed=1)
    make_run(version, variant="fixed", alarm_steps=[3], rule="same", seed=1)
    assert verdict_line(client, other) == "Verdict: detected at step 3 (trigger 2), 0 false alarms"


def test_table_verdicts_agree_with_judge_run(version):
    cases = [("buggy", 2, []), ("buggy", 2, [0, 1]), ("buggy", 2, [2]), ("buggy", 2, [1, 5, 3]), ("buggy", None, [0]),
             ("buggy", None, []), ("fixed", 2, []), ("fixed", 2, [0, 4, 9]), ("fixed", None, [3])]
    runs = [make_run(version, variant, steps, trigger_step=trigger, seed=n)
            for n, (variant, trigger, steps) in enumerate(cases)]
    failed = make_run(version, alarm_steps=[4], status="failed", seed=99)
    verdicts = table_verdicts(Run.objects.filter(pk__in=[run.pk for run in runs + [failed]]))
    for run, (variant, trigger, steps) in zip(runs, cases):
        expected = judge_run(variant, trigger, None, [AlarmPoint(step) for step in steps])
        count, verdict = verdicts[run.pk]
        assert count == len(steps)
        assert (verdict.detected, verdict.false_alarms, verdict.latency_steps) == (
            expected.detected, expected.false_alarms, expected.latency_steps), (variant, trigger, steps)
    assert verdicts[failed.pk] == (1, None)  # a failed run has alarms, but no verdict


def run_rows(client, url):
    return {row["Run"]: row for row in table(client.get(url).content.decode(), "runs")}


def test_bug_and_campaign_run_tables_show_alarms_and_detection(client, version):
    campaign = CampaignFactory()
    runs = {
        "detected": make_run(version, alarm_steps=[1, 4], campaign=campaign,
                             environment=EnvironmentFactory(host="box-1", torch="2.13.0")),
        "missed": make_run(version, alarm_steps=[0], campaign=campaign, seed=1),
        "clean": make_run(version, variant="fixed", alarm_steps=[6, 7], campaign=campaign),
        "plain": make_run(version, detector="plain", campaign=campaign),
        "failed": make_run(version, alarm_steps=[3], status="failed", campaign=campaign, seed=2),
    }
    expected = {"detected": ("2 1 false", "at step 4"), "missed": ("1 1 false", "missed"),
                "clean": ("2 2 false", "clean run, false alarm"), "plain": ("0", "no detector"), "failed": ("–", "–")}
    for url in (f"/bugs/{version.reproducer.bug.bug_id}/", f"/campaigns/{campaign.pk}/"):
        rows = run_rows(client, url)
        for name, (alarms, detected) in expected.items():
            row = rows[f"#{runs[name].pk}"]
            assert (row["Alarms"], row["Detected"]) == (alarms, detected), (url, name)
    campaign_page = " ".join(strip_tags(client.get(f"/campaigns/{campaign.pk}/").content.decode()).split())
    assert "Ran on: box-1 · torch 2.13.0 · CPU." in campaign_page


def test_the_bug_page_names_the_detectors_that_catch_it_from_its_latest_campaign(client, version):
    older, campaign, verification = CampaignFactory(), CampaignFactory(name="nightly"), CampaignFactory()
    make_run(version, detector="grad_health", alarm_steps=[3], campaign=older)  # an older campaign: not judged
    make_run(version, alarm_steps=[3], rule="own", campaign=campaign)  # caught beyond the fixed twin
    make_run(version, variant="fixed", campaign=campaign)
    alike = do_record_detector("nan_inf")
    for variant in ("buggy", "fixed"):  # detected, but the fixed twin raised the same rule
        AlarmFactory(run=RunFactory(reproducer_version=version, detector=alike, variant=variant, status="succeeded",
                                    trigger_step=2, campaign=campaign), step=3, rule="same")
    make_run(version, detector="grad_health", campaign=campaign)  # missed
    make_run(version, detector="plain", campaign=verification)  # the latest, but no detector ran in it
    page = client.get("/bugs/TEST-V/").content.decode()
    text = " ".join(strip_tags(page).split())
    assert "Caught by: param_not_updated (detected beyond the fixed twin" in text
    assert "Detected, but only by rules that fired on the fixed variant too: nan_inf." in text
    assert (f"No stored evaluation has run this bug: judged from its 5 succeeded runs in campaign nightly "
            f"(#{campaign.pk}), the latest that ran it under a detector") in text
    assert f"?campaign={campaign.pk}&amp;bug=TEST-V" in page
    rows = {row["Detector"]: row for row in table(page, "bug-detections")}
    assert (rows["grad_health"]["Outcome"], rows["grad_health"]["Median latency (steps)"]) == ("missed", "–")
    assert rows["param_not_updated"]["Detected / buggy runs"] == "1/1"
    assert rows["nan_inf"]["Beyond the fixed twin"] == "0"


def test_the_bug_page_and_the_catalog_take_caught_by_from_the_latest_stored_evaluation(client, version):
    make_run(version, alarm_steps=[3])  # a live detection the stored tables do not know of
    row = {"bug": "TEST-V", "reproducer": version.reproducer.name, "buggy_runs": 3, "pre_trigger_false_alarm_runs": 0,
           "fixed_runs": 3, "fixed_runs_with_alarm": 0, "median_latency_steps": None}
    evaluation = EvaluationFactory(parameters={"seeds": 3}, tables={"detection": [
        {**row, "detector": "loss_spike", "detected_runs": 3, "detected_beyond_fixed_runs": 3, "outcome": "detected"},
        {**row, "detector": "param_not_updated", "detected_runs": 0, "detected_beyond_fixed_runs": 0,
         "outcome": "missed"},
        {**row, "detector": "differential", "detected_runs": 3, "detected_beyond_fixed_runs": 3, "outcome": "detected"},
        {**row, "bug": "TEST-OTHER", "detector": "nan_inf", "detected_runs": 1, "detected_beyond_fixed_runs": 1,
         "outcome": "detected"},
    ]})
    BugFactory(bug_id="TEST-UNRUN")
    text = " ".join(strip_tags(client.get("/bugs/TEST-V/").content.decode()).split())
    assert "Caught by: differential (opt-in), loss_spike (" in text  # the reproducer handed differential its reference
    assert f"From the stored tables of evaluation #{evaluation.pk}" in text

    catalog = client.get("/catalog/").content.decode()
    rows = {row["ID"]: row for row in table(catalog, "bug-list")}
    assert rows["TEST-V"]["Caught by"] == "differential (opt-in), loss_spike"
    assert rows["TEST-UNRUN"]["Caught by"] == "not in the evaluation"
    assert f"in evaluation #{evaluation.pk}" in " ".join(strip_tags(catalog).split())


def test_the_catalog_shows_each_reproducers_last_stability_check(client, version):
    StabilityCheckFactory(reproducer_version=version, seeds=3, buggy_manifested=1, fixed_manifested=0)
    StabilityCheckFactory(reproducer_version=version, seeds=3)  # the later one: verified
    cuda = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=version.reproducer.bug, name="cuda"))
    StabilityCheckFactory(reproducer_version=cuda, seeds=5, buggy_manifested=5, fixed_manifested=2)
    BugFactory(bug_id="TEST-NEW")
    rows = {row["ID"]: row for row in table(client.get("/catalog/").content.decode(), "bug-list")}
    assert rows["TEST-V"]["Stability"] == "cpu: Verified 3/3 · 0/3cuda: Flaky 5/5 · 2/5"
    assert rows["TEST-NEW"]["Stability"] == "not verified"
    assert rows["TEST-V"]["Caught by"] == "–"  # no stored evaluation


def test_records_are_key_value_tables_of_escaped_text(client, version):
    run = make_run(version, alarm_steps=[3], oracle_evidence={HOSTILE: {"ratio": 2.5, "ranks": [0, 1, HOSTILE]}},
                   detector_summary={"rules_deployed": 200, "note": HOSTILE},
                   execution={"start": "warm", "cold_reason": "", "layers": ["userns"], "notes": [],
                              "refused_alarms": 0})
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "<script>" not in page.split("<h2>Logs</h2>")[0].replace('<script src=', "")
    assert "&lt;script&gt;alert(" in page
    evidence = page.split('<div id="evidence">')[1].split("</div>")[0]
    assert evidence.startswith('<table class="record"><tr><th scope="row">&lt;script&gt;')
    assert "<th scope=\"row\">ratio</th><td>2.5</td>" in evidence
    assert "0, 1, &lt;script&gt;" in evidence
    assert "{" not in strip_tags(page.split('id="detector-config"')[1].split("</dd>")[0])
    assert '<th scope="row">rules_deployed</th><td>200</td>' in page
    execution = page.split('<dd id="execution">')[1].split("</dd>")[0]
    assert execution == '<table class="record"><tr><th scope="row">refused_alarms</th><td>0</td></tr></table>'


def test_empty_run_tables_say_what_to_do(client, version):
    assert "No campaigns yet: run bin/quickstart for a first one on this machine." in " ".join(
        strip_tags(client.get("/campaigns/").content.decode()).split())
    campaign = CampaignFactory()
    make_run(version, campaign=campaign)
    queued = " ".join(strip_tags(client.get(f"/campaigns/{campaign.pk}/?status=queued").content.decode()).split())
    assert "No run matches this filter: show all runs." in queued


def test_a_record_table_is_bounded_in_cells_and_text():
    """A report may hold megabytes of records: the table shows at most MAX_CELLS cells in all, nested ones
    included, and cuts long values, saying how much is left out."""
    from runners.templatetags.records import MAX_CELLS, MAX_TEXT_CHARS, record_table

    deep = {f"k{i}": {f"k{j}": {f"k{k}": "x" * 5000 for k in range(50)} for j in range(50)} for i in range(50)}
    html = str(record_table(deep))
    assert html.count("<th") <= MAX_CELLS
    assert "more" in html and "x" * (MAX_TEXT_CHARS + 1) not in html
    assert len(html) < 2_000_000
    small = str(record_table({"ratio": 0.5, "steps": [1, 2, 3]}))
    assert "ratio" in small and "1, 2, 3" in small and "more" not in small


def test_a_bug_verified_but_never_run_under_a_detector_says_so(client):
    version = ReproducerVersionFactory()
    for variant in ("buggy", "fixed"):
        for seed in range(3):
            RunFactory(reproducer_version=version, variant=variant, seed=seed, status="succeeded",
                       campaign=CampaignFactory(purpose="verification"))
    said = " ".join(re.search(r'<p class="muted" id="caught-by">(.*?)</p>', client.get(
        f"/bugs/{version.reproducer.bug.bug_id}/").content.decode(), re.S).group(1).split())
    assert said.startswith("6 succeeded runs of this bug, all without a detector") and "No succeeded run" not in said


def test_a_matrix_cell_says_how_many_detections_tell_the_bug_from_its_fix():
    cell = {"detected_runs": 3, "buggy_runs": 3, "detected_beyond_fixed_runs": 1, "fixed_runs_with_alarm": 2,
            "pre_trigger_false_alarm_runs": 0}
    assert cell_text(cell) == "3/3 (1 beyond fixed) FA"
    assert cell_text({**cell, "detected_beyond_fixed_runs": 3}) == "3/3 FA"
