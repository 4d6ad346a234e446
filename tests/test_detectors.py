"""Each detector on a case it must catch and a clean case it must not, through the real sandbox."""
import pytest

from runners.detectors import all_plugins, get_plugin
from runners.execution import execute
from runners.services import detector_record

from .factories import ReproducerVersionFactory, RunFactory

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

TRAINING = """
import argparse, json, os, time
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--variant"); parser.add_argument("--seed", type=int); parser.add_argument("--steps", type=int)
args = parser.parse_args()
def report(**record):
    with open(os.environ["SILENTBENCH_REPORT"], "a") as f:
        f.write(json.dumps(record) + "\\n")
torch.manual_seed(args.seed)
model = torch.nn.Linear(4, 1)
{setup}
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    {fault}
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=args.variant == "buggy", trigger_step=3, summary="see the fault line")
"""
NAN_AT_STEP_3 = "if args.variant == 'buggy' and step >= 3: loss = loss * float('nan')"
FROZEN = "for p in model.parameters(): p.requires_grad_(args.variant != 'buggy')\nmodel.bias.requires_grad_(True)"


def run(detector, variant, setup="optimizer = torch.optim.SGD(model.parameters(), lr=0.1)", fault="pass"):
    source = TRAINING.replace("{setup}", setup).replace("{fault}", fault)
    version = ReproducerVersionFactory(files={"repro.py": source}, time_limit_seconds=60, memory_mb=4096)
    outcome = execute(RunFactory(reproducer_version=version, detector=detector_record(detector), variant=variant,
                                 steps=6))
    assert outcome.succeeded, outcome.failure_reason + outcome.stderr
    return outcome


def rules(outcome):
    return [(alarm["rule"], alarm["step"]) for alarm in outcome.alarms]


def test_registry_has_the_skeleton_detectors_with_versions():
    plugins = all_plugins()
    assert {"plain", "nan_inf", "param_not_updated"} <= set(plugins)
    assert all(plugin.version and plugin.description for plugin in plugins.values())
    with pytest.raises(KeyError, match="unknown detector"):
        get_plugin("nope")


def test_nan_inf_catches_a_nan_loss_at_its_step():
    outcome = run("nan_inf", "buggy", fault=NAN_AT_STEP_3)
    assert ("loss_nonfinite", 3) in rules(outcome)
    assert ("grad_nonfinite", 3) in rules(outcome)
    assert min(step for _, step in rules(outcome)) == 3


def test_nan_inf_is_quiet_on_a_clean_run():
    assert run("nan_inf", "fixed", fault=NAN_AT_STEP_3).alarms == []


def test_param_not_updated_catches_an_optimizer_over_frozen_parameters():
    setup = "model.weight.requires_grad_(False)\noptimizer = torch.optim.Adam([model.weight], lr=0.1)"
    outcome = run("param_not_updated", "buggy", setup=setup)
    assert rules(outcome) == [("no_parameter_updated", step) for step in range(6)]


def test_param_not_updated_is_quiet_when_training_works():
    assert run("param_not_updated", "fixed").alarms == []


def test_plain_injects_nothing():
    outcome = run("plain", "buggy", fault=NAN_AT_STEP_3)
    assert outcome.alarms == []


def test_every_rank_of_a_spawned_run_is_instrumented():
    setup = """
import torch.multiprocessing as mp
def rank_main(rank):
    os.environ["RANK"] = str(rank)
    m = torch.nn.Linear(2, 1)
    m.weight.requires_grad_(False)
    opt = torch.optim.SGD([m.weight], lr=0.1)
    opt.step()
if __name__ == "__main__":
    mp.spawn(rank_main, nprocs=2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""
    outcome = run("param_not_updated", "fixed", setup=setup)
    assert sorted(alarm["rank"] for alarm in outcome.alarms) == [0, 1]
