"""SilentBench reproducer for DS-1801: replicated LayerNorm left out of gradient clipping.

The bug
    DeepSpeed issue 1801 (the root cause of the BLOOM-176B LayerNorm divergence, presented
    as a case study in the TrainCheck talk). The bf16 optimizer builds the list of gradients
    with a helper, ``get_grads_for_norm``, that serves two purposes: computing the global
    gradient norm (``for_clipping=False``) and listing the gradients that are then scaled by
    the clip coefficient (``for_clipping=True``). For the norm, a replicated parameter (one
    that is *not* split by tensor parallelism, e.g. a LayerNorm weight) must be counted on
    tensor-parallel rank 0 only, otherwise it would be counted once per rank. That
    "skip replicated parameters on TP ranks != 0" test was indented one level too far out,
    so it also ran when building the *clipping* list. Result: on every TP rank except 0 the
    replicated parameters are never clipped. The global norm is still right, the loss looks
    normal, but the replicas of every LayerNorm get different updates and drift apart, which
    later shows up as a worse loss when the TP shards are merged.

This program (injected: the faulty logic is rebuilt in a small loop)
    Two processes (gloo, launched by this file with torch.multiprocessing.spawn) form one
    tensor-parallel group of size 2. The model is LayerNorm (replicated) -> column-parallel
    Linear (output features split over the ranks) -> GELU -> row-parallel Linear (input
    features split; the partial outputs are all-reduced) + replicated output bias, trained
    with SGD + momentum on a regression task generated from the seed. The usual Megatron
    conjugate pair of autograd functions (identity forward / all-reduce backward before the
    column-parallel layer, all-reduce forward / identity backward after the row-parallel
    layer) makes both ranks compute the same loss and identical replicated-param grads.
    Every step clips gradients to a global norm computed from ``grads_for_norm``. The
    ``buggy`` variant has the misplaced skip; the ``fixed`` variant has it inside the
    ``if not for_clipping`` branch. Nothing else differs. ``max_norm`` is small enough that
    clipping is active from step 0 on (the per-step clip coefficient is reported).

Oracle
    At the end rank 0 gathers the LayerNorm weight and bias of both ranks: *manifested*
    means the largest absolute difference between the two replicas exceeds 1e-6. In the
    fixed variant both replicas receive bitwise identical updates, so the difference is 0.

Trigger step
    0: the first step at which clipping is active (every step here); from that step the
    replicas on rank 1 receive unclipped gradients.
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

DEFAULT_STEPS = 30
TRIGGER_STEP = 0
WORLD_SIZE = 2
D_MODEL = 32
D_HIDDEN = 64
D_OUT = 16
BATCH = 32
LR = 0.5
MAX_NORM = 0.05
DIVERGENCE_THRESHOLD = 1e-6


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


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity in forward; sums the input gradient over the TP group in backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Sums partial outputs over the TP group in forward; identity in backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class TinyTPBlock(nn.Module):
    """LayerNorm (replicated) -> column-parallel Linear -> GELU -> row-parallel Linear."""

    def __init__(self, rank, world, gen):
        super().__init__()
        shard = D_HIDDEN // world
        lo, hi = rank * shard, (rank + 1) * shard
        # Full weights are drawn identically on every rank, then each rank keeps its shard,
        # so the sharded model equals one single-device model.
        full_w1 = torch.randn(D_HIDDEN, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
        full_b1 = 0.1 * torch.randn(D_HIDDEN, generator=gen)
        full_w2 = torch.randn(D_OUT, D_HIDDEN, generator=gen) / math.sqrt(D_HIDDEN)
        ln_w = 1.0 + 0.1 * torch.randn(D_MODEL, generator=gen)
        ln_b = 0.1 * torch.randn(D_MODEL, generator=gen)

        self.norm = nn.LayerNorm(D_MODEL)
        with torch.no_grad():
            self.norm.weight.copy_(ln_w)
            self.norm.bias.copy_(ln_b)
        self.w1 = nn.Parameter(full_w1[lo:hi].clone())  # column-parallel weight shard
        self.b1 = nn.Parameter(full_b1[lo:hi].clone())  # column-parallel bias shard
        self.w2 = nn.Parameter(full_w2[:, lo:hi].clone())  # row-parallel weight shard
        self.b2 = nn.Parameter(torch.zeros(D_OUT))  # replicated output bias
        for p in (self.w1, self.b1, self.w2):
            p.tensor_model_parallel = True  # Megatron-style marker for sharded params

    def forward(self, x):
        h = _CopyToTensorParallel.apply(self.norm(x))
        a = F.gelu(F.linear(h, self.w1, self.b1))
        partial = F.linear(a, self.w2)
        return _ReduceFromTensorParallel.apply(partial) + self.b2


def is_model_parallel_parameter(p):
    return bool(getattr(p, "tensor_model_parallel", False))


@torch.no_grad()
def grads_for_norm(params, tp_rank, variant, for_clipping=False):
    """Gradients used for the global norm (for_clipping=False) or to be clipped (True)."""
    grads = []
    for p in params:
        if p.grad is None:
            continue
        duplicate_copy = not (tp_rank == 0 or is_model_parallel_parameter(p))
        if variant == "fixed":
            # FIX: a replicated param's copy on TP rank != 0 is skipped only for the norm
            if not for_clipping and duplicate_copy:
                continue
        else:
            # BUG: the skip is one indentation level too far out, so it also drops the
            # replicated params of TP rank != 0 from the list that gets clipped
            if duplicate_copy:
                continue
        grads.append(p.grad)
    return grads


@torch.no_grad()
def clip_grads(params, tp_rank, variant, max_norm):
    norm_grads = grads_for_norm(params, tp_rank, variant, for_clipping=False)
    total_sq = torch.zeros(1, dtype=torch.float64)
    for g in norm_grads:
        total_sq += g.double().pow(2).sum()
    dist.all_reduce(total_sq)  # sum of squares over the TP group
    total_norm = float(total_sq.sqrt())
    clip_coef = max_norm / (total_norm + 1e-6)
    if clip_coef < 1.0:
        for g in grads_for_norm(params, tp_rank, variant, for_clipping=True):
            g.mul_(clip_coef)
    return total_norm, min(clip_coef, 1.0)


def make_data(gen, steps):
    teacher_in = torch.randn(D_MODEL, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
    teacher_out = torch.randn(D_OUT, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
    batches = []
    for _ in range(steps):
        x = 2.0 * torch.randn(BATCH, D_MODEL, generator=gen) + 0.5
        y = torch.tanh(x @ teacher_in.T) @ teacher_out.T
        batches.append((x, y))
    return batches


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    model = TinyTPBlock(rank, world, gen)
    batches = make_data(gen, steps)
    params = list(model.parameters())
    # The optimizer is built *before* the process group on purpose. Its constructor imports
    # torch._dynamo, and importing that while a group exists keeps the group alive after
    # destroy_process_group(); its gloo worker threads then race interpreter shutdown and
    # a clean run dies with SIGABRT about once in ten runs ("terminate called without an
    # active exception"). Built first, the group is torn down for real and exit is clean.
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        clipped_steps = 0
        first_clip_step = None
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            grad_norm, clip_coef = clip_grads(params, rank, variant, MAX_NORM)
            optimizer.step()
            if clip_coef < 1.0:
                clipped_steps += 1
                if first_clip_step is None:
                    first_clip_step = step
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(),
                    "time": time.time(),
                    "metrics": {"grad_norm": grad_norm, "clip_coef": clip_coef}})

        # Oracle: compare the LayerNorm replicas of all ranks on rank 0.
        local = torch.cat([model.norm.weight.detach(), model.norm.bias.detach()]).contiguous()
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        local_b2 = model.b2.detach().clone()
        gathered_b2 = [torch.empty_like(local_b2) for _ in range(world)]
        dist.all_gather(gathered_b2, local_b2)
        if rank == 0:
            w_diff = max(float((gathered[0][:D_MODEL] - g[:D_MODEL]).abs().max()) for g in gathered[1:])
            b_diff = max(float((gathered[0][D_MODEL:] - g[D_MODEL:]).abs().max()) for g in gathered[1:])
            b2_diff = max(float((gathered_b2[0] - g).abs().max()) for g in gathered_b2[1:])
            ln_diff = max(w_diff, b_diff)
            manifested = ln_diff > DIVERGENCE_THRESHOLD
            if manifested:
                summary = ("LayerNorm replicas diverged across TP ranks: max |rank0 - rank1| = %.3g "
                           "after %d steps" % (ln_diff, steps))
            else:
                summary = "LayerNorm replicas identical across TP ranks (max diff %.3g)" % ln_diff
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"ln_weight_max_abs_diff": w_diff, "ln_bias_max_abs_diff": b_diff,
                                 "replicated_out_bias_max_abs_diff": b2_diff,
                                 "threshold": DIVERGENCE_THRESHOLD, "max_norm": MAX_NORM,
                                 "clipped_steps": clipped_steps, "first_clip_step": first_clip_step}})
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
