"""Each detector on a case it must catch and a clean case it must not, through the real sandbox."""
import pytest

from runners.actions.detectors import do_record_detector
from runners.detectors import all_plugins, get_plugin
from runners.execution import execute

from .factories import PROGRAM_PREAMBLE, ReproducerVersionFactory, RunFactory

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

TRAINING = PROGRAM_PREAMBLE + """
import torch
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


def run_program(source, detector, variant, steps, time_limit_seconds=60):
    """One succeeded run of the program ``source`` under ``detector``, through the real sandbox."""
    version = ReproducerVersionFactory(files={"repro.py": source}, time_limit_seconds=time_limit_seconds,
                                       memory_mb=4096)
    outcome = execute(RunFactory(reproducer_version=version, detector=do_record_detector(detector), variant=variant,
                                 steps=steps))
    assert outcome.succeeded, outcome.failure_reason + outcome.stderr
    return outcome


def run(detector, variant, setup="optimizer = torch.optim.SGD(model.parameters(), lr=0.1)", fault="pass", steps=6):
    return run_program(TRAINING.replace("{setup}", setup).replace("{fault}", fault), detector, variant, steps)


def rules(outcome):
    return [(alarm["rule"], alarm["step"]) for alarm in outcome.alarms]


def test_registry_has_the_detectors_with_versions():
    plugins = all_plugins()
    assert {"plain", "nan_inf", "param_not_updated", "loss_spike_megatron", "loss_spike_zscore", "grad_health",
            "cross_rank_consistency", "detect_anomaly", "differential", "traincheck", "traincheck_full"} <= set(plugins)
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


SPIKE_AT_STEP_9 = "if args.variant == 'buggy' and step == 9: loss = loss * 1000"
NAN_BACKWARD_AT_STEP_2 = "if args.variant == 'buggy' and step == 2: loss = loss + torch.sqrt(loss - 1e9)"


@pytest.mark.parametrize("detector", ["loss_spike_megatron", "loss_spike_zscore"])
def test_loss_spike_rules_catch_a_spike(detector):
    outcome = run(detector, "buggy", fault=SPIKE_AT_STEP_9, steps=12)
    assert min(step for _, step in rules(outcome)) == 9  # the spike's aftermath may alarm too


@pytest.mark.parametrize("detector", ["loss_spike_megatron", "loss_spike_zscore", "grad_health"])
def test_spike_and_gradient_rules_are_quiet_on_a_clean_run(detector):
    assert run(detector, "fixed", fault=SPIKE_AT_STEP_9, steps=12).alarms == []


def test_grad_health_catches_an_exploding_gradient():
    outcome = run("grad_health", "buggy", fault="if args.variant == 'buggy' and step == 5: loss = loss * 1e6")
    assert ("exploding_gradient", 5) in rules(outcome)


def test_grad_health_catches_a_frozen_update():
    outcome = run("grad_health", "buggy", setup="optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)")
    assert {rule for rule, _ in rules(outcome)} == {"update_ratio"}


def test_detect_anomaly_turns_a_nan_backward_into_an_alarm():
    outcome = run("detect_anomaly", "buggy", fault=NAN_BACKWARD_AT_STEP_2)
    assert rules(outcome) == [("autograd_anomaly", 2)]
    assert "returned nan" in outcome.alarms[0]["message"].lower()


def test_detect_anomaly_is_quiet_on_a_clean_run():
    assert run("detect_anomaly", "fixed", fault=NAN_BACKWARD_AT_STEP_2).alarms == []


TWO_RANKS = """
import argparse, json, os, socket, time
import torch, torch.distributed as dist, torch.multiprocessing as mp


def rank_main(rank, port, variant, steps):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    replicated, sharded = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.full((4,), float(rank)))
    optimizer = torch.optim.SGD([replicated, sharded], lr=0.1)
    # like the VERDICT reproducers: rank 0 alone trains a single-device reference with its own optimizer
    reference = torch.optim.SGD([torch.nn.Parameter(torch.ones(4))], lr=0.1) if rank == 0 else None
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for step in range(steps):
            optimizer.zero_grad()
            loss = (replicated * 2).sum() + (sharded * 3).sum()
            loss.backward()
            if variant == "buggy" and rank == 1 and step >= 3:
                replicated.grad.mul_(2)  # the replica on rank 1 drifts from step 3
            optimizer.step()
            if reference is not None:
                reference.step()
        if rank == 0:
            with open(os.environ["SILENTBENCH_REPORT"], "a") as f:
                f.write(json.dumps({"event": "oracle", "manifested": variant == "buggy", "trigger_step": 3}) + "\\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant"); parser.add_argument("--seed", type=int); parser.add_argument("--steps", type=int)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, args.variant, args.steps), nprocs=2)
"""


@pytest.mark.parametrize("variant, expected", [
    ("buggy", [("replicas_diverged", step) for step in range(3, 6) for _ in range(2)]),
    ("fixed", []),
])
def test_cross_rank_consistency_watches_replicas_not_shards(variant, expected):
    outcome = run_program(TWO_RANKS, "cross_rank_consistency", variant, steps=6, time_limit_seconds=120)
    assert sorted(rules(outcome)) == sorted(expected)
    assert all(alarm["evidence"]["param_indices"] == [0] for alarm in outcome.alarms)



def test_megatrons_param_hashes_compare_every_parameter_with_rank_0_shards_included():
    """Megatron assumes every parameter is a data-parallel replica: the shard differs on rank 1 from before the
    first step, in both variants; the replica joins it from step 3 in the buggy one."""
    found = {}
    for variant in ("buggy", "fixed"):
        outcome = run_program(TWO_RANKS, "param_hashes_megatron", variant, steps=6, time_limit_seconds=120)
        found[variant] = sorted((alarm["step"], alarm["rank"], tuple(alarm["evidence"]["param_indices"]))
                                for alarm in outcome.alarms)
    assert found["fixed"] == [(0, 1, (1,))] * 2 + [(step, 1, (1,)) for step in range(1, 6)]
    assert found["buggy"] == [(0, 1, (1,))] * 2 + [(step, 1, (1,)) for step in (1, 2)] + [
        (step, 1, (0, 1)) for step in range(3, 6)]

TWO_WAYS = PROGRAM_PREAMBLE + """
import torch
torch.manual_seed(args.seed)
w = torch.zeros(4, requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.1)
for step in range(args.steps):
    optimizer.zero_grad()
    micro = [torch.randn(8, 4) for _ in range(2)]
    for batch in micro:  # gradient accumulation over two micro-batches
        loss = (batch @ w - 1).pow(2).mean() / 2
        loss.backward()
    if args.variant == "buggy" and step >= 2:
        w.grad.mul_(0.5)  # the fault: one micro-batch's contribution is lost
    if os.environ.get("SILENTBENCH_DIFFERENTIAL") == "1":
        reference = sum(torch.autograd.grad((b @ w - 1).pow(2).mean() / 2, w)[0] for b in micro)
        report(event="compare", step=step, rank=0, quantity="grad", value=w.grad.tolist(),
               reference=reference.tolist(), time=time.time())
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=args.variant == "buggy", trigger_step=2, summary="half the gradient is lost")
"""


@pytest.mark.parametrize("variant, expected", [("buggy", [("mismatch:grad", 2)]), ("fixed", [])])
def test_differential_alarms_where_the_two_ways_first_disagree(variant, expected):
    outcome = run_program(TWO_WAYS, "differential", variant, steps=5)
    assert rules(outcome) == expected
    assert outcome.detector_summary["comparisons"] == 5


def test_differential_is_silent_for_a_reproducer_that_does_not_opt_in():
    outcome = run("differential", "buggy", fault=NAN_AT_STEP_3)
    assert outcome.alarms == [] and outcome.detector_summary["comparisons"] == 0


# A kernel whose float32 backward is 3 % off in the buggy variant and whose float64 one is right (a bug of one
# precision), for the programs below.
FLOAT32_OFF = """class Float32Off(torch.autograd.Function):
    forward = staticmethod(lambda ctx, x: x.clone())
    backward = staticmethod(lambda ctx, g: g * 1.03 if g.dtype == torch.float32 and args.variant == "buggy" else g)"""

# A compiled model whose buggy variant's graph computes 1 % more than eager mode (a backend of its own, as an Inductor
# miscompilation would); the fixed one compiles with aot_eager (no Inductor: seconds, not a minute). OffInFloat32's
# float32 backward is 3 % off in the buggy variant, its float64 one right (a kernel bug of one precision).
COMPILED = PROGRAM_PREAMBLE + """
import torch
torch.manual_seed(args.seed)

{float32_off}

class OffInFloat32(torch.nn.Linear):
    def forward(self, x):
        return Float32Off.apply(super().forward(x))

def off_by_one_percent(graph, example_inputs):
    return lambda *inputs: [output * 1.01 for output in graph(*inputs)]

model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout({dropout}),
                            torch.nn.LayerNorm(16), torch.nn.ReLU(), {last}(16, 1))
backend = off_by_one_percent if args.variant == "buggy" else "aot_eager"
compiled = torch.compile(model, backend=backend) if {compile} else model
gradients_seen = []  # the program's own hook on a weight: a shadow's gradients must not reach it
model[0].weight.register_hook(lambda grad: gradients_seen.append(1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled={autocast}):
        loss = compiled(torch.randn(8, 4)).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=args.variant == "buggy", trigger_step=0, summary="see the backend",
       evidence={"gradients_seen": len(gradients_seen)})
""".replace("{float32_off}", FLOAT32_OFF)


def shadowed(detector, variant, *, dropout=0.0, last="torch.nn.Linear", compile=True, autocast=False):
    source = (COMPILED.replace("{dropout}", str(dropout)).replace("{last}", last)
              .replace("{compile}", str(compile)).replace("{autocast}", str(autocast)))
    return run_program(source, detector, variant, steps=9, time_limit_seconds=120)


def losses(outcome):
    return [record["loss"] for record in outcome.steps]


def test_shadow_eager_catches_a_compiled_graph_that_computes_otherwise_from_its_first_sample():
    outcome = shadowed("shadow_eager", "buggy")
    assert rules(outcome) == [("compiled_differs_from_eager", step) for step in (0, 4, 8)]
    assert outcome.alarms[0]["evidence"]["differences"]["output 0"] == pytest.approx(0.01, rel=1e-3)


def test_shadow_eager_is_quiet_where_compiled_and_eager_agree_and_skips_random_graphs():
    assert shadowed("shadow_eager", "fixed").alarms == []
    assert shadowed("shadow_eager", "fixed", autocast=True).alarms == []
    random = shadowed("shadow_eager", "buggy", dropout=0.2)  # dropout: eager's draws are not the graph's
    assert random.alarms == [] and "left unchecked: it draws random numbers" in random.stderr


def test_shadow_precise_catches_a_layer_wrong_at_the_programs_precision_only():
    outcome = shadowed("shadow_precise", "buggy", last="OffInFloat32", compile=False)
    assert {(rule, step) for rule, step in rules(outcome)} == {("layer_differs_from_float64", s) for s in (0, 4, 8)}
    assert {alarm["evidence"]["site"] for alarm in outcome.alarms} == {"OffInFloat32 #3"}  # the 4th layer with weights
    assert shadowed("shadow_precise", "fixed", last="OffInFloat32", compile=False).alarms == []
    assert shadowed("shadow_precise", "fixed", last="OffInFloat32", compile=False, autocast=True).alarms == []


@pytest.mark.parametrize("detector", ["shadow_eager", "shadow_precise"])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_a_shadow_detector_changes_nothing_the_program_computes_warm_or_cold(detector, dropout, settings):
    """BatchNorm updates buffers in place, dropout draws random numbers and the program's hook sees each gradient of
    a weight: the recomputation touches none of it, and the losses are bitwise those of a plain run, warm or cold.
    Without dropout every sample is compared (nothing is left unchecked)."""
    plain = losses(shadowed("plain", "fixed", dropout=dropout))
    for warm in (True, False):
        settings.SILENTBENCH_WARM_START = warm
        outcome = shadowed(detector, "fixed", dropout=dropout, last="OffInFloat32")
        assert outcome.execution["start"] == ("warm" if warm else "cold")
        assert losses(outcome) == plain
        assert outcome.oracle["evidence"]["gradients_seen"] == 9
        assert outcome.alarms == []
        if dropout == 0.0 and detector == "shadow_eager":
            assert "left unchecked" not in outcome.stderr, outcome.stderr


# More layers than one step checks, a keyword argument, a compiled function and torch.compile(disable=True).
LAYERS = PROGRAM_PREAMBLE + """
import copy
import torch
torch.manual_seed(args.seed)

{float32_off}

class Scaled(torch.nn.Linear):
    def forward(self, x, scale=1.0, off=False):
        out = super().forward(x) * scale
        return Float32Off.apply(out) if off else out

layers = torch.nn.ModuleList(Scaled(8, 8) for _ in range(6))
optimizer = torch.optim.SGD(layers.parameters(), lr=0.01)
{compiles}
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    optimizer.zero_grad()
    x = torch.randn(4, 8)
    for index, layer in enumerate(layers):  # the last layer is 3 % off in float32 only (buggy)
        x = torch.tanh(layer(x, scale=0.5, off=index == 5))
    loss = x.pow(2).mean() + 0 * step_function(x)
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=args.variant == "buggy", trigger_step=0, summary="the last layer")
""".replace("{float32_off}", FLOAT32_OFF)


COMPILES = """step_function = torch.compile(lambda x: (x * 2).sum(), backend="eager")  # a function: not shadowed
unused = torch.compile(layers[0], disable=True)  # nothing compiled: the module itself, still copyable
assert unused is layers[0] and copy.deepcopy(unused).weight.data_ptr() != layers[0].weight.data_ptr()"""


def test_shadow_precise_takes_every_layer_in_turn_with_its_keyword_arguments():
    outcomes = {}
    for variant in ("buggy", "fixed"):
        source = LAYERS.replace("{compiles}", "step_function = lambda x: (x * 2).sum()")  # nothing compiled
        outcomes[variant] = run_program(source, "shadow_precise", variant, steps=9)
    # four layers a sampled step, those checked least recently first: #0-#3 at step 0, #4 and #5 at step 4, #0-#3
    # at step 8; the sixth is compared with its keyword arguments (else it would differ by its scale, or be
    # left unchecked)
    assert [(alarm["step"], alarm["evidence"]["site"]) for alarm in outcomes["buggy"].alarms] == [(4, "Scaled #5")]
    assert outcomes["fixed"].alarms == [] and "left unchecked" not in outcomes["fixed"].stderr


def test_shadow_eager_leaves_a_compiled_function_and_an_uncompiled_module_alone():
    outcome = run_program(LAYERS.replace("{compiles}", COMPILES), "shadow_eager", "fixed", steps=5)
    assert outcome.alarms == [] and "a compiled function is not shadowed" in outcome.stderr



# PT-124357's pattern: a stance that skips the guards runs a stale graph once the module changed (buggy); a replay
# of it would have to recompile, which it may not, so only the outputs are compared there.
STALE_GRAPH = PROGRAM_PREAMBLE + """
import torch
torch.manual_seed(args.seed)

class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.scale = torch.nn.Linear(4, 1), 1.0

    def forward(self, x):
        return self.linear(x) * self.scale

model = Scaled()
compiled = torch.compile(model, backend="eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    if step == 4:
        if args.variant == "buggy":
            torch.compiler.set_stance(skip_guard_eval_unsafe=True)
        model.scale = 2.0
    optimizer.zero_grad()
    loss = compiled(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=args.variant == "buggy", trigger_step=4, summary="a stale graph")
"""


def test_shadow_eager_compares_the_outputs_of_a_graph_it_cannot_replay():
    outcomes = {variant: run_program(STALE_GRAPH, "shadow_eager", variant, steps=9) for variant in ("buggy", "fixed")}
    assert rules(outcomes["buggy"]) == [("compiled_differs_from_eager", 4), ("compiled_differs_from_eager", 8)]
    assert outcomes["buggy"].alarms[0]["evidence"]["differences"]["output 0"] == pytest.approx(0.5, rel=1e-3)
    assert "gradients left unchecked: its compiled graph cannot be replayed" in outcomes["buggy"].stderr
    assert outcomes["fixed"].alarms == [] and "left unchecked" not in outcomes["fixed"].stderr


# A correct forward that changes its input and a buffer in place: the recomputation starts from copies taken before
# the program's call, or it would apply both changes twice and see a difference.
IN_PLACE = PROGRAM_PREAMBLE + """
import torch
torch.manual_seed(args.seed)

class Normalised(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x):
        self.mean.mul_(0.9).add_(0.1 * x.detach().mean(dim=0))
        x.sub_(self.mean)
        return self.linear(x)

model = Normalised()
compiled = torch.compile(model, backend="aot_eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    optimizer.zero_grad()
    loss = compiled(torch.randn(8, 4) + 3).pow(2).mean()
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=False, trigger_step=0, summary="nothing is wrong")
"""


def test_shadow_eager_recomputes_from_what_the_call_was_given_not_what_it_left():
    plain = run_program(IN_PLACE, "plain", "fixed", steps=9)
    outcome = run_program(IN_PLACE, "shadow_eager", "fixed", steps=9)
    assert outcome.alarms == [] and "left unchecked" not in outcome.stderr, outcome.stderr
    assert losses(outcome) == losses(plain)


def test_shadow_eager_leaves_a_module_with_hooks_unchecked():
    source = IN_PLACE.replace("model = Normalised()", "model = Normalised()\nmodel.linear.register_forward_hook("
                              "lambda module, args, output: None)")
    outcome = run_program(source, "shadow_eager", "fixed", steps=5)
    assert outcome.alarms == []
    assert "its modules have hooks, which a recomputation would run once more" in outcome.stderr

# SageMaker Debugger's rules (runners/detectors/smdebug_rules.py): a fixed-batch regression that trains cleanly,
# and per rule a fault that its documentation says it reports.
SMDEBUG = PROGRAM_PREAMBLE + """
import torch
torch.manual_seed(args.seed)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.{activation}(), torch.nn.Linear(16, 16),
                            torch.nn.{activation}(), torch.nn.Linear(16, 1))
lr = 0.01
buggy = args.variant == "buggy"
{setup}
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
data = torch.randn(64, 4)
target = data.sum(dim=1, keepdim=True)
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    optimizer.zero_grad()
    loss = (model(data) - target).pow(2).mean()
    {fault}
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=buggy, trigger_step=0, summary="see the fault")
"""
SMDEBUG_CASES = {  # rule: (activation, setup, fault, the alarms' rule and first step)
    "smdebug_vanishing_gradient": ("ReLU", "", "if buggy: loss = loss * 1e-12", ("vanishing_gradient", 0)),
    "smdebug_exploding_tensor": ("ReLU", "", "if buggy and step == 3: loss = loss * float('inf')",
                                 ("exploding_tensor", 3)),
    "smdebug_loss_not_decreasing": ("ReLU", "lr = 0.0 if buggy else lr", "", ("loss_not_decreasing", 10)),
    "smdebug_dead_relu": ("ReLU", "with torch.no_grad(): model[0].bias.fill_(-100.0 if buggy else 0.0)", "",
                          ("dead_relu", 0)),
    "smdebug_weight_update_ratio": ("ReLU", "lr = 1e-12 if buggy else lr", "", ("weight_update_ratio", 0)),
    "smdebug_poor_weight_initialization": ("ReLU", "with torch.no_grad(): model[2].weight.mul_(100 if buggy else 1)",
                                           "", ("activation_variance_ratio", 0)),
    "smdebug_saturated_activation": ("Tanh", "with torch.no_grad(): model[0].weight.mul_(1e5 if buggy else 1)", "",
                                     ("saturated_activation", 0)),
}


@pytest.mark.parametrize("detector", sorted(SMDEBUG_CASES))
def test_each_sagemaker_debugger_rule_reports_its_fault_and_is_quiet_on_clean_training(detector):
    activation, setup, fault, (rule, step) = SMDEBUG_CASES[detector]
    source = SMDEBUG.replace("{activation}", activation).replace("{setup}", setup).replace("{fault}", fault or "pass")
    outcomes = {variant: run_program(source, detector, variant, steps=12) for variant in ("buggy", "fixed")}
    assert min(rules(outcomes["buggy"]), key=lambda pair: pair[1]) == (rule, step), rules(outcomes["buggy"])
    assert outcomes["fixed"].alarms == [], rules(outcomes["fixed"])


# What the rules met in the second review and crashed on, or missed: a sparse gradient (an embedding's), an
# empty batch (an expert no token reached) and a loss that stays flat below zero.
EDGES = PROGRAM_PREAMBLE + """
import torch
torch.manual_seed(args.seed)
embedding, relu, head = torch.nn.Embedding(10, 4, sparse=True), torch.nn.ReLU(), torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD([*embedding.parameters(), *head.parameters()], lr=0.0)  # nothing learns: flat
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    optimizer.zero_grad()
    relu(torch.zeros(0, 4))
    loss = -1.0 - head(relu(embedding(torch.arange(8) % 10))).pow(2).mean()
    loss.backward()
    optimizer.step()
    report(event="step", step=step, rank=0, loss=float(loss), time=time.time())
report(event="oracle", manifested=True, trigger_step=0, summary="the loss never falls")
"""


@pytest.mark.parametrize("detector", sorted(SMDEBUG_CASES))
def test_the_sagemaker_rules_take_sparse_gradients_empty_batches_and_a_negative_loss(detector):
    outcome = run_program(EDGES, detector, "buggy", steps=12)
    if detector == "smdebug_loss_not_decreasing":
        assert rules(outcome) == [("loss_not_decreasing", 10)]


def test_megatrons_param_hashes_take_ranks_with_other_numbers_of_parameters():
    """Pipeline stages hold different parameters: the digests are gathered as objects, not as one tensor shape."""
    source = TWO_RANKS.replace("optimizer = torch.optim.SGD([replicated, sharded], lr=0.1)",
                               "optimizer = torch.optim.SGD([replicated, sharded] + ([torch.nn.Parameter("
                               "torch.zeros(2))] if rank == 1 else []), lr=0.1)")
    outcome = run_program(source, "param_hashes_megatron", "fixed", steps=3, time_limit_seconds=120)
    assert {(alarm["rank"], tuple(alarm["evidence"]["param_indices"])) for alarm in outcome.alarms} == {(1, (1, 2))}
