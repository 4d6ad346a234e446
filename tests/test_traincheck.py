"""TrainCheck, the real traincheck package: how its output is read, and fit -> check -> parse end to end on CPU."""
import json
import re

import pytest

from runners.actions.detectors import do_record_detector
from runners.detectors.traincheck import instrumentation_spec, models_to_track, read_json_stream, violation_alarms
from runners.models import FitArtifact, Run, RunFailureKind, RunStatus
from runners.tasks import execute_run

from .factories import PROGRAM_PREAMBLE, ReproducerFactory, ReproducerVersionFactory, RunFactory

INSTRUMENT = ("from traincheck.instrumentor.tracer import Instrumentor\n"
              "Instrumentor({target}, scan_proxy_in_args=False, use_full_instr=False, funcs_to_instr=None, "
              "API_dump_stack_trace=False, sampling_interval={interval}, warm_up_steps=1).instrument()\n")
COPY_HEAD = """from traincheck import annotate_stage
import os
os.environ['TRAINCHECK_OUTPUT_DIR'] = "/run/out"
from traincheck.utils import register_custom_excepthook
if os.environ.get("TRAINCHECK_DEBUG") == "1":
    register_custom_excepthook(True)
import traincheck.config.config as general_config
general_config.INSTR_DESCRIPTORS = False
general_config.MODEL_TRACKER_STYLE = 'sampler'
'The docstring, as TrainCheck leaves it.'
import argparse
"""


def instrumented_copy(tmp_path, head=COPY_HEAD, first="torch", interval=1, later_interval=1):
    copy = tmp_path / "_traincheck_repro.py"
    copy.write_text(head + "import torch\n" + INSTRUMENT.format(target=first, interval=interval)
                    + "import torch.nn as nn\n" + INSTRUMENT.format(target="nn", interval=later_interval)
                    + "print('training')\n")
    return copy


def test_a_zygote_instruments_torch_with_the_values_of_the_copys_head_and_nothing_else(tmp_path):
    """The zygote outside the sandbox takes literals of known names and types from the copy, never code: a copy that
    runs anything else before instrumenting torch, or sets anything else, instruments torch itself."""
    (tmp_path / "instr_opts.json").write_text('{"funcs_instr_opts": {}}')
    spec = json.loads(instrumentation_spec(instrumented_copy(tmp_path), tmp_path))
    assert spec == {"config": {"INSTR_DESCRIPTORS": False, "MODEL_TRACKER_STYLE": "sampler"},
                    "instrumentor": {"scan_proxy_in_args": False, "use_full_instr": False, "funcs_to_instr": None,
                                     "API_dump_stack_trace": False, "sampling_interval": 1, "warm_up_steps": 1},
                    "instr_opts": '{"funcs_instr_opts": {}}'}
    assert json.loads(instrumentation_spec(instrumented_copy(tmp_path), tmp_path / "elsewhere"))["instr_opts"] is None
    script_head = COPY_HEAD + "annotate_stage('init')\n"  # what a script without a main() gets first thing
    assert json.loads(instrumentation_spec(instrumented_copy(tmp_path, head=script_head), tmp_path)) == spec

    refused = {
        "code before torch is instrumented": COPY_HEAD + "open('/etc/passwd').read()\n",
        "a third-party import first": COPY_HEAD + "import numpy\n",
        "a setting TrainCheck does not write": COPY_HEAD + "general_config.INSTR_OPTS_FILE = '/etc/shadow'\n",
        "a setting of the wrong type": COPY_HEAD + "general_config.INSTR_DESCRIPTORS = 'yes'\n",
        "a setting that is not a literal": COPY_HEAD + "general_config.INSTR_DESCRIPTORS = bool(1)\n",
        "a stage annotation that computes its name": COPY_HEAD + "annotate_stage(open('/etc/hostname').read())\n",
    }
    for reason, head in refused.items():
        assert instrumentation_spec(instrumented_copy(tmp_path, head=head), tmp_path) is None, reason
    assert instrumentation_spec(instrumented_copy(tmp_path, first="nn"), tmp_path) is None
    assert instrumentation_spec(instrumented_copy(tmp_path, interval="__import__('os')"), tmp_path) is None
    assert instrumentation_spec(instrumented_copy(tmp_path, later_interval=10), tmp_path) is None  # options differ
    no_torch_import = tmp_path / "_traincheck_no_import.py"
    no_torch_import.write_text(COPY_HEAD + INSTRUMENT.format(target="torch", interval=1))
    assert instrumentation_spec(no_torch_import, tmp_path) is None


def test_models_to_track_finds_the_model_its_optimizer_is_built_from():
    source = "net = Net()\nhead = net.head\noptimizer = torch.optim.Adam(net.head.parameters(), lr=1e-3)\n"
    assert models_to_track(source) == ["net"]
    assert models_to_track("opt = SGD(params, lr=0.1)\n") == []  # no model variable: API invariants only


def test_failed_log_is_a_stream_of_pretty_printed_objects():
    assert read_json_stream('{\n  "a": 1\n}\n{"b": [2,\n 3]}\n') == [{"a": 1}, {"b": [2, 3]}]
    assert read_json_stream("  \n") == []


def violation(description, step, process_id):
    return {"invariant": {"text_description": description, "relation": "APIContainRelation",
                          "num_positive_examples": 40},
            "trace": [{"meta_vars.step": step, "meta_vars.stage": "training", "process_id": process_id, "time": 5}]}


def test_violations_become_alarms_at_our_step_with_ranks_in_spawn_order():
    alarms = violation_alarms(
        [violation("Adam.step() always calls adam.adam()", 3, 812), violation("<script>x</script>", 0, 790)],
        step_times={2: 1000.5})
    assert [(a["step"], a["rank"]) for a in alarms] == [(-1, 0), (2, 1)]  # step 0 of TrainCheck is setup
    assert alarms[1]["rule"] == "APIContainRelation: Adam.step() always calls adam.adam()"
    assert alarms[1]["time"] == 1000.5 and alarms[0]["time"] is None
    assert alarms[1]["evidence"]["traincheck_step"] == 3


# torch first, as in the catalog's programs: a copy that runs program code before instrumenting torch does not
# fork from the instrumented zygote (instrumentation_spec).
TRAINING = "import torch\n" + PROGRAM_PREAMBLE + """
torch.manual_seed(args.seed)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
scale = torch.nn.Parameter(torch.ones(1))
if args.variant == "buggy":  # PT-FORUM-84911's shape: the optimizer only holds parameters that never get a gradient
    for p in model.parameters():
        p.requires_grad_(False)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    optimizer.zero_grad()
    x = torch.randn(32, 8)
    loss = (model(x) * scale - x.sum(dim=1, keepdim=True)).pow(2).mean()
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=args.variant == "buggy", trigger_step=0, summary="frozen model")
"""


TRAINING_TWO_RANKS = PROGRAM_PREAMBLE + """
import torch
import torch.multiprocessing as mp


def rank_main(rank, variant, seed, steps):
    torch.manual_seed(seed + rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    scale = torch.nn.Parameter(torch.ones(1))
    if variant == "buggy":
        for p in model.parameters():
            p.requires_grad_(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        optimizer.zero_grad()
        x = torch.randn(32, 8)
        loss = (model(x) * scale - x.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if rank == 0:
            report(event="step", step=step, rank=0, loss=float(loss), time=time.time())


if __name__ == "__main__":
    report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=2)
    torch.manual_seed(args.seed)  # traced in the parent: its trace writer exists before the ranks start
    mp.spawn(rank_main, args=(args.variant, args.seed, args.steps), nprocs=2)
    report(event="oracle", manifested=args.variant == "buggy", trigger_step=0, summary="frozen model")
"""


def alarm_rules(run):
    """The run's alarms, less those TrainCheck judges on the addresses of Python objects (``id()``), which
    differ between any two runs, warm or cold: its traces record a tensor's ``id()`` with it, so two calls
    may receive "the same arguments" (``DistinctArgumentRelation``) where the second reuses a freed tensor's
    memory, and an ``*_ID`` variable may or may not keep its value."""
    return sorted((alarm.step, alarm.rule) for alarm in run.alarms.all()
                  if not alarm.rule.startswith("DistinctArgumentRelation:") and not re.search(r"_ID\b", alarm.rule))


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
@pytest.mark.once
@pytest.mark.parametrize("name", ["traincheck", "traincheck_full"])
def test_traincheck_fits_on_a_clean_pipeline_then_catches_the_frozen_optimizer(name, settings):
    """Fit, check and parse; then the same runs started cold (every phase a new interpreter) raise the same
    alarms as the warm ones, forked from TrainCheck's zygote."""
    pipeline = ReproducerFactory(bug=None, name="tiny-adam")
    ReproducerVersionFactory(reproducer=pipeline, files={"pipeline.py": TRAINING}, entrypoint="pipeline.py",
                             default_steps=8, time_limit_seconds=60, memory_mb=4096)
    detector = do_record_detector(name, {"fit_pipelines": ["tiny-adam"]})
    bug = ReproducerVersionFactory(files={"repro.py": TRAINING}, time_limit_seconds=60, memory_mb=4096)
    runs = {variant: RunFactory(reproducer_version=bug, detector=detector, variant=variant, seed=1, steps=8)
            for variant in ("buggy", "fixed")}
    for run in runs.values():
        execute_run(run.pk)

    buggy, fixed = (Run.objects.get(pk=runs[v].pk) for v in ("buggy", "fixed"))
    assert buggy.status == fixed.status == RunStatus.SUCCEEDED, buggy.failure_reason + fixed.failure_reason
    artifact = FitArtifact.objects.get()  # fitted once, reused by the second run
    assert buggy.fit_artifact == fixed.fit_artifact == artifact
    assert artifact.summary["invariants"] > 10 and artifact.summary["references"] == ["pipeline/tiny-adam"]
    assert artifact.reference_versions.get().reproducer == pipeline

    caught = [a for a in buggy.alarms.all() if a.step >= 0 and "Adam.step()" in a.rule]
    assert caught, [a.rule for a in buggy.alarms.all()]
    assert buggy.detector_summary["rules_failed"] > 0
    assert buggy.detector_summary["rules_deployed"] == artifact.summary["invariants"]
    assert buggy.analysis_seconds > 0
    assert not [a.rule for a in fixed.alarms.all() if "Adam.step()" in a.rule]
    assert buggy.execution["start"] == fixed.execution["start"] == "warm", buggy.execution
    assert buggy.execution["zygote"] == "traincheck-instrumented", buggy.execution  # torch instrumented before

    # Two ranks, forked warm from the traced program: each writes a trace of its own, and the alarm is raised.
    two_ranks = ReproducerVersionFactory(files={"repro.py": TRAINING_TWO_RANKS}, time_limit_seconds=90,
                                         memory_mb=4096)
    spawned = RunFactory(reproducer_version=two_ranks, detector=detector, variant="buggy", seed=1, steps=8)
    execute_run(spawned.pk)
    spawned.refresh_from_db()
    assert spawned.status == RunStatus.SUCCEEDED and spawned.execution["start"] == "warm", spawned.failure_reason
    assert spawned.detector_summary["processes_traced"] == 3, spawned.detector_summary  # the parent and both ranks
    assert [a for a in spawned.alarms.all() if a.step >= 0 and "Adam.step()" in a.rule]

    # A script TrainCheck cannot instrument fails the run with the detector's reason, before anything runs.
    unparsable = ReproducerVersionFactory(files={"repro.py": TRAINING + "def (:\n"}, time_limit_seconds=60)
    refused = RunFactory(reproducer_version=unparsable, detector=detector, variant="buggy", seed=1, steps=8)
    execute_run(refused.pk)
    refused.refresh_from_db()
    assert refused.status == RunStatus.FAILED and refused.failure_kind == RunFailureKind.INTERNAL
    assert refused.failure_reason.startswith("The detector could not prepare the run: traincheck instrument failed")

    settings.SILENTBENCH_WARM_START = False
    for warm in (buggy, fixed, spawned):
        cold = RunFactory(reproducer_version=warm.reproducer_version, detector=detector, variant=warm.variant,
                          seed=1, steps=8)
        execute_run(cold.pk)
        cold.refresh_from_db()
        assert cold.status == RunStatus.SUCCEEDED and cold.execution["start"] == "cold", cold.failure_reason
        assert cold.execution["zygote"] == ""
        assert cold.fit_artifact == artifact
        assert alarm_rules(cold) == alarm_rules(warm)
        assert cold.detector_summary["processes_traced"] == warm.detector_summary["processes_traced"]


def test_models_to_track_follows_traincheck_to_the_first_optimizer_only():
    docstring = '"""Trains the model = a net; the optimizer is SGD."""\n'  # TrainCheck would hook this line
    source = docstring + "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    assert models_to_track(source) == []
    # a later optimizer of a rank-0-only reference must not be picked instead: rank 1 has no such model
    later = ("reference = Ref() if rank == 0 else None\n"
             "ref_optimizer = SGD(reference.parameters()) if reference else None\n")
    assert models_to_track(source + later) == []
