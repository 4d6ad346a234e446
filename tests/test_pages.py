"""The dashboard pages and exports, rendered as a browser gets them."""
import csv
import io
import json

import pytest
from django.core.management import call_command

from runners.actions.detectors import do_record_detector

from .factories import (
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EvaluationFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
)
from .helpers import HOSTILE

pytestmark = pytest.mark.django_db

BUGS_MD_IDS = [
    "PT-FORUM-84911", "SO-60335387", "DS-1801", "BLOOM-176B-DIVERGENCE", "PT-115607", "PT-51800", "PT-124357",
    "TE-1047", "PT-84803", "PT-181723", "PT-36485", "PT-5801", "PT-SYNCBN-UNEVEN", "PT-18465", "TF-41539",
    "TF-25175", "TF-40638",
]


@pytest.fixture
def results():
    """Two bugs x two detectors, hand-built: one detection, one pre-trigger false alarm, one clean FP."""
    first = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-A")))
    second = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-B")))
    guard, plain = do_record_detector("param_not_updated"), do_record_detector("plain")

    def run(version, detector, variant, alarm_steps=()):
        made = RunFactory(reproducer_version=version, detector=detector, variant=variant, status="succeeded",
                          steps=10, trigger_step=3, trigger_time=100.0, manifested=variant == "buggy",
                          step_records=[{"step": s, "rank": 0, "loss": 1.0 / (s + 1), "time": 100.0 + s,
                                         "metrics": {}} for s in range(10)])
        for step in alarm_steps:
            AlarmFactory(run=made, step=step, rule="no_parameter_updated", message=HOSTILE, time=100.0 + step)
        return made

    return {
        "detected": run(first, guard, "buggy", [5]),
        "clean": run(first, guard, "fixed"),
        "early": run(second, guard, "buggy", [1]),
        "clean_fp": run(second, guard, "fixed", [4]),
        "plain_buggy": run(first, plain, "buggy"),
        "plain_fixed": run(first, plain, "fixed"),
    }


def test_catalog_lists_every_bug_of_the_dossier(client):
    call_command("load_catalog")
    page = client.get("/catalog/").content.decode()
    for bug_id in BUGS_MD_IDS:
        assert f">{bug_id}</a>" in page
    assert page.count('href="/bugs/VERDICT-') >= 9


def test_catalog_filters_and_search(client):
    call_command("load_catalog")
    page = client.get("/catalog/", {"framework": "deepspeed"}).content.decode()
    assert ">DS-1801</a>" in page and ">PT-51800</a>" not in page
    page = client.get("/catalog/", {"fault_location": "user"}).content.decode()
    assert ">SO-60335387</a>" in page and ">DS-1801</a>" not in page
    page = client.get("/catalog/", {"multi_rank": "true"}).content.decode()
    assert ">DS-1801</a>" in page and ">SO-60335387</a>" not in page
    page = client.get("/catalog/", {"q": "zero_grad"}).content.decode()
    assert ">SO-60335387</a>" in page and ">DS-1801</a>" not in page


def test_bug_page_shows_metadata_and_highlighted_code(client):
    call_command("load_catalog")
    page = client.get("/bugs/DS-1801/").content.decode()
    assert "Root cause" in page and "github.com" in page
    assert 'class="code"' in page  # pygments output
    assert "repro.py" in page


def test_hostile_text_is_shown_as_text(client, results):
    bug = BugFactory(bug_id="TEST-EVIL", title=HOSTILE, root_cause=HOSTILE, symptom=HOSTILE)
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug), files={"repro.py": f"# {HOSTILE}\n"})
    run = RunFactory(reproducer_version=version, status="failed", failure_reason=HOSTILE, stderr=HOSTILE,
                     stdout=HOSTILE, oracle_summary=HOSTILE)
    AlarmFactory(run=run, step=0, rule=HOSTILE, message=HOSTILE)
    for url in ("/", "/catalog/", "/bugs/TEST-EVIL/", run.get_absolute_url(), results["detected"].get_absolute_url(),
                "/campaigns/", "/results/"):
        page = client.get(url).content.decode()
        assert "<script>alert" not in page, url


def test_run_page_plots_both_variants_and_marks_alarms(client, results):
    page = client.get(results["detected"].get_absolute_url()).content.decode()
    assert 'id="loss-figure"' in page
    figure = json.loads(page.split('id="loss-figure" type="application/json">', 1)[1].split("</script>", 1)[0])
    names = [trace["name"] for trace in figure["data"]]
    assert names == ["buggy", "alarms (buggy)", "fixed"]
    assert figure["data"][1]["x"] == [5]
    legend, margin = figure["layout"]["legend"], figure["layout"]["margin"]
    # under the axis title, in a bottom margin that holds two rows of legend: never over the title on a phone
    assert (legend["yref"], legend["y"], legend["yanchor"]) == ("container", 0, "bottom") and margin["b"] >= 100


def test_results_matrix_classifies_each_cell(client, results):
    page = client.get("/results/").content.decode()
    matrix = page.split('id="detection-matrix"', 1)[1].split("</table>", 1)[0]
    test_a = matrix.split("TEST-A", 1)[1].split("</tr>", 1)[0]
    test_b = matrix.split("TEST-B", 1)[1].split("</tr>", 1)[0]
    assert "detected" in test_a and "1/1" in test_a
    assert "false alarm" in test_b and "pre-trigger 1" in test_b
    header = matrix.split("</thead>", 1)[0]
    assert "<th>param_<wbr>not_<wbr>updated</th>" in header  # detector names wrap between their words only


def test_breakable_escapes_and_offers_a_break_after_each_underscore_only():
    from core.templatetags.prose import breakable

    assert breakable("cross_rank<b>") == "cross_<wbr>rank&lt;b&gt;"


def test_exports_agree_in_every_format(client, results):
    rows = list(csv.DictReader(io.StringIO(client.get("/results/detection.csv").content.decode())))
    guarded = {row["bug"]: row for row in rows if row["detector"] == "param_not_updated"}
    assert guarded["TEST-A"]["outcome"] == "detected" and guarded["TEST-A"]["median_latency_steps"] == "2.0"
    assert guarded["TEST-B"]["outcome"] == "false alarm"
    records = client.get("/results/detection.json").json()
    assert {(r["bug"], r["detector"], r["outcome"]) for r in records} == {
        (row["bug"], row["detector"], row["outcome"]) for row in rows}
    markdown = client.get("/results/detection.md").content.decode()
    assert markdown.splitlines()[0].startswith("| bug | reproducer | detector |")
    assert "| TEST-B | cpu | param_not_updated |" in markdown
    latex = client.get("/results/detection.tex").content.decode()
    assert "\\toprule" in latex and "\\midrule" in latex and "\\bottomrule" in latex
    assert "param\\_not\\_updated" in latex


def test_false_positive_table_has_wilson_interval(client, results):
    rows = client.get("/results/false-positives.json").json()
    guarded = next(row for row in rows if row["detector"] == "param_not_updated")
    assert guarded["clean_runs"] == 2 and guarded["clean_runs_with_alarm"] == 1
    assert guarded["fp_rate"] == 0.5
    assert guarded["fp_ci_low"] == pytest.approx(0.095, abs=1e-3)
    assert guarded["fp_ci_high"] == pytest.approx(0.905, abs=1e-3)
    assert guarded["alarms_per_1000_clean_steps"] == 50.0


def test_unknown_export_is_404(client):
    assert client.get("/results/detection.xlsx").status_code == 404


def test_pipeline_pages_and_a_pipeline_run(client):
    pipeline = ReproducerFactory(bug=None, name="mlp-adam", strategy="faithful")
    run = RunFactory(reproducer_version=ReproducerVersionFactory(reproducer=pipeline), variant="fixed",
                     status="succeeded")
    assert "mlp-adam" in client.get("/pipelines/").content.decode()
    assert "repro.py" in client.get("/pipelines/mlp-adam/").content.decode()
    assert 'href="/pipelines/mlp-adam/"' in client.get(run.get_absolute_url()).content.decode()


def test_latency_and_per_check_rate_tables(client, results):
    results["clean"].detector_summary = {"rules_deployed": 200, "rules_failed": 3}
    results["clean"].save()
    latency = client.get("/results/latency.json").json()
    assert latency == [{"detector": "param_not_updated", "bugs_detected": 1, "detected_runs": 1,
                        "median_latency_steps": 2, "max_latency_steps": 2, "median_latency_seconds": 5.0,
                        "max_latency_seconds": 5.0, "integration": "drop-in"}]  # alarm at step 5 (t=105), trigger
    # step 3 began at t=100
    fp = {row["detector"]: row for row in client.get("/results/false-positives.json").json()}
    assert fp["param_not_updated"]["per_check_fp_rate"] == 0.015  # 3 of 200 rules failed on the one clean run
    assert fp["plain"]["per_check_fp_rate"] is None


def test_results_show_the_stored_tables_of_the_latest_evaluation(client, results):
    campaign = CampaignFactory(name="evaluation")
    stored = {"detection": [{"bug": "TEST-Z", "reproducer": "cpu", "detector": "nan_inf", "buggy_runs": 1,
                             "detected_runs": 1, "outcome": "detected", "fixed_runs": 1,
                             "fixed_runs_with_alarm": 0, "pre_trigger_false_alarm_runs": 0}],
              "false_positives": [], "latency": [],
              "overhead": [{"detector": "nan_inf", "pairs": 5, "pairs_planned": 5, "median_step_time_ratio": 1.07,
                            "median_end_to_end_ratio": HOSTILE}]}
    evaluation = EvaluationFactory(campaign=campaign, tables=stored, parameters={"runs": 2, "seeds": 1})
    page = client.get("/results/").content.decode()
    tables = page.split('id="detection-matrix"', 1)[1]  # (the filter form above lists every bug)
    assert "TEST-Z" in tables and "TEST-A" not in tables  # stored numbers, not the live runs
    assert "1.07" in page and HOSTILE not in page and "&lt;script&gt;" in page
    assert f"evaluation #{evaluation.pk}" in page
    overhead = client.get("/results/overhead.csv").content.decode()
    assert overhead.splitlines()[1].startswith("nan_inf,5,5,1.07,")
    results["detected"].campaign = CampaignFactory(name="live")
    results["detected"].save()
    live = client.get("/results/detection.json", {"campaign": results["detected"].campaign_id}).json()
    assert [row["bug"] for row in live] == ["TEST-A"]  # a campaign's live tables, not the stored ones
    api = client.get("/api/results/").json()
    assert api["evaluation"] == evaluation.pk and api["overhead"][0]["median_step_time_ratio"] == 1.07


def test_missing_numbers_are_dashes_not_nan(client, results):
    page = client.get("/results/").content.decode()
    assert "nan" not in page.split('id="detection-matrix"', 1)[1].split("</table>", 1)[0]
    assert "nan" not in client.get("/results/latency.md").content.decode()
