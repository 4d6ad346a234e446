"""The sensitivity evaluation: its tables from labelled runs, and the command on a slice, through a real worker."""
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from evaluation.metrics import AlarmPoint
from evaluation.models import SensitivityEvaluation
from evaluation.sensitivity import grouped_rates, judged_mutant_runs, labels, severity_thresholds
from runners.models import CampaignPurpose
from runners.selectors import counted_runs
from sensitivity.oracle import calibrate

from .factories import CampaignFactory


def row(mutant, detector, seed, loss, alarms=(), level=1, variant="buggy", pipeline="p"):
    return {"mutant": mutant, "pipeline": pipeline, "operator": "op" if mutant else None,
            "fault_class": "hardware" if mutant else None, "severity": f"s{level}", "severity_level": level,
            "persistence": "", "detector": detector, "seed": seed, "variant": variant if mutant else "fixed",
            "trigger_step": 8 if mutant else None, "last_step": 23, "outcomes": {"final_loss": loss}, "tolerances": {},
            "alarms": [AlarmPoint(step, None, "rule", step) for step in alarms]}


def test_benign_runs_count_neither_as_caught_nor_as_missed_and_the_severities_come_from_the_curve():
    clean = [row(None, "plain", seed, 1.0 + 0.1 * seed) for seed in range(4)]  # spread: |differences| 0.1 .. 0.3
    calibration = {"p": calibrate({r["seed"]: r["outcomes"] for r in clean}, q=0.5)}
    assert calibration["p"].thresholds["final_loss"] == pytest.approx(0.15)
    plain_runs = [row("MUT-a", "plain", 0, 1.05, level=1), row("MUT-b", "plain", 0, 3.0, level=2),
                  row("MUT-c", "plain", 0, 9.0, level=3)]
    verdicts = labels(clean + plain_runs, calibration)
    assert [verdicts[(mutant, 0)].manifested for mutant in ("MUT-a", "MUT-b", "MUT-c")] == [False, True, True]
    detector_runs = [row("MUT-a", "d", 0, 1.05, alarms=[9], level=1),  # benign: caught or not, it is not counted
                     row("MUT-b", "d", 0, 3.0, alarms=[3], level=2),  # an alarm before the trigger: not in time
                     row("MUT-c", "d", 0, 9.0, alarms=[10], level=3)]
    judged = judged_mutant_runs(clean + plain_runs + detector_runs, verdicts)
    assert [(r["mutant"], r["label"], r["caught"]) for r in judged] == [
        ("MUT-a", "benign", True), ("MUT-b", "manifested", False), ("MUT-c", "manifested", True)]
    (overall,) = grouped_rates(judged, ("detector", "fault_class"))
    assert (overall["manifested"], overall["caught"], overall["benign_runs"], overall["rate"]) == (2, 1, 1, 0.5)
    dose = grouped_rates(judged, ("detector", "fault_class", "severity_level"))
    assert [(r["severity_level"], r["rate"]) for r in dose] == [(1, None), (2, 0.0), (3, 1.0)]
    assert severity_thresholds(dose, "fault_class") == [
        {"detector": "d", "fault_class": "hardware", "severity_50": 3, "severity_90": 3}]
    # the detector raises the same rule on the clean twin of that seed: that alarm tells the fault from nothing
    twin = row(None, "d", 0, 1.0, alarms=[12])
    judged = judged_mutant_runs(clean + plain_runs + detector_runs + [twin], verdicts)
    assert [r["caught"] for r in judged] == [False, False, False]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_evaluate_sensitivity_labels_the_mutants_and_scores_the_detectors_through_a_worker(tmp_path):
    results = tmp_path / "results-sensitivity.md"
    call_command("evaluate_sensitivity", "--mutants",
                 "MUT-bitflip-weight-exp-hi-mlp-t8-transient,MUT-bitflip-weight-man-lo-mlp-t8-transient",
                 "--detectors", "nan_inf,grad_health", "--seeds", "2", "--calibration-seeds", "3",
                 "--results", str(results))
    evaluation = SensitivityEvaluation.objects.get()
    assert evaluation.campaign.purpose == CampaignPurpose.SENSITIVITY
    # nan_inf and grad_health watch each run together (a bundle): 2 mutants x 2 detectors (plain labels) x 2 seeds,
    # twins 2 x 2, calibration under plain: seed 2
    assert evaluation.parameters["runs"] == 8 + 4 + 1 and evaluation.parameters["failed_runs"] == 0
    assert evaluation.parameters["bundled"] == ["nan_inf", "grad_health"]
    verdicts = {(label["mutant"], label["seed"]): label for label in evaluation.tables["labels"]}
    assert len(verdicts) == 4
    # the lowest mantissa bit of one weight changes nothing a user could tell from reseeding; the highest exponent
    # bit (a weight near 1e36) wrecks training on both seeds
    assert not any(verdicts[("MUT-bitflip-weight-man-lo-mlp-t8-transient", seed)]["manifested"] for seed in (0, 1))
    assert all(verdicts[("MUT-bitflip-weight-exp-hi-mlp-t8-transient", seed)]["manifested"] for seed in (0, 1))
    by_class = {row["detector"]: row for row in evaluation.tables["by_class"]}
    assert (by_class["grad_health"]["manifested"], by_class["grad_health"]["benign_runs"]) == (2, 2)  # per seed
    assert by_class["grad_health"]["caught"] == 2 and by_class["nan_inf"]["caught"] == 0  # huge, never infinite
    assert set(by_class) == {"nan_inf", "grad_health"}  # plain labels, it is never scored
    calibration = {row["pipeline"]: row for row in evaluation.tables["calibration"]}
    assert calibration["mlp-adam"]["pairs"] == 3 and calibration["mlp-adam"]["thresholds"]["final_loss"] > 0
    clean = {row["detector"]: row for row in evaluation.tables["clean_false_alarms"]}
    assert clean["nan_inf"]["clean_runs"] == 2 and clean["nan_inf"]["runs_with_alarm"] == 0
    text = results.read_text()
    assert f"sensitivity evaluation #{evaluation.pk}" in text
    assert "4 mutant runs labelled under `plain`: 2 benign" in text
    assert "| grad_health | hardware | 5 | 5 |" in text  # the 50 % and 90 % severities: the highest exponent bit
    assert "manage.py evaluate_sensitivity --mutants MUT-bitflip-weight-exp-hi-mlp-t8-transient," in text
    stored = evaluation.tables
    results.unlink()
    call_command("evaluate_sensitivity", "--retabulate", str(evaluation.pk), "--results", str(results))
    evaluation.refresh_from_db()
    assert evaluation.tables == stored and results.read_text() == text  # the same runs, the same tables
    # its runs count in none of the live tables of real bugs, yet each has its page and its campaign's list
    assert not counted_runs(None).exists()
    run = evaluation.campaign.runs.get(reproducer_version__reproducer__mutant__mutant_id=(
        "MUT-bitflip-weight-exp-hi-mlp-t8-transient"), detector__name="bundle", seed=0)
    run_page = Client().get(reverse("runners:run", args=[run.pk]))
    assert run_page.status_code == 200  # linked to its mutant's page (no reference pipeline of that name)
    mutant_page = reverse("sensitivity:mutant", args=["MUT-bitflip-weight-exp-hi-mlp-t8-transient"])
    assert mutant_page in run_page.content.decode()
    campaign_page = Client().get(reverse("runners:campaign", args=[evaluation.campaign.pk])).content.decode()
    assert f'href="{reverse("runners:run", args=[run.pk])}"' in campaign_page


@pytest.mark.django_db
def test_evaluate_sensitivity_refuses_a_detector_that_fits_and_an_unknown_mutant():
    with pytest.raises(CommandError, match="without a fit phase: traincheck"):
        call_command("evaluate_sensitivity", "--mutants", "MUT-loss-scale-off-x2-cnn-t8", "--detectors", "traincheck")
    with pytest.raises(CommandError, match="No mutant matches"):
        call_command("evaluate_sensitivity", "--mutants", "MUT-no-such")


@pytest.mark.django_db
def test_the_sensitivity_page_plots_the_stored_curves_and_exports_each_table(client):
    assert "No sensitivity evaluation is stored yet" in client.get("/results/sensitivity/").content.decode()
    assert client.get("/results/sensitivity/by_class.csv").status_code == 404
    dose = [{"detector": "grad_health", "fault_class": "hardware", "severity_level": level, "manifested": 4,
             "caught": caught, "rate": caught / 4, "ci_low": 0.0, "ci_high": 1.0, "benign_runs": 0}
            for level, caught in ((1, 0), (3, 2), (5, 4))]
    evaluation = SensitivityEvaluation.objects.create(
        campaign=CampaignFactory(purpose=CampaignPurpose.SENSITIVITY), wall_seconds=12.0,
        parameters={"mutants": 3, "seeds": 3, "runs": 40, "quantile": 0.9, "torch": "2.13.0"},
        tables={"labels": [{"mutant": "MUT-x", "seed": 0, "manifested": False, "summary": "benign", "moved": []}],
                "by_operator": [], "by_class": [], "dose_response": dose,
                "thresholds": [{"detector": "grad_health", "fault_class": "hardware", "severity_50": 3,
                                "severity_90": 5}],
                "latency": [], "clean_false_alarms": [], "calibration": []})
    page = client.get("/results/sensitivity/").content.decode()
    assert f"Sensitivity evaluation #{evaluation.pk}" in page and "1 of them benign" in page.replace("\n  ", " ")
    figure = json.loads(re.search(r'id="dose-response-hardware-figure"[^>]*>(.*?)</script>', page, re.S).group(1))
    line = next(trace for trace in figure["data"] if trace.get("mode") == "lines+markers")
    assert (line["x"], line["y"]) == ([1, 3, 5], [0.0, 0.5, 1.0])
    assert "Nothing to plot" in page  # the software class: no manifested run
    csv = client.get("/results/sensitivity/thresholds.csv").content.decode()
    assert csv.splitlines() == ["detector,fault_class,severity_50,severity_90", "grad_health,hardware,3,5"]
    assert "tab:silentbench-sensitivity-dose_response" in client.get("/results/sensitivity/dose_response.tex"
                                                                     ).content.decode()
    assert client.get("/results/sensitivity/nope.csv").status_code == 404


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_an_approved_submitted_detector_is_scored_on_the_track_in_runs_of_its_own():
    """The docs' example detector (docs/writing-a-detector.md), submitted and approved: its runs are sandboxed runs of
    its own, never in a bundle, and its rows are marked as a submitted detector's."""
    from django.utils import timezone

    from core.enums import ReviewState
    from runners.models import DetectorVersion

    from .factories import UserFactory
    from .test_detector_submissions import example_from_the_docs, submit

    version = submit(example_from_the_docs(), UserFactory())
    DetectorVersion.objects.filter(pk=version.pk).update(review_state=ReviewState.APPROVED,
                                                         reviewed_at=timezone.now())  # approved (its scoring aside)
    call_command("evaluate_sensitivity", "--mutants", "MUT-parameters-left-out-all-but-one-mlp-t8",
                 "--detectors", "param_not_updated", "--seeds", "1", "--calibration-seeds", "3", "--results", "")
    evaluation = SensitivityEvaluation.objects.get()
    assert evaluation.parameters["submitted"] == [f"{version.name} {version.version}"]
    assert evaluation.parameters["runs"] == 3 * 2 + 2 and evaluation.parameters["failed_runs"] == 0
    assert evaluation.campaign.runs.filter(detector__code=version).count() == 2  # the mutant and its twin
    by_class = {row["detector"]: row for row in evaluation.tables["by_class"]}
    assert set(by_class) == {"param_not_updated", f"{version.name} (submitted)"}
    # judged on the same labels as the built-in detectors (plain's runs), one manifested or benign run each
    submitted = by_class[f"{version.name} (submitted)"]
    assert (submitted["manifested"], submitted["benign_runs"]) == (by_class["param_not_updated"]["manifested"],
                                                                   by_class["param_not_updated"]["benign_runs"])
    assert submitted["manifested"] + submitted["benign_runs"] == 1


def test_the_open_leaderboard_gives_a_submitted_version_only_the_cell_of_the_version_the_track_ran():
    from types import SimpleNamespace

    from evaluation.sensitivity import entry_sensitivity

    evaluation = SimpleNamespace(parameters={"submitted": ["frozen 2"]})
    cells = {"frozen": {"rate": 0.1}, "frozen (submitted)": {"rate": 0.7}}
    version = SimpleNamespace(builtin=False, name="frozen", version="2")
    assert entry_sensitivity(version, evaluation, cells) == {"rate": 0.7, "unverified": True}  # not the built-in
    assert entry_sensitivity(SimpleNamespace(builtin=False, name="frozen", version="1"), evaluation, cells) == {}
    evaluation.parameters["code"] = {"frozen": "abc"}  # the code each built-in ran
    assert entry_sensitivity(SimpleNamespace(builtin=True, name="frozen", code_hash="abc"), evaluation, cells) == {
        "rate": 0.1}
    assert entry_sensitivity(SimpleNamespace(builtin=True, name="frozen", code_hash="old"), evaluation, cells) == {}
    assert entry_sensitivity(version, None, cells) == {}
