"""SilentBench reproducer for VERDICT-BW-WRONG-TENSORS: rotary backward swaps its gradients on rank 0.

The bug
    VERDICT (SOSP 2025) crafted faults into nnScaler execution plans; in bugs 10 and 11 the
    backward operator of one rank was wired to the wrong tensors: the backward of a gradient
    fan-in consumed the wrong gradients, or the backward of apply_rotary_emb (two inputs,
    query and key, two outputs) returned its two input gradients in swapped order. Query and
    key have the same shape, so the swap raises nothing; the forward pass and the loss of
    that step are unchanged, but the query and key projections of that rank receive each
    other's gradients, and the parallel run leaves the single-device trajectory.

This program (injected: the faulty logic is rebuilt in a small loop)
    Two data-parallel processes (gloo, launched by this file with torch.multiprocessing.spawn)
    train a one-head attention regressor: query/key/value projections -> rotary position
    embedding applied by a custom autograd Function (hand-written forward and backward, as a
    fused kernel would be) -> softmax attention -> mean over positions -> output Linear,
    with SGD + momentum on a task generated from the seed. Each rank takes half of every
    batch; gradients are averaged with an all-reduce. In the ``fixed`` plan the rotary
    backward returns (grad_query, grad_key) on both ranks; in the ``buggy`` plan rank 0 runs
    a mutant that returns (grad_key, grad_query), rank 1 is untouched. Nothing else differs.

Oracle
    Parallel-vs-single-device equivalence. Rank 0 also holds a single-device copy of the model
    (rotary embedding written with plain autograd ops) with the same initial weights and
    optimizer, and trains it in lockstep on the whole batch. After every step the replica of
    rank 0 is compared with it: *manifested* means that their relative L2 distance exceeds
    1e-3 at some step (the fixed plan stays below 1e-7, float32 rounding only).

Trigger step
    0: the first backward pass already runs the mutant (the loss of step 0 is still right,
    the update of step 0 is not).
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
SEQ = 8
D_IN = 12
D_HEAD = 16
D_OUT = 4
BATCH = 32  # global batch, split evenly over the ranks
LR = 0.1
MOMENTUM = 0.9
TOLERANCE = 1e-3  # relative parameter distance parallel vs single-device


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


def rotary_tables():
    half = D_HEAD // 2
    inv_freq = 1.0 / (100.0 ** (torch.arange(half, dtype=torch.float32) / half))
    angles = torch.arange(SEQ, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)  # [SEQ, D_HEAD]
    return angles.cos(), angles.sin()


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _rotate_half_transposed(g):
    g1, g2 = g.chunk(2, dim=-1)
    return torch.cat([g2, -g1], dim=-1)


def rotary_autograd(q, k, cos, sin):
    """Single-device rotary embedding, differentiated by autograd."""
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class _ApplyRotary(torch.autograd.Function):
    """Fused rotary embedding of query and key with a hand-written backward."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, plan):
        ctx.save_for_backward(cos, sin)
        ctx.plan = plan
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    @staticmethod
    def backward(ctx, grad_q_rot, grad_k_rot):
        cos, sin = ctx.saved_tensors
        grad_q = grad_q_rot * cos + _rotate_half_transposed(grad_q_rot * sin)
        grad_k = grad_k_rot * cos + _rotate_half_transposed(grad_k_rot * sin)
        if ctx.plan == "fixed":
            # FIX: the input gradients are returned in input order (query, key)
            return grad_q, grad_k, None, None, None
        # BUG: the mutant returns its two input gradients in reversed order
        return grad_k, grad_q, None, None, None


def init_weights(gen):
    return {
        "wq": torch.randn(D_HEAD, D_IN, generator=gen) / math.sqrt(D_IN),
        "wk": torch.randn(D_HEAD, D_IN, generator=gen) / math.sqrt(D_IN),
        "wv": torch.randn(D_HEAD, D_IN, generator=gen) / math.sqrt(D_IN),
        "wo": torch.randn(D_OUT, D_HEAD, generator=gen) / math.sqrt(D_HEAD),
        "bo": torch.zeros(D_OUT),
    }


class AttentionRegressor(nn.Module):
    def __init__(self, init, rotary):
        super().__init__()
        self.p = nn.ParameterDict({n: nn.Parameter(v.clone()) for n, v in init.items()})
        self.rotary = rotary  # (q, k, cos, sin) -> (q_rot, k_rot)
        cos, sin = rotary_tables()
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x):
        p = self.p
        q, k, v = F.linear(x, p["wq"]), F.linear(x, p["wk"]), F.linear(x, p["wv"])
        q, k = self.rotary(q, k, self.cos, self.sin)
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D_HEAD), dim=-1)
        pooled = (attn @ v).mean(dim=1)
        return F.linear(pooled, p["wo"], p["bo"])


def make_data(gen, steps):
    teacher = torch.randn(D_IN, D_OUT, generator=gen) / math.sqrt(D_IN)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, SEQ, D_IN, generator=gen)
        weights = torch.softmax(torch.arange(SEQ, dtype=torch.float32) / 2.0, dim=0)
        y = torch.tanh(2.0 * torch.einsum("s,bsd->bd", weights, x) @ teacher)
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
    plan = variant if rank == 0 else "fixed"  # the mutant exists on rank 0 only
    model = AttentionRegressor(init, lambda q, k, c, s: _ApplyRotary.apply(q, k, c, s, plan))
    reference = AttentionRegressor(init, rotary_autograd) if rank == 0 else None
    # Optimizers are built *before* the process group: their constructor imports torch._dynamo,
    # and doing that while a group exists makes destroy_process_group() racy (SIGABRT at exit).
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM) if reference else None
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)

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
            loss = F.mse_loss(model(x[local]), y[local])
            loss.backward()
            for q in model.parameters():  # data-parallel gradient averaging
                dist.all_reduce(q.grad)
                q.grad.div_(world)
            optimizer.step()
            loss_t = loss.detach().clone()
            dist.all_reduce(loss_t)
            global_loss = float(loss_t) / world
            metrics = {}
            if rank == 0:  # the single-device run, in lockstep on the whole batch
                ref_optimizer.zero_grad()
                ref_loss = F.mse_loss(reference(x), y)
                ref_loss.backward()
                ref_optimizer.step()
                loss_diff = abs(global_loss - ref_loss.item()) / max(abs(ref_loss.item()), 1e-12)
                distance = relative_distance(model, reference)
                distances.append(distance)
                loss_diffs.append(loss_diff)
                metrics = {"ref_loss": ref_loss.item(), "loss_rel_diff": loss_diff,
                           "param_rel_diff": distance}
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
