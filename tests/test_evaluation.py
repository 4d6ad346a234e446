"""The full-evaluation command on a small slice, through a real local worker, and the overhead arithmetic."""
import pytest
from django.core.management import call_command

from evaluation.models import Evaluation
from evaluation.overhead import overhead_record, steady_step_seconds


def test_steady_step_time_skips_warm_up_and_other_ranks():
    records = [{"step": i, "rank": 0, "time": t} for i, t in enumerate([0, 5, 6, 7, 8, 9, 10, 10.5, 11, 11.5])]
    records += [{"step": i, "rank": 1, "time": 100.0 * i} for i in range(10)]
    assert steady_step_seconds(records, warm_up=5) == 0.5
    assert steady_step_seconds(records[:3], warm_up=5) is None


def test_overhead_record_takes_medians_over_pairs():
    samples = [{"step_ratio": r, "end_to_end_ratio": 2 * r, "plain_step_seconds": 0.01, "step_seconds": 0.01 * r,
                "check_seconds": None, "fit_seconds": None} for r in (1.0, 3.0, 1.2)]
    record = overhead_record("x", samples, pairs=5)
    assert (record["pairs"], record["median_step_time_ratio"], record["median_end_to_end_ratio"]) == (3, 1.2, 2.4)
    assert record["median_step_ms"] == 12.0 and record["median_check_seconds"] is None


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_evaluate_stores_the_tables_and_writes_the_results_page(tmp_path):
    results = tmp_path / "results.md"
    call_command("evaluate", "--bugs", "PT-FORUM-84911", "--pipelines", "mlp-adam", "--detectors",
                 "nan_inf,param_not_updated", "--pairs", "1", "--overhead-workload", "mlp-adam",
                 "--results", str(results))
    evaluation = Evaluation.objects.get()
    assert evaluation.parameters["failed_runs"] == 0 and evaluation.parameters["runs"] == 6
    detection = {row["detector"]: row for row in evaluation.tables["detection"]}
    assert detection["param_not_updated"]["detected_runs"] == 1  # an optimizer over frozen parameters
    assert detection["nan_inf"]["detected_runs"] == 0  # nothing is NaN in that bug
    fp = {row["detector"]: row for row in evaluation.tables["false_positives"]}
    assert fp["nan_inf"]["clean_runs"] == 2  # the fixed variant and the clean pipeline
    overhead = {row["detector"]: row for row in evaluation.tables["overhead"]}
    assert overhead["nan_inf"]["pairs"] == 1 and overhead["nan_inf"]["median_step_time_ratio"] > 0
    assert evaluation.overhead_campaign.runs.filter(status="succeeded").count() == 4
    text = results.read_text()
    assert f"evaluation #{evaluation.pk}" in text and "| PT-FORUM-84911 (cpu) | 0/1 | 1/1 |" in text
    # the summary ranks as the leaderboard does: by bugs caught beyond the fixed twin
    first, second = "| 1 | param_not_updated | drop-in | 1/1 | 1/1 |", "| 2 | nan_inf | drop-in | 0/1 | 0/1 |"
    assert text.index(first) < text.index(second)
    assert len(evaluation.parameters["commit"]) == 40 and f"commit {evaluation.parameters['commit']}" in text
