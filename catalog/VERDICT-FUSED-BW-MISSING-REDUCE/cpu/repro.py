"""SilentBench reproducer for VERDICT-FUSED-BW-MISSING-REDUCE: fused op loses its backward all-reduce.

The bug
    VERDICT (SOSP 2025) crafted faults into nnScaler execution plans; in bug 5 the fused
    communication primitive that sits in front of a column-parallel layer (identity in the
    forward pass, all-reduce of the input gradient in the backward pass) had its backward
    all-reduce replaced by an identity. The forward values are all correct, but the gradient
    that flows back into the replicated part of the network is only the local rank's partial
    sum, so every replicated weight upstream of the tensor-parallel block gets a wrong
    gradient, differently on every rank.

This program (injected: the faulty logic is rebuilt in a small loop)
    Two processes (gloo, launched by this file with torch.multiprocessing.spawn) form one
    tensor-parallel group. The model is a replicated input Linear -> replicated LayerNorm ->
    fused "copy to TP region" op -> column-parallel Linear (hidden features split) -> GELU
    -> row-parallel Linear (input features split; the partial outputs are all-reduced in the
    forward pass) + replicated output bias, trained with SGD + momentum on a regression task
    generated from the seed. In the ``fixed`` plan the fused op's backward all-reduces the
    input gradient over the TP group; in the ``buggy`` plan it returns the local gradient
    unchanged. Nothing else differs.

Oracle
    Parallel-vs-single-device equivalence. Rank 0 also holds an unsharded copy of the same
    model with the same initial weights and optimizer, and trains it in lockstep on the same
    batches. After every step the parameters of the parallel model (shards of all ranks,
    replicated params of rank 0) are compared on rank 0 with the single-device parameters:
    *manifested* means that their relative L2 distance exceeds 1e-3 at some step (the fixed
    plan stays below 1e-7, float32 rounding only). The cross-rank drift of the replicated
    params is reported as evidence.

Trigger step
    0: the first backward pass already returns partial input gradients (the loss of step 0
    is still right, the update of step 0 is not).
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
D_MODEL = 24
D_HIDDEN = 48
D_OUT = 8
BATCH = 32
LR = 0.05
MOMENTUM = 0.9
TOLERANCE = 1e-3  # relative parameter distance parallel vs single-device
REPLICATED = ("w0", "b0", "ln_w", "ln_b", "b2")
SHARD_DIM = {"w1": 0, "b1": 0, "w2": 1}  # column-parallel rows, row-parallel columns


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


class _IdentityAllReduce(torch.autograd.Function):
    """Fused primitive in front of a column-parallel layer: identity fwd, all-reduce bwd."""

    @staticmethod
    def forward(ctx, x, variant):
        ctx.variant = variant
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.variant == "fixed":
            # FIX: sum the partial input gradients of all TP ranks
            grad = grad.contiguous().clone()
            dist.all_reduce(grad)
        else:
            # BUG: the backward all-reduce was replaced by an identity; the local partial stays
            grad = grad.contiguous().clone()
        return grad, None


class _AllReduceIdentity(torch.autograd.Function):
    """Fused primitive after a row-parallel layer: all-reduce fwd, identity bwd."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def init_full_weights(gen):
    """Full (unsharded) initial weights, drawn identically on every rank."""
    return {
        "w0": torch.randn(D_MODEL, D_IN, generator=gen) / math.sqrt(D_IN),
        "b0": 0.1 * torch.randn(D_MODEL, generator=gen),
        "ln_w": 1.0 + 0.1 * torch.randn(D_MODEL, generator=gen),
        "ln_b": 0.1 * torch.randn(D_MODEL, generator=gen),
        "w1": torch.randn(D_HIDDEN, D_MODEL, generator=gen) / math.sqrt(D_MODEL),
        "b1": 0.1 * torch.randn(D_HIDDEN, generator=gen),
        "w2": torch.randn(D_OUT, D_HIDDEN, generator=gen) / math.sqrt(D_HIDDEN),
        "b2": torch.zeros(D_OUT),
    }


def _trunk(p, x):
    h = F.linear(x, p["w0"], p["b0"])
    return F.layer_norm(h, (D_MODEL,), p["ln_w"], p["ln_b"])


class ReferenceModel(nn.Module):
    """The single-device model."""

    def __init__(self, full):
        super().__init__()
        self.p = nn.ParameterDict({n: nn.Parameter(v.clone()) for n, v in full.items()})

    def forward(self, x):
        p = self.p
        a = F.gelu(F.linear(_trunk(p, x), p["w1"], p["b1"]))
        return F.linear(a, p["w2"], p["b2"])


class TensorParallelModel(nn.Module):
    """The same model; w1/b1 split by rows (column-parallel), w2 by columns (row-parallel)."""

    def __init__(self, full, rank, world):
        super().__init__()
        shard = D_HIDDEN // world
        lo, hi = rank * shard, (rank + 1) * shard
        local = {}
        for name, value in full.items():
            if name in SHARD_DIM:
                value = value.narrow(SHARD_DIM[name], lo, hi - lo)
            local[name] = nn.Parameter(value.clone())
        self.p = nn.ParameterDict(local)

    def forward(self, x, variant):
        p = self.p
        h = _IdentityAllReduce.apply(_trunk(p, x), variant)
        a = F.gelu(F.linear(h, p["w1"], p["b1"]))
        return _AllReduceIdentity.apply(F.linear(a, p["w2"])) + p["b2"]


@torch.no_grad()
def gather_parallel_state(model, world):
    """Collective: full params of the parallel model and the cross-rank drift of replicas."""
    full, drift = {}, 0.0
    for name, p in model.p.items():
        parts = [torch.empty_like(p) for _ in range(world)]
        dist.all_gather(parts, p.detach().contiguous())
        if name in SHARD_DIM:
            full[name] = torch.cat(parts, dim=SHARD_DIM[name])
        else:
            full[name] = parts[0]
            drift = max(drift, max(float((parts[0] - q).abs().max()) for q in parts[1:]))
    return full, drift


@torch.no_grad()
def relative_distance(params, reference):
    num = sum(float((params[n] - r).double().pow(2).sum()) for n, r in reference.p.items())
    den = sum(float(r.double().pow(2).sum()) for r in reference.p.values())
    return math.sqrt(num / den)


def make_data(gen, steps):
    teacher = torch.randn(D_OUT, D_IN, generator=gen) / math.sqrt(D_IN)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, D_IN, generator=gen) + 0.3
        y = torch.tanh(2.0 * x @ teacher.T)
        batches.append((x, y))
    return batches


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    full = init_full_weights(gen)
    batches = make_data(gen, steps)
    model = TensorParallelModel(full, rank, world)
    reference = ReferenceModel(full) if rank == 0 else None
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
            optimizer.zero_grad()
            loss = F.mse_loss(model(x, variant), y)
            loss.backward()
            optimizer.step()
            params, drift = gather_parallel_state(model, world)
            metrics = {}
            if rank == 0:  # the single-device run, in lockstep on the same batch
                ref_optimizer.zero_grad()
                ref_loss = F.mse_loss(reference(x), y)
                ref_loss.backward()
                ref_optimizer.step()
                loss_diff = abs(loss.item() - ref_loss.item()) / max(abs(ref_loss.item()), 1e-12)
                distance = relative_distance(params, reference)
                distances.append(distance)
                loss_diffs.append(loss_diff)
                drifts.append(drift)
                metrics = {"ref_loss": ref_loss.item(), "loss_rel_diff": loss_diff,
                           "param_rel_diff": distance, "replica_max_abs_diff": drift}
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(),
                    "time": time.time(), "metrics": metrics})

        if rank == 0:
            worst = max(distances, default=0.0)
            manifested = worst > TOLERANCE
            first_bad = next((i for i, d in enumerate(distances) if d > TOLERANCE), None)
            if manifested:
                summary = ("parallel run departs from the single-device run: relative parameter "
                           "distance %.3g (tolerance %.0e), first over it at step %s; replicated "
                           "params drift apart across ranks by %.3g"
                           % (worst, TOLERANCE, first_bad, max(drifts, default=0.0)))
            else:
                summary = ("parallel run matches the single-device run: max relative parameter "
                           "distance %.3g" % worst)
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"max_param_rel_diff": worst, "final_param_rel_diff": distances[-1] if distances else None,
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
