"""TrainCheck under its paper's protocol (evaluation.traincheck_protocols): the relevant-relation rule, the
per-invariant false-positive arithmetic, the page rendered from stored figures, and one real fit on a clean run
of the program under test."""
import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from evaluation.traincheck_protocols.measuring import detection_record, failure_line
from evaluation.traincheck_protocols.relevance import RELEVANT, paper_verdict, per_invariant_rates, relevance_of
from evaluation.traincheck_protocols.rendering import render
from runners.actions.detectors import do_record_detector
from runners.detectors.traincheck import TrainCheckError, deployed_invariants
from runners.models import Run, RunStatus
from runners.tasks import execute_run

from .factories import (
    BugFactory,
    EvaluationFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
)
from .test_traincheck import TRAINING

DRIFT = "ConsistencyRelation: Parameter.data stays consistent across training steps"
NOISE = "FunctionLeadRelation: distributed_c10d.get_rank() always precedes DistributedDataParallel.train()"


def test_a_relevant_alarm_has_the_bugs_relation_and_names_what_the_bug_concerns():
    assert relevance_of("DS-1801").matches(DRIFT)
    assert not relevance_of("DS-1801").matches("APIContainRelation: Adam.step() changes Parameter.data")  # relation
    assert not relevance_of("DS-1801").matches(NOISE)
    assert not relevance_of("DS-1801").matches(DRIFT.replace(".data", ".data_ID"))  # a tensor's id(), not its values
    assert relevance_of("PT-FORUM-84911").matches("APIContainRelation: Adam.step() always calls adam.adam()")
    assert relevance_of("SO-60335387").matches("FunctionLeadRelation: Optimizer.zero_grad() always precedes "
                                               "Tensor.backward()")
    assert relevance_of("SO-60335387").matches("VarPeriodicChangeRelation: fc.weight.grad is periodicaly set to None")
    # "*": any relation whose invariant names the API
    assert relevance_of("VERDICT-PIPELINE-WRONG-RANK").matches("DistinctArgumentRelation: distributed_c10d.recv() "
                                                               "receives distinct arguments at each step")
    # a bug whose fault no relation states matches nothing, and an undeclared bug neither
    assert not relevance_of("PT-36485").matches(DRIFT) and not relevance_of("PT-36485").matchers
    assert not relevance_of("NO-SUCH-BUG").matches(DRIFT)
    assert all(relevance.about and relevance.reason for relevance in RELEVANT.values())


def test_the_papers_way_needs_the_relevant_invariant_on_the_buggy_run_only():
    ds1801 = relevance_of("DS-1801")
    assert paper_verdict(ds1801, 2, [(0, NOISE), (3, DRIFT)], [(0, NOISE)]) == (True, DRIFT)
    assert paper_verdict(ds1801, 2, [(3, DRIFT)], [(5, DRIFT)]) == (False, "")  # the fix violates it too
    assert paper_verdict(ds1801, 2, [(1, DRIFT)], []) == (False, "")  # before the trigger step
    assert paper_verdict(ds1801, 2, [(3, NOISE)], []) == (False, "")  # an alarm, but not the relevant one
    assert paper_verdict(ds1801, None, [(0, DRIFT)], []) == (True, DRIFT)  # no trigger: the fault is active from 0


def test_per_invariant_rate_is_failed_over_deployed_per_fold_then_averaged():
    rates = per_invariant_rates([{"deployed": 200, "failed": 2}, {"deployed": 100, "failed": 3},
                                 {"deployed": 0, "failed": 0}])  # a fold that deployed nothing has no rate
    assert rates == {"folds": 2, "mean": 0.02, "pooled": round(5 / 300, 4), "max": 0.03, "failed": 5,
                     "deployed": 300}
    assert per_invariant_rates([])["mean"] is None


def test_a_stored_failure_reason_is_its_first_line_without_the_machines_paths():
    reason = ("traincheck infer failed: AssertionError: no return value\n"
              "  File \"/srv/app/.venv/lib/python3.11/site-packages/traincheck/infer_engine.py\", line 562")
    assert failure_line(reason) == "traincheck infer failed: AssertionError: no return value"
    assert failure_line("check failed in /srv/x/site-packages/traincheck/checker.py") == (
        "check failed in traincheck/checker.py")
    assert failure_line("") == ""


def test_deploying_the_top_invariants_keeps_the_best_supported_in_the_fits_order():
    lines = [json.dumps({"relation": "R", "text_description": name, "num_positive_examples": support})
             for name, support in (("a", 5), ("b", 50), ("c", None), ("d", 20))]
    fit = "\n".join(lines) + "\n"
    kept = deployed_invariants(fit, 2)
    assert [json.loads(line)["text_description"] for line in kept.splitlines()] == ["b", "d"]
    assert deployed_invariants(fit, None) == deployed_invariants(fit, 4) == fit


def test_a_fit_written_in_the_sandbox_or_a_bad_deploy_top_fails_the_run_not_the_worker():
    """The fit's counts come from TrainCheck run on the program; what is not a number counts as no support."""
    odd = [json.dumps({"text_description": "text", "num_positive_examples": "9" * 400}), "[1, 2]", "not json",
           json.dumps({"text_description": "kept", "num_positive_examples": 3})]
    kept = deployed_invariants("\n".join(odd) + "\n", 1)
    assert [line for line in kept.splitlines()] == [odd[3]]
    for top in (0, -1, 2.5, "100", True):
        with pytest.raises(TrainCheckError, match="deploy_top must be a whole number of at least 1"):
            deployed_invariants("\n".join(odd) + "\n", top)


def detection(bug, detected, miss_reason="", **extra):
    return {"bug": bug, "reproducer": "cpu", "in_traincheck_evaluation": bug == "DS-1801",
            "relations": ["ConsistencyRelation"], "about": "LayerNorm replicas", "reason": "drift",
            "status": "measured", "trigger_step": 0,
            "fit": {"invariants": 40, "by_relation": {"APIContainRelation": 40}, "references": "x", "artifact": 1,
                    "fit_seconds": 3.0},
            "relevant_in_fit": 0 if miss_reason else 2, "relevant_in_fit_example": [] if miss_reason else [DRIFT],
            "buggy": {"run": 11, "status": "succeeded", "alarms": 3, "models_tracked": []},
            "fixed": {"run": 12, "status": "succeeded", "alarms": 1}, "relevant_on_buggy": int(detected),
            "relevant_on_buggy_not_fixed": int(detected), "relevant_on_fixed": 0, "relevant_on_fixed_example": [],
            "detected": detected, "evidence_rule": DRIFT if detected else "", "benchmark_rule_here": True,
            "miss_reason": miss_reason, **extra}


FIGURES = {
    "measured_at": "2026-11-24 21:40 UTC", "commit": "abc", "torch": "2.13.0+cpu", "traincheck": "0.2.0",
    "compute_seconds": {"total": 1800.0}, "campaigns": [7, 8],
    "detection": [detection("DS-1801", True),
                  detection("PT-36485", False, "the fit holds no relevant invariant")],
    "false_positives": {"folds": [
        {"held_out": "mlp-adam", "run": 21, "status": "succeeded", "failure_reason": "", "alarms": 2,
         "references": ["pipeline/cnn-sgd-momentum"], "deployed": 400, "failed": 2, "failed_example": [NOISE]},
        {"held_out": "lstm-lm", "run": 22, "status": "succeeded", "failure_reason": "", "alarms": 0,
         "references": ["pipeline/mlp-adam"], "deployed": 200, "failed": 0, "failed_example": []}]},
    "overhead": {"pairs": 3, "median_step_time_ratio": 1.05, "median_end_to_end_ratio": 4.2, "deployed": [100],
                 "fit_invariants": 2500, "median_plain_step_ms": 6.0, "median_step_ms": 6.3,
                 "median_check_seconds": 2.0, "runs": [31, 33, 35]},
}


def test_the_page_sets_the_three_columns_side_by_side_with_evidence():
    page = render(FIGURES)
    row = next(line for line in page.splitlines() if line.startswith("| bugs detected"))
    assert "18/20" in row and "1/2 bugs measured (1/1 of those from TrainCheck's own evaluation)" in row
    assert "no stored evaluation" in row  # no benchmark figures stored yet
    row = next(line for line in page.splitlines() if line.startswith("| false positives"))
    assert "0.25 % per invariant, mean of 2 leave-one-out folds" in row and "2/600" in row and "per run 1/2" in row
    assert "x1.05" in next(line for line in page.splitlines() if line.startswith("| checking overhead"))
    assert "run #11: &quot;" not in page and f'run #11: "{DRIFT}"' in page  # the evidence: a run and its invariant
    assert "Missed, the fit holds no relevant invariant (1): PT-36485 (40 invariants: APIContainRelation 40" in page
    assert "Held-out mlp-adam (run #21): 2 of 400 invariants failed" in page
    assert render({}).count("not measured") == 3


@pytest.mark.django_db
def test_render_only_takes_the_benchmarks_column_from_a_stored_evaluation(tmp_path):
    evaluation = EvaluationFactory(tables={
        "detection": [
            {"bug": "DS-1801", "detector": "traincheck", "buggy_runs": 3, "detected_runs": 3,
             "detected_beyond_fixed_runs": 0},
            {"bug": "PT-36485", "detector": "traincheck", "buggy_runs": 3, "detected_runs": 3,
             "detected_beyond_fixed_runs": 2},
            {"bug": "PT-36485", "detector": "nan_inf", "buggy_runs": 3, "detected_runs": 0,
             "detected_beyond_fixed_runs": 0}],
        "false_positives": [{"detector": "traincheck", "clean_runs": 72, "clean_runs_with_alarm": 72, "fp_rate": 1.0,
                             "per_check_fp_rate": 0.1103}],
        "overhead": [{"detector": "traincheck", "pairs": 5, "median_step_time_ratio": 1.0965,
                      "median_end_to_end_ratio": 21.45}],
        "fits": [{"detector": "traincheck", "references": "pipeline/mlp-adam", "invariants": 2998}]})
    data, output = tmp_path / "figures.json", tmp_path / "comparison.markdown"
    data.write_text(json.dumps(FIGURES))
    call_command("traincheck_protocols", "--render-only", "--data", str(data), "--output", str(output))

    stored = json.loads(data.read_text())
    assert stored["benchmark"]["evaluation"] == evaluation.pk and stored["detection"] == FIGURES["detection"]
    assert stored["benchmark"]["beyond_fixed"] == 1 and stored["benchmark"]["raw"] == 2
    page = output.read_text()
    assert f"1/2 beyond the fixed twin (raw 2/2; evaluation #{evaluation.pk})" in page
    assert "per run 1.0 (72/72 clean runs alarmed); per check 11.03 %" in page
    assert "step x1.10, end to end x21.45, all 2998 invariants" in page
    assert "| 2/3 beyond fixed |" in page  # the stored evaluation's cell beside each bug

    with pytest.raises(CommandError, match="No evaluation #999"):
        call_command("traincheck_protocols", "--render-only", "--evaluation", "999", "--data", str(data),
                     "--output", str(output))
    with pytest.raises(CommandError, match="--parts takes"):
        call_command("traincheck_protocols", "--parts", "speed", "--data", str(data), "--output", str(output))
    data.write_text("[1, 2")
    with pytest.raises(CommandError, match="not readable JSON"):
        call_command("traincheck_protocols", "--render-only", "--data", str(data), "--output", str(output))


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
@pytest.mark.once
def test_a_bug_fitted_on_its_own_fixed_variant_is_caught_by_its_relevant_invariant_only_when_buggy():
    """The paper's protocol end to end with real TrainCheck: a fit on the fixed variant at another seed, then the
    buggy and fixed runs; the frozen optimizer violates "Adam.step() ..." (PT-FORUM-84911's relation)."""
    bug = BugFactory(bug_id="PT-FORUM-84911", source="TrainCheck bug table")
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug), files={"repro.py": TRAINING},
                                       default_steps=8, time_limit_seconds=60, memory_mb=4096)
    detector = do_record_detector("traincheck", {"fit_on_self": True, "fit_seed": 1})
    runs = {variant: RunFactory(reproducer_version=version, detector=detector, variant=variant, seed=0, steps=8)
            for variant in ("buggy", "fixed")}
    for run in runs.values():
        execute_run(run.pk)
    buggy, fixed = (Run.objects.get(pk=runs[variant].pk) for variant in ("buggy", "fixed"))
    assert buggy.status == fixed.status == RunStatus.SUCCEEDED, buggy.failure_reason + fixed.failure_reason
    assert buggy.fit_artifact == fixed.fit_artifact
    assert list(buggy.fit_artifact.reference_versions.all()) == [version]  # the program under test itself

    record = detection_record(version, buggy, fixed)
    assert record["detected"] and "step()" in record["evidence_rule"], record
    assert record["relevant_in_fit"] > 0 and record["relevant_on_fixed"] == 0
    assert record["in_traincheck_evaluation"] and record["miss_reason"] == ""


def test_every_bug_of_the_catalog_has_its_relevant_relation_declared():
    """A bug without one would be counted as missed the paper's way without being run (catalog-only bugs, with no
    reproducer to run, are not measured)."""
    catalog = {path.parent.parent.name for path in Path(settings.SILENTBENCH_CATALOG_DIR).glob("*/cpu/reproducer.yaml")}
    assert catalog and catalog <= set(RELEVANT), sorted(catalog - set(RELEVANT))
