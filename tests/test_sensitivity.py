"""The sensitivity track's mutants: the spec's count and shape, each operator run for real on a pipeline (the fault
changes training, the clean twin is the pipeline step for step), and the noise-calibrated oracle."""
import ast
import difflib
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from bugs.catalog import do_load_catalog
from bugs.models import Reproducer, Track
from runners.execution import execute
from runners.selectors import runnable_versions
from sensitivity import mutants as mutants_module
from sensitivity.actions import do_load_mutants
from sensitivity.models import Mutant
from sensitivity.mutants import ARMING_LINE, MUTANT_ID, SpecError, mutant_programs
from sensitivity.oracle import Calibration, calibrate, judge, outcomes, quantile, tolerances

from .factories import DetectorFactory, ReproducerVersionFactory, RunFactory

CATALOG = Path(__file__).resolve().parents[1] / "catalog"
# The most severe mutant of every operator, on a pipeline where it bites: each must change training.
MOST_SEVERE = [
    "MUT-zero-grad-skipped-every-step-cnn-t8",
    "MUT-stale-gradient-every-step-mlp-t8",
    "MUT-parameters-left-out-all-but-one-mlp-t8",
    "MUT-lr-schedule-shifted-shift-8-transformer-t8",
    "MUT-loss-scale-off-x1024-cnn-t8",
    "MUT-wrong-mode-every-step-cnn-t8",
    "MUT-allreduce-wrong-unreduced-ddp-t8",
    "MUT-rank-desync-eps-1e-1-ddp-t8",
    "MUT-clip-on-copy-every-step-lstm-t8",
    "MUT-optimizer-state-reset-every-2-accum-t8",
    "MUT-bitflip-weight-exp-hi-bf16-t8-transient",
    "MUT-bitflip-gradient-exp-hi-accum-t8-sticky",
    "MUT-bitflip-moment-exp-hi-transformer-t8-sticky",
    "MUT-bitflip-allreduce-exp-hi-ddp-t8-sticky",
]


@pytest.fixture(scope="module")
def all_mutants():
    return {mutant.mutant_id: mutant for mutant in mutant_programs(CATALOG)}


def test_the_spec_makes_over_300_mutants_of_14_operators_on_7_pipelines(all_mutants):
    mutants = list(all_mutants.values())
    assert len(mutants) >= 300
    operators = {mutant.operator.name: mutant.operator for mutant in mutants}
    assert len(operators) >= 14
    assert {mutant.pipeline.name for mutant in mutants} == {
        "mlp-adam", "transformer-adamw", "cnn-sgd-momentum", "lstm-lm", "autocast-bf16", "ddp-gloo", "grad-accum"}
    assert all(len(operator.severities) >= 4 for operator in operators.values())
    assert {operator.fault_class for operator in operators.values()} == {"software", "hardware"}
    assert all(MUTANT_ID.match(mutant_id) for mutant_id in all_mutants)
    assert "MUT-bitflip-gradient-exp-hi-cnn-t8-sticky" in all_mutants
    sticky = all_mutants["MUT-bitflip-gradient-exp-hi-cnn-t8-sticky"]
    assert (sticky.severity, sticky.severity_level, sticky.persistence) == ("exp-hi", 5, "sticky")
    assert not any(mutant.operator.name == "allreduce-wrong" and mutant.pipeline.name != "ddp-gloo"
                   for mutant in mutants)  # an operator mutates only the pipelines that have what it needs


def test_a_mutant_is_its_pipeline_with_two_lines_changed(all_mutants):
    mutant = all_mutants["MUT-loss-scale-off-x8-mlp-t8"]
    clean = (CATALOG / "pipelines" / "mlp-adam" / "repro.py").read_text(encoding="utf-8")
    changed = [line for line in difflib.unified_diff(clean.splitlines(), mutant.files["repro.py"].splitlines(),
                                                     lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert sorted(changed) == sorted(["-TRIGGER_STEP = None  # clean pipeline: no fault is ever active",
                                      "+" + ARMING_LINE,
                                      "+TRIGGER_STEP = 8  # SilentBench mutant: the fault begins at this step"])
    assert ast.get_docstring(ast.parse(mutant.files["repro.py"])) == ast.get_docstring(ast.parse(clean))
    config = json.loads(mutant.files["mutant.json"])
    assert config == {"mutant_id": "MUT-loss-scale-off-x8-mlp-t8", "operator": "loss-scale-off", "severity": "x8",
                      "parameters": {"factor": 8.0}, "trigger_step": 8, "rank": 0, "persistence": ""}
    assert mutant.manifest["mutant"]["pipeline"] == "mlp-adam" and mutant.manifest["default_steps"] == 24


def test_operator_modules_ship_alone_importing_only_the_standard_library_and_torch(all_mutants):
    for operator in {mutant.operator.module: mutant.operator for mutant in all_mutants.values()}.values():
        for node in ast.walk(ast.parse(operator.source)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(name and name.split(".")[0] == "torch" for name in names), (operator.module, names)


def test_an_operator_without_its_metadata_is_refused_with_the_field_named():
    incomplete = SimpleNamespace(NAME="x", FAULT_CLASS="software", MIRRORS="m", SUMMARY="s",
                                 SEVERITIES=[("a", {}), ("b", {}), ("c", {})], REQUIRES_ANY=(), PERSISTENCE=("",),
                                 inject=lambda fault: None, __doc__="doc", __file__=__file__)
    with pytest.raises(SpecError, match="at least 4 distinct levels"):
        mutants_module._operator("broken", incomplete)
    incomplete.SEVERITIES = [("a", {}), ("b", {}), ("c", {}), ("d", {})]
    incomplete.FAULT_CLASS = "cosmic"
    with pytest.raises(SpecError, match="FAULT_CLASS"):
        mutants_module._operator("broken", incomplete)
    del incomplete.SUMMARY
    with pytest.raises(SpecError, match="SUMMARY must be a str"):
        mutants_module._operator("broken", incomplete)


def harness_notes(stderr):
    """The harness's notes in a run's stderr: JSON objects, which two ranks may write onto one line."""
    decoder, notes = json.JSONDecoder(), []
    for line in stderr.splitlines():
        start = line.find('{"silentbench_fault"')
        while start != -1:
            note, end = decoder.raw_decode(line, start)
            notes.append(note)
            start = line.find('{"silentbench_fault"', end)
    return notes


def run_sealed(files, manifest, variant, steps, detector="plain"):
    """The program run by the worker's sandbox, warm: its step losses by (rank, step), its outcome and the harness's
    notes."""
    version = ReproducerVersionFactory(files=files, manifest=manifest, default_steps=steps, time_limit_seconds=120,
                                       memory_mb=4096)
    run = RunFactory(reproducer_version=version, detector=DetectorFactory(name=detector), variant=variant,
                     steps=steps)
    outcome = execute(run)
    assert outcome.succeeded, outcome.failure_reason
    notes = harness_notes(outcome.stderr)
    return SimpleNamespace(losses={(record["rank"], record["step"]): record["loss"] for record in outcome.steps},
                           outcome=outcome, notes=notes)


def clean_program(pipeline):
    folder = CATALOG / "pipelines" / pipeline
    return {path.name: path.read_text(encoding="utf-8") for path in folder.iterdir() if path.is_file()}


@pytest.mark.django_db
@pytest.mark.parametrize("mutant_id", MOST_SEVERE)
def test_each_operator_changes_training_and_its_clean_twin_is_the_pipeline_step_for_step(mutant_id, all_mutants):
    mutant = all_mutants[mutant_id]
    clean_files = clean_program(mutant.pipeline.name)
    clean = run_sealed(clean_files, {"entrypoint": "repro.py"}, "fixed", mutant.steps)
    buggy = run_sealed(mutant.files, mutant.manifest, "buggy", mutant.steps)
    twin = run_sealed(mutant.files, mutant.manifest, "fixed", mutant.steps)
    assert twin.losses == clean.losses and not twin.notes  # the fixed variant arms nothing
    assert len(buggy.losses) == len(clean.losses) == mutant.steps * (2 if mutant.pipeline.name == "ddp-gloo" else 1)
    before = {key: loss for key, loss in clean.losses.items() if key[1] < mutant.trigger_step}
    assert all(buggy.losses[key] == loss for key, loss in before.items())  # nothing changes before the fault
    assert buggy.losses != clean.losses, f"{mutant_id} left training as it was"
    assert buggy.outcome.trigger_step == mutant.trigger_step and clean.outcome.trigger_step is None
    for note in buggy.notes:
        assert note["step"] >= mutant.trigger_step - 1 and note["rank"] == mutant.rank


@pytest.mark.django_db
def test_a_shifted_schedule_is_the_rate_the_program_and_its_detectors_read(all_mutants):
    """The scheduler itself leaves the shifted rate in the optimizer: the step records (read before step()) show it."""
    mutant = all_mutants["MUT-lr-schedule-shifted-shift-4-transformer-t8"]
    clean, buggy = (run_sealed(mutant.files, mutant.manifest, variant, mutant.steps).outcome
                    for variant in ("fixed", "buggy"))
    rates = [{record["step"]: record["metrics"]["lr"] for record in outcome.steps} for outcome in (clean, buggy)]
    assert all(rates[1][step] == rates[0][step] for step in range(8))
    assert all(rates[1][step] == rates[0][step - 4] != rates[0][step] for step in range(8, mutant.steps))


def run_harness(script):
    """``script`` in a fresh interpreter, with the harness and the operators importable (global hooks and patches
    stay out of the test process); what it prints, as a Python literal."""
    import subprocess
    import sys

    faults = Path(mutants_module.__file__).resolve().parent / "faults"
    prelude = (f"import sys; sys.path[:0] = [{str(faults)!r}, {str(faults / 'operators')!r}]\n"
               "from harness import Fault\n")
    result = subprocess.run([sys.executable, "-c", prelude + script], capture_output=True, text=True, timeout=120,
                            check=True)
    return ast.literal_eval(result.stdout.strip())


GRADIENT_FLIP = """
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
seen, norms = [], []
# a detector's probe, installed first: its pre-step check must see the gradient the faulty program hands step()
register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: seen.append(float(weight.grad[0, 1])))
config = {"mutant_id": "m", "operator": "bitflip-gradient", "severity": "exp-lo", "parameters": {"bit": "exp-lo"},
          "trigger_step": 1, "rank": 0, "persistence": "transient"}
fault = Fault(config, seed=0)
fault._optimizer_hooks()
fault.choose_element = lambda tensors: (tensors[0], 1)
import bitflip_gradient
bitflip_gradient.inject(fault)
weight = torch.nn.Parameter(torch.zeros(1, 2))
optimizer = torch.optim.SGD([weight], lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    for micro in range(3):  # gradient accumulation: three backward passes, one step
        (weight * torch.tensor([[1.0, 2.0]])).sum().backward()
    norms.append(round(float(torch.nn.utils.clip_grad_norm_([weight], max_norm=1e9)), 4))
    optimizer.step()
print((seen, norms))
"""


def test_a_gradient_bit_flips_in_the_complete_gradient_before_clipping_and_the_detectors_checks():
    """Over three accumulated micro-batches the flip lands in the gradient the program uses (not in the first
    micro-batch's part): its clipping measures it, and a detector's pre-step hook, registered before the harness's,
    already sees it; once, in the trigger step only (transient)."""
    seen, norms = run_harness(GRADIENT_FLIP)
    assert seen == [6.0, 3.0, 6.0]  # the lowest exponent bit of 3 x 2.0 flipped: 6.0 -> 3.0, in step 1 only
    assert norms == [round(45 ** 0.5, 4), round(18 ** 0.5, 4), round(45 ** 0.5, 4)]  # |[3, 6]|, |[3, 3]|


CHAINED_SCHEDULE = """
import torch
config = {"mutant_id": "m", "operator": "lr-schedule-shifted", "severity": "shift-2", "parameters": {"shift": 2},
          "trigger_step": 3, "rank": 0, "persistence": ""}
fault = Fault(config, seed=0)
fault._optimizer_hooks()
import lr_schedule_shifted
lr_schedule_shifted.inject(fault)
weight = torch.nn.Parameter(torch.zeros(1))
optimizer = torch.optim.SGD([weight], lr=1.0)
scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)  # chainable: from the group's own rate
rates, told = [], []
for step in range(8):
    rates.append(optimizer.param_groups[0]["lr"])
    told.append(scheduler.get_last_lr()[0])
    weight.sum().backward()
    optimizer.step()
    scheduler.step()
print((rates, told))
"""


def test_a_shifted_chainable_schedule_stays_shifted_by_n_not_more():
    rates, told = run_harness(CHAINED_SCHEDULE)
    assert rates == [0.5 ** step for step in range(3)] + [0.5 ** (step - 2) for step in range(3, 8)]
    assert told == rates  # get_last_lr() tells the program the rate it trains with


def test_the_spec_refuses_a_rank_the_pipeline_lacks_and_arms_after_future_imports(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("steps: 24\ntrigger_steps: [8]\npipelines:\n  ddp-gloo: {short: ddp, features: [ddp]}\n"
                    "operators:\n  - {module: rank_desync, rank: 2}\n", encoding="utf-8")
    with pytest.raises(SpecError, match="strikes rank 2, but ddp-gloo runs 2 ranks"):
        mutant_programs(CATALOG, spec)
    source = '"""A pipeline."""\nfrom __future__ import annotations\n\nTRIGGER_STEP = None\n'
    armed = mutants_module.armed_source(source, 8, "p")
    compile(armed, "repro.py", "exec")  # a line before the __future__ import would be a SyntaxError
    assert armed.splitlines()[:3] == ['"""A pipeline."""', "from __future__ import annotations", ARMING_LINE]


def test_the_oracle_calibrates_on_seed_pairs_and_names_what_moved():
    clean = {0: {"final_loss": 1.0, "heldout_metric": 0.80}, 1: {"final_loss": 1.2, "heldout_metric": 0.82},
             2: {"final_loss": 1.1, "heldout_metric": 0.78}, 3: {"final_loss": math.nan, "heldout_metric": 0.5}}
    calibration = calibrate(clean, q=0.5)  # seed 3 is not finite: left out
    assert calibration.seeds == (0, 1, 2) and calibration.pairs == 3
    assert calibration.thresholds["final_loss"] == pytest.approx(0.1)  # |differences| 0.2, 0.1, 0.1
    assert calibration.thresholds["heldout_metric"] == pytest.approx(0.02)
    twin = {"final_loss": 1.0, "heldout_metric": 0.80}
    assert judge({"final_loss": 1.05, "heldout_metric": 0.81}, twin, calibration).benign
    verdict = judge({"final_loss": 1.5, "heldout_metric": 0.81}, twin, calibration)
    assert verdict.manifested and [item["outcome"] for item in verdict.moved] == ["final_loss"]
    assert "final loss 1 -> 1.5" in verdict.summary
    assert judge({"final_loss": math.nan, "heldout_metric": 0.80}, twin, calibration).manifested
    with pytest.raises(ValueError, match="at least 3 seeds"):
        calibrate({0: clean[0], 1: clean[1]})
    assert quantile([0.0, 1.0, 2.0, 3.0], 0.9) == pytest.approx(2.7)
    assert outcomes({"last_quarter_mean_loss": None, "heldout_acc": 0.5, "other": 1}) == {
        "final_loss": pytest.approx(math.nan, nan_ok=True), "heldout_metric": 0.5}
    assert isinstance(calibration, Calibration) and calibration.as_dict()["quantile"] == 0.5
    replicas = {seed: {"replica_difference": 0.0} for seed in range(3)}  # clean replicas: identical on every seed
    floored = calibrate(replicas, floors=tolerances({"replica_tolerance": 1e-6}))
    assert floored.thresholds == {"replica_difference": 1e-6}
    assert judge({"replica_difference": 1e-9}, {"replica_difference": 0.0}, floored).benign  # a rounding error
    assert judge({"replica_difference": 0.07}, {"replica_difference": 0.0}, floored).manifested


@pytest.mark.django_db
@pytest.mark.parametrize("mutant_id, detector", [
    ("MUT-rank-desync-eps-1e-1-ddp-t8", "cross_rank_consistency"),
    ("MUT-bitflip-weight-exp-hi-bf16-t8-transient", "nan_inf"),
])
def test_a_mutant_runs_sealed_and_its_detector_sees_the_fault_only_in_the_buggy_variant(
        all_mutants, mutant_id, detector):
    """Through the worker's sandbox (warm, forked ranks for DDP): the harness arms inside it, and the fixed variant
    is clean for the detector too."""
    mutant = all_mutants[mutant_id]
    buggy, fixed = (run_sealed(mutant.files, mutant.manifest, variant, mutant.steps, detector).outcome
                    for variant in ("buggy", "fixed"))
    assert buggy.trigger_step == fixed.trigger_step == mutant.trigger_step
    assert buggy.alarms and all(alarm["step"] >= mutant.trigger_step - 1 for alarm in buggy.alarms)
    assert not fixed.alarms
    assert '"silentbench_fault"' in buggy.stderr and '"silentbench_fault"' not in fixed.stderr


@pytest.mark.django_db
def test_the_cross_rank_check_follows_an_optimizer_that_drops_parameters(all_mutants):
    """Found by the track: cross_rank_consistency compared replica masks by position and crashed the program when
    its optimizer dropped tensors (every detector in its bundle lost the run)."""
    mutant = all_mutants["MUT-parameters-left-out-quarter-ddp-t8"]
    buggy = run_sealed(mutant.files, mutant.manifest, "buggy", mutant.steps, "cross_rank_consistency").outcome
    assert buggy.succeeded and not buggy.alarms  # the ranks drop the same tensors: the replicas stay equal


@pytest.mark.django_db
def test_mutants_load_as_their_own_track_and_stay_out_of_the_real_catalog(client, all_mutants):
    do_load_catalog(CATALOG)
    summary = do_load_mutants(CATALOG)
    assert len(summary.created) == len(all_mutants) == Mutant.objects.count()
    again = do_load_mutants(CATALOG)  # idempotent
    assert (again.created, again.updated, again.versions.versions_created) == ([], [], [])
    mutant = Mutant.objects.get(mutant_id="MUT-bitflip-gradient-exp-hi-cnn-t8-sticky")
    assert (mutant.operator, mutant.fault_class, mutant.severity, mutant.severity_level, mutant.persistence,
            mutant.pipeline.name, mutant.trigger_step) == (
        "bitflip-gradient", "hardware", "exp-hi", 5, "sticky", "cnn-sgd-momentum", 8)
    assert mutant.reproducer.track == Track.SENSITIVITY and not mutant.reproducer.is_reference_pipeline
    assert mutant.reproducer.variants == ("buggy", "fixed")
    assert mutant.reproducer.latest_version().files == all_mutants[mutant.mutant_id].files

    # the real catalog's campaigns, pipelines and pages never see them
    pipelines = {version.reproducer.name for version in runnable_versions(pipelines=True)
                 + runnable_versions(pipelines=True, cuda=True)}  # the CPU ones, and gpu-transformer
    assert pipelines == {name for name in Reproducer.objects.reference_pipelines().values_list("name", flat=True)}
    assert len(pipelines) == 8 and not any(name.startswith("MUT-") for name in pipelines)
    assert "MUT-" not in client.get("/pipelines/").content.decode()
    assert "MUT-" not in client.get("/catalog/").content.decode()

    # the catalog of mutants filters by what they inject
    page = client.get("/sensitivity/mutants/", {"operator": "bitflip-gradient", "pipeline": "cnn-sgd-momentum",
                                                "persistence": "sticky"}).content.decode()
    shown = set(re.findall(r"<code>(MUT-[a-z0-9-]+)</code>", page))
    assert shown == {mutant_id for mutant_id, m in all_mutants.items() if m.operator.name == "bitflip-gradient"
                     and m.pipeline.name == "cnn-sgd-momentum" and m.persistence == "sticky"}
    assert len(shown) == 5
    hardware = client.get("/sensitivity/mutants/", {"fault_class": "hardware", "severity": "exp-hi"}).content.decode()
    expected = sum(m.operator.fault_class == "hardware" and m.severity == "exp-hi" for m in all_mutants.values())
    assert expected == 7 * 3 * 2 + 2 and f"{expected} mutants." in hardware  # + the DDP all-reduce's, both kinds
    detail = client.get(mutant.get_absolute_url()).content.decode()
    assert "Not a real bug" in detail and "fault_operator.py" in detail and "mutant.json" in detail
    assert client.get("/sensitivity/mutants/MUT-no-such-mutant/").status_code == 404
