"""SilentBench reproducer for VERDICT-INCONSISTENT-SCALING: loss divisor differs between ranks.

The bug
    VERDICT (SOSP 2025) crafted faults into nnScaler execution plans; in bugs 12 and 13 a
    scaling (div) op of the parallel plan used a different factor than the single-device model
    (0.5 where 1.0 was expected), on rank 0 only or on both ranks. In real data-parallel
    training the same class shows up as an inconsistent loss or gradient divisor: one rank
    normalises its loss by the global batch, another by its local batch. Every rank still
    trains, the gradients are still summed and identical after the all-reduce, but they are a
    mis-weighted, mis-scaled sum, so the run leaves the single-device trajectory.

This program (injected: the faulty logic is rebuilt in a small loop)
    Two data-parallel processes (gloo, launched by this file with torch.multiprocessing.spawn)
    train an MLP regressor (Linear -> GELU -> Linear -> GELU -> Linear) with SGD + momentum on
    a task generated from the seed. Each rank takes half of every global batch, sums its
    per-sample losses, divides the sum by a normaliser, and the gradients are then summed
    over the ranks with an all-reduce (no further averaging). The logged loss is the
    all-reduced sum of the normalised rank losses. In the ``fixed`` plan every rank divides
    by the global batch size (64); in the ``buggy`` plan rank 0 divides by the global batch
    size and rank 1 by its local batch size (32). Nothing else differs.

Oracle
    Parallel-vs-single-device equivalence. Rank 0 also holds a single-device copy of the model
    with the same initial weights and optimizer, and trains it in lockstep on the whole batch
    with the mean loss. After every step the replica of rank 0 is compared with it:
    *manifested* means that their relative L2 distance exceeds 1e-3 at some step (the fixed
    plan stays below 1e-7, float32 rounding only). Under ``SILENTBENCH_DIFFERENTIAL=1`` every
    rank also reports, every step, the norms of its all-reduced gradients against those of the
    mean-loss gradient of the whole global batch computed on its own replica.

Trigger step
    0: the inconsistent divisor is applied in the first step.
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
TRIGGER_STEP = 0
WORLD_SIZE = 2
D_IN = 16
D_HIDDEN = 32
D_OUT = 8
GLOBAL_BATCH = 64
LOCAL_BATCH = GLOBAL_BATCH // WORLD_SIZE
LR = 0.05
MOMENTUM = 0.9
TOLERANCE = 1e-3  # relative parameter distance parallel vs single-device
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


def loss_divisor(rank, variant):
    """The normaliser this rank's plan applies to its summed per-sample loss."""
    if variant == "fixed":
        # FIX: every rank divides by the global batch, so the summed gradients form the mean
        return GLOBAL_BATCH
    # BUG: rank 1's plan divides by its local batch instead, doubling its share of the sum
    return GLOBAL_BATCH if rank == 0 else LOCAL_BATCH


def init_weights(gen):
    dims = [(D_HIDDEN, D_IN), (D_HIDDEN, D_HIDDEN), (D_OUT, D_HIDDEN)]
    weights = {}
    for i, (n_out, n_in) in enumerate(dims):
        weights["w%d" % i] = torch.randn(n_out, n_in, generator=gen) / math.sqrt(n_in)
        weights["b%d" % i] = 0.1 * torch.randn(n_out, generator=gen)
    return weights


class MLP(nn.Module):
    def __init__(self, init):
        super().__init__()
        self.p = nn.ParameterDict({n: nn.Parameter(v.clone()) for n, v in init.items()})

    def forward(self, x):
        p = self.p
        h = F.gelu(F.linear(x, p["w0"], p["b0"]))
        h = F.gelu(F.linear(h, p["w1"], p["b1"]))
        return F.linear(h, p["w2"], p["b2"])


def per_sample_loss(pred, y):
    return (pred - y).pow(2).mean(dim=1)


def make_data(gen, steps):
    teacher = torch.randn(D_OUT, D_IN, generator=gen) / math.sqrt(D_IN)
    batches = []
    for _ in range(steps):
        x = torch.randn(GLOBAL_BATCH, D_IN, generator=gen)
        y = torch.sin(2.0 * x @ teacher.T) + 0.2
        batches.append((x, y))
    return batches


@torch.no_grad()
def relative_distance(model, reference):
    num = sum(float((model.p[n] - r).double().pow(2).sum()) for n, r in reference.p.items())
    den = sum(float(r.double().pow(2).sum()) for r in reference.p.values())
    return math.sqrt(num / den)


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    init = init_weights(gen)
    batches = make_data(gen, steps)
    model = MLP(init)
    reference = MLP(init) if rank == 0 else None
    # Optimizers are built *before* the process group: their constructor imports torch._dynamo,
    # and doing that while a group exists makes destroy_process_group() racy (SIGABRT at exit).
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM) if reference else None
    divisor = loss_divisor(rank, variant)
    local = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        distances, loss_diffs = [], []
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            loss = per_sample_loss(model(x[local]), y[local]).sum() / divisor
            loss.backward()
            for q in model.parameters():  # gradients are summed over the ranks
                dist.all_reduce(q.grad)
            if DIFFERENTIAL:  # the gradient two ways: summed over the ranks vs the whole batch on one device
                params = list(model.parameters())
                whole_batch = torch.autograd.grad(per_sample_loss(model(x), y).mean(), params)
                report({"event": "compare", "step": step, "rank": rank, "quantity": "grad_norms",
                        "value": [float(q.grad.norm()) for q in params],
                        "reference": [float(g.norm()) for g in whole_batch], "time": time.time()})
            optimizer.step()
            loss_t = loss.detach().clone()
            dist.all_reduce(loss_t)
            global_loss = float(loss_t)
            metrics = {"loss_divisor": float(divisor)}
            if rank == 0:  # the single-device run, in lockstep on the whole batch
                ref_optimizer.zero_grad()
                ref_loss = per_sample_loss(reference(x), y).mean()
                ref_loss.backward()
                ref_optimizer.step()
                loss_diff = abs(global_loss - ref_loss.item()) / max(abs(ref_loss.item()), 1e-12)
                distance = relative_distance(model, reference)
                distances.append(distance)
                loss_diffs.append(loss_diff)
                metrics.update({"ref_loss": ref_loss.item(), "loss_rel_diff": loss_diff,
                                "param_rel_diff": distance})
            report({"event": "step", "step": step, "rank": rank, "loss": global_loss,
                    "time": time.time(), "metrics": metrics})

        if rank == 0:
            worst = max(distances, default=0.0)
            manifested = worst > TOLERANCE
            first_bad = next((i for i, d in enumerate(distances) if d > TOLERANCE), None)
            if manifested:
                summary = ("parallel run departs from the single-device run: relative parameter "
                           "distance %.3g (tolerance %.0e), first over it at step %s"
                           % (worst, TOLERANCE, first_bad))
            else:
                summary = ("parallel run matches the single-device run: max relative parameter "
                           "distance %.3g" % worst)
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"max_param_rel_diff": worst, "final_param_rel_diff": distances[-1] if distances else None,
                                 "max_loss_rel_diff": max(loss_diffs, default=0.0),
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
