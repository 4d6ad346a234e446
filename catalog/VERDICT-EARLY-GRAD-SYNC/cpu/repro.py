"""SilentBench reproducer for VERDICT-EARLY-GRAD-SYNC: gradient reducer runs before the last backward op.

The bug
    VERDICT (SOSP 2025) crafted faults into nnScaler execution plans (2 microbatches per step);
    in bug 14 the schedule launches the cross-data-parallel gradient reducer before the last
    backward operator of the second (final) microbatch has run. That operator's gradient
    contribution is accumulated into the local gradients after they were already averaged,
    so it is never synchronized: every replica applies a different, partly local update,
    which matches neither the other replicas nor single-device gradient accumulation.

This program (injected: the faulty logic is rebuilt in a small loop)
    Two data-parallel processes (gloo, launched by this file with torch.multiprocessing.spawn)
    train a trunk (Linear -> GELU -> Linear -> GELU) plus head (Linear) regressor with
    SGD + momentum on a task generated from the seed. The backward pass of a microbatch is
    split into two operators, head backward (loss -> trunk output gradient, head weight
    gradients) and trunk backward, and a step is executed from an explicit list of operators.
    The global batch ramps up: steps 0-3 use one microbatch per rank and the plain schedule
    (forward, head backward, trunk backward, reduce); from step 4 on every rank accumulates
    2 microbatches with the accumulation schedule (all forwards, then the two backward
    operators of each microbatch, then reduce). The reducer averages all gradients over the
    ranks with an all-reduce. In the ``fixed`` plan the accumulation schedule puts the reducer
    after the last operator; in the ``buggy`` plan it puts it before the trunk backward of
    the last microbatch. Nothing else differs.

Oracle
    Parallel-vs-single-device equivalence. Rank 0 also holds a single-device copy of the model
    with the same initial weights and optimizer, and trains it in lockstep on the whole global
    batch of each step. After every step the replica of rank 0 is compared with it:
    *manifested* means that their relative L2 distance exceeds 1e-3 at some step (the fixed
    plan stays below 1e-7, float32 rounding only). The cross-rank drift of the replicas is
    reported as evidence. Under ``SILENTBENCH_DIFFERENTIAL=1`` every rank also reports, every
    step, the norms of its accumulated, synchronised gradients against those of the gradient
    of the whole global batch computed in one pass on its own replica.

Trigger step
    4: the first step with more than one microbatch, i.e. the first one that runs the
    accumulation schedule. Steps 0-3 are identical in both variants.
"""
import argparse
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_STEPS = 20
RAMP_STEPS = 4  # steps that run with a single microbatch
TRIGGER_STEP = RAMP_STEPS
WORLD_SIZE = 2
MICRO_BATCH = 8  # per rank and microbatch
D_IN = 16
D_HIDDEN = 32
D_OUT = 8
LR = 0.05
MOMENTUM = 0.9
TOLERANCE = 1e-3  # relative parameter distance parallel vs single-device
TRUNK = ("w0", "b0", "w1", "b1")
DIFFERENTIAL = os.environ.get("SILENTBENCH_DIFFERENTIAL") == "1"


# --- reporting helper (copied into every reproducer; no SilentBench import) ----------
def _clean(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def report(record):
    line = json.dumps(_clean(record), allow_nan=False)
    path = os.environ.get("SILENTBENCH_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
    else:  # one write per line, so that lines of several ranks do not interleave
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
# -------------------------------------------------------------------------------------


def microbatches_at(step):
    return 1 if step < RAMP_STEPS else 2


def accumulation_schedule(n_micro, variant):
    """Operator order of a step that accumulates n_micro > 1 microbatches."""
    ops = [("forward", m) for m in range(n_micro)]
    for m in range(n_micro):
        ops += [("backward_head", m), ("backward_trunk", m)]
    if variant == "fixed":
        # FIX: the reducer follows the last backward operator of the last microbatch
        ops.append(("reduce", None))
    else:
        # BUG: the reducer is launched before the last backward operator (the trunk backward
        # of the last microbatch), whose gradients are then added after the all-reduce
        ops.insert(len(ops) - 1, ("reduce", None))
    return ops


def step_schedule(n_micro, variant):
    if n_micro == 1:  # no accumulation: the plain schedule
        return [("forward", 0), ("backward_head", 0), ("backward_trunk", 0), ("reduce", None)]
    return accumulation_schedule(n_micro, variant)


def init_weights(gen):
    dims = [(D_HIDDEN, D_IN), (D_HIDDEN, D_HIDDEN), (D_OUT, D_HIDDEN)]
    weights = {}
    for i, (n_out, n_in) in enumerate(dims):
        weights["w%d" % i] = torch.randn(n_out, n_in, generator=gen) / math.sqrt(n_in)
        weights["b%d" % i] = 0.1 * torch.randn(n_out, generator=gen)
    return weights


class TrunkHead(nn.Module):
    def __init__(self, init):
        super().__init__()
        self.p = nn.ParameterDict({n: nn.Parameter(v.clone()) for n, v in init.items()})

    def trunk(self, x):
        p = self.p
        h = F.gelu(F.linear(x, p["w0"], p["b0"]))
        return F.gelu(F.linear(h, p["w1"], p["b1"]))

    def head(self, h):
        return F.linear(h, self.p["w2"], self.p["b2"])

    def forward(self, x):
        return self.head(self.trunk(x))


def run_schedule(model, ops, micro_inputs, world):
    """Executes one step's operators; returns this rank's loss (mean over its samples)."""
    n_micro = len(micro_inputs)
    state, total = {}, 0.0
    for kind, m in ops:
        if kind == "forward":
            x, y = micro_inputs[m]
            trunk_out = model.trunk(x)
            head_in = trunk_out.detach().requires_grad_(True)
            loss = F.mse_loss(model.head(head_in), y) / n_micro
            state[m] = (trunk_out, head_in, loss)
            total += loss.item()
        elif kind == "backward_head":
            state[m][2].backward()
        elif kind == "backward_trunk":
            trunk_out, head_in, _ = state[m]
            trunk_out.backward(head_in.grad)
        else:  # reduce: average every gradient over the data-parallel ranks
            for q in model.parameters():
                if q.grad is not None:
                    dist.all_reduce(q.grad)
                    q.grad.div_(world)
    return total


def make_data(gen, steps, world):
    teacher = torch.randn(D_OUT, D_IN, generator=gen) / math.sqrt(D_IN)
    batches = []
    for step in range(steps):
        n = world * microbatches_at(step) * MICRO_BATCH
        x = torch.randn(n, D_IN, generator=gen)
        y = torch.sin(2.0 * x @ teacher.T)
        batches.append((x, y))
    return batches


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    init = init_weights(gen)
    batches = make_data(gen, steps, world)
    model = TrunkHead(init)
    reference = TrunkHead(init) if rank == 0 else None
    # Optimizers are built *before* the process group: their constructor imports torch._dynamo,
    # and doing that while a group exists makes destroy_process_group() racy (SIGABRT at exit).
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM) if reference else None

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        distances, loss_diffs, drifts = [], [], []
        for step, (x, y) in enumerate(batches):
            n_micro = microbatches_at(step)
            micro_inputs = []
            for m in range(n_micro):
                lo = (m * world + rank) * MICRO_BATCH
                micro_inputs.append((x[lo:lo + MICRO_BATCH], y[lo:lo + MICRO_BATCH]))
            optimizer.zero_grad()
            local_loss = run_schedule(model, step_schedule(n_micro, variant), micro_inputs, world)
            if DIFFERENTIAL:  # the gradient two ways: accumulated and synchronised vs the global batch in one pass
                params = list(model.parameters())
                whole_batch = torch.autograd.grad(F.mse_loss(model(x), y), params)
                report({"event": "compare", "step": step, "rank": rank, "quantity": "grad_norms",
                        "value": [float(q.grad.norm()) for q in params],
                        "reference": [float(g.norm()) for g in whole_batch], "time": time.time()})
            optimizer.step()
            loss_t = torch.tensor([local_loss / world])
            dist.all_reduce(loss_t)
            flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            loss = float(loss_t)
            metrics = {"microbatches": float(n_micro)}
            if rank == 0:  # the single-device run, in lockstep on the whole global batch
                ref_optimizer.zero_grad()
                ref_loss = F.mse_loss(reference(x), y)
                ref_loss.backward()
                ref_optimizer.step()
                with torch.no_grad():
                    ref_flat = torch.cat([q.detach().reshape(-1) for q in reference.parameters()])
                    distance = float((flat - ref_flat).double().norm() / ref_flat.double().norm())
                    drift = max(float((gathered[0] - g).abs().max()) for g in gathered[1:])
                loss_diff = abs(loss - ref_loss.item()) / max(abs(ref_loss.item()), 1e-12)
                distances.append(distance)
                loss_diffs.append(loss_diff)
                drifts.append(drift)
                metrics.update({"ref_loss": ref_loss.item(), "loss_rel_diff": loss_diff,
                                "param_rel_diff": distance, "replica_max_abs_diff": drift})
            report({"event": "step", "step": step, "rank": rank, "loss": loss,
                    "time": time.time(), "metrics": metrics})

        if rank == 0:
            worst = max(distances, default=0.0)
            manifested = worst > TOLERANCE
            first_bad = next((i for i, d in enumerate(distances) if d > TOLERANCE), None)
            before = max(distances[:RAMP_STEPS], default=0.0)
            if manifested:
                summary = ("parallel run departs from the single-device run: relative parameter "
                           "distance %.3g (tolerance %.0e), first over it at step %s; replicas "
                           "drift apart by %.3g" % (worst, TOLERANCE, first_bad, max(drifts, default=0.0)))
            else:
                summary = ("parallel run matches the single-device run: max relative parameter "
                           "distance %.3g" % worst)
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"max_param_rel_diff": worst, "final_param_rel_diff": distances[-1] if distances else None,
                                 "max_param_rel_diff_before_trigger": before,
                                 "max_loss_rel_diff": max(loss_diffs, default=0.0),
                                 "replica_max_abs_diff": max(drifts, default=0.0),
                                 "first_step_over_tolerance": first_bad, "tolerance": TOLERANCE}})
        dist.barrier()  # nobody tears the group down while another rank still uses it
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    mp.spawn(worker, args=(WORLD_SIZE, free_port(), args.variant, args.seed, args.steps),
             nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main()
