"""SilentBench reproducer for PT-SYNCBN-UNEVEN: SyncBatchNorm dgrad wrong for unequal per-rank batches.

The bug
    SyncBatchNorm normalises with statistics over the whole global batch, so its backward
    needs two global reductions of the output gradient dy per channel: mean(dy) and
    mean(dy * (x - mean)). PyTorch PR 22248 let ranks hold different numbers of rows and
    made the *forward* weight each rank's statistics by its row count, but the *backward*
    still did the old thing: each rank reduced its local means, the means were summed over
    the process group and divided by the world size. That is the global mean only when all
    ranks hold the same number of rows; otherwise ranks with few rows count as much as ranks
    with many, and the input gradient (dgrad) of every layer below the BatchNorm is wrong.
    Nothing fails: detectron2's Mask R-CNN, whose mask head sees a different number of
    instances on every GPU, simply ended a few AP worse. PR 36382 (in 1.5.0) fixed it by
    reducing the per-rank *sums* and dividing by the global count.

This program (injected: the faulty logic is rebuilt in a small loop)
    Two processes (gloo, spawned by this file) train Linear(16->32) -> SyncBatchNorm(32) ->
    ReLU -> Linear(32->4) by data parallelism on a regression task; rank 0 holds 2 rows and
    rank 1 holds 6 rows of every 8-row global batch. ``SyncBatchNormFn`` is a small autograd
    Function: its forward all-reduces the per-channel sums and counts and then the centred
    sums of squares, so both ranks normalise with the exact global mean and (biased)
    variance. Its backward computes the local sum(dy) and sum(dy * (x - mean)) per channel;
    the ``fixed`` variant all-reduces those sums and divides by the global row count (each
    rank weighted by its count, as after PR 36382), the ``buggy`` variant divides each by the
    local row count, all-reduces the per-rank means and divides by the world size (as
    before the fix). Nothing else differs. Each rank's loss is its share of the global mean
    squared error and the parameter gradients are summed over the ranks, so a correct run
    equals single-process training on the 8 rows. SGD with momentum, one
    ``optimizer.step()`` per step on every rank.

Oracle (computed inside the run: the trained model is not the one single-process training gives)
    After training, rank 0 replays the same 8-row batches through one single-process
    BatchNorm model (``F.batch_norm`` on all rows, plain tensors and a hand-written
    momentum-SGD update, so no second module or optimizer is seen by detectors) and
    compares: *manifested* means the relative error of the final parameters
    ||p_parallel - p_single|| / ||p_single||, or of any step's loss, exceeds 1e-3. The fixed
    variant agrees to float32 rounding (~1e-7). The cause is reported as evidence: every
    step the ranks send rank 0 the gradient that reached the BatchNorm input, compared with
    the single-process one (the buggy one is off by tens of percent from step 0).

Trigger step
    0: the very first backward pass combines the per-rank means by world size.
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
ROWS_PER_RANK = (2, 6)  # unequal local batch sizes; 8 rows per global batch
D_IN = 16
D_HIDDEN = 32
D_OUT = 4
LR = 0.1
MOMENTUM = 0.9
BN_EPS = 1e-5
REL_ERR_THRESHOLD = 1e-3


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


class SyncBatchNormFn(torch.autograd.Function):
    """Batch norm over the rows of all ranks (training mode, no running statistics)."""

    @staticmethod
    def forward(ctx, x, weight, bias, variant):
        n_local = x.shape[0]
        stats = torch.cat([x.sum(0), torch.tensor([float(n_local)])])
        dist.all_reduce(stats)  # per-channel sums and the global row count
        n_total = stats[-1]
        mean = stats[:-1] / n_total
        xmu = x - mean
        sq = (xmu * xmu).sum(0)
        dist.all_reduce(sq)
        invstd = torch.rsqrt(sq / n_total + BN_EPS)
        ctx.save_for_backward(xmu, weight, invstd, n_total)
        ctx.variant = variant
        return xmu * invstd * weight + bias

    @staticmethod
    def backward(ctx, dy):
        xmu, weight, invstd, n_total = ctx.saved_tensors
        n_local = xmu.shape[0]
        sum_dy = dy.sum(0)
        sum_dy_xmu = (dy * xmu).sum(0)
        grad_weight = sum_dy_xmu * invstd  # local; summed over ranks by the gradient sync
        grad_bias = sum_dy.clone()
        if ctx.variant == "fixed":
            # FIX: reduce the per-rank sums and divide by the global count (ranks weighted by rows)
            red = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(red)
            red = red / n_total
        else:
            # BUG: reduce the per-rank means and divide by world size (every rank weighs the same)
            red = torch.cat([sum_dy, sum_dy_xmu]) / n_local
            dist.all_reduce(red)
            red = red / dist.get_world_size()
        mean_dy, mean_dy_xmu = red.chunk(2)
        grad_x = (dy - mean_dy - xmu * invstd * invstd * mean_dy_xmu) * invstd * weight
        return grad_x, grad_weight, grad_bias, None


class SyncBatchNorm(nn.Module):
    def __init__(self, channels, variant):
        super().__init__()
        self.variant = variant
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        return SyncBatchNormFn.apply(x, self.weight, self.bias, self.variant)


class SyncBNNet(nn.Module):
    def __init__(self, init, variant):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, D_HIDDEN)
        self.bn = SyncBatchNorm(D_HIDDEN, variant)
        self.fc2 = nn.Linear(D_HIDDEN, D_OUT)
        with torch.no_grad():
            for p, v in zip(self.parameters(), init):
                p.copy_(v)
        self.pre_bn = None

    def forward(self, x):
        h = self.fc1(x)
        h.retain_grad()  # the gradient reaching the BatchNorm input, for the oracle
        self.pre_bn = h
        return self.fc2(F.relu(self.bn(h)))


def initial_params(gen):
    """fc1.weight, fc1.bias, bn.weight, bn.bias, fc2.weight, fc2.bias (shared stream)."""
    return [torch.randn(D_HIDDEN, D_IN, generator=gen) / math.sqrt(D_IN),
            0.1 * torch.randn(D_HIDDEN, generator=gen),
            1.0 + 0.1 * torch.randn(D_HIDDEN, generator=gen),
            0.1 * torch.randn(D_HIDDEN, generator=gen),
            torch.randn(D_OUT, D_HIDDEN, generator=gen) / math.sqrt(D_HIDDEN),
            torch.zeros(D_OUT)]


def make_data(gen, steps):
    """Global 8-row batches; rows [0, 2) go to rank 0 and rows [2, 8) to rank 1."""
    teacher = torch.randn(D_OUT, D_IN, generator=gen) / math.sqrt(D_IN)
    batches = []
    n = sum(ROWS_PER_RANK)
    for _ in range(steps):
        x = torch.randn(n, D_IN, generator=gen) + 0.5
        y = torch.tanh(2.0 * x @ teacher.T) + 0.1 * torch.randn(n, D_OUT, generator=gen)
        batches.append((x, y))
    return batches


def local_rows(t, rank):
    lo = sum(ROWS_PER_RANK[:rank])
    return t[lo:lo + ROWS_PER_RANK[rank]]


def reference_run(init, batches):
    """Single-process BatchNorm on all 8 rows, same init, same SGD+momentum, plain tensors."""
    params = [p.clone().requires_grad_(True) for p in init]
    bufs = [None] * len(params)
    losses, dgrads = [], []
    for x, y in batches:
        w1, b1, g, b, w2, b2 = params
        h = F.linear(x, w1, b1)
        z = F.batch_norm(h, None, None, g, b, training=True, eps=BN_EPS)
        loss = F.mse_loss(F.linear(F.relu(z), w2, b2), y)
        grads = torch.autograd.grad(loss, params + [h])
        dgrads.append(grads[-1])
        losses.append(loss.item())
        with torch.no_grad():
            for i, (p, gr) in enumerate(zip(params, grads[:-1])):
                bufs[i] = gr.clone() if bufs[i] is None else bufs[i].mul_(MOMENTUM).add_(gr)
                p.add_(bufs[i], alpha=-LR)
    return [p.detach() for p in params], losses, dgrads


def rel_err(a, b):
    return float((a - b).norm() / (b.norm() + 1e-12))


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    init = initial_params(gen)
    batches = make_data(gen, steps)
    model = SyncBNNet(init, variant)
    params = list(model.parameters())
    # Built *before* the process group on purpose: the optimizer constructor imports
    # torch._dynamo, and doing that while a group exists makes destroy_process_group()
    # racy (gloo threads outlive it; ~1 in 10 clean runs die with SIGABRT at exit).
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        n_total = sum(ROWS_PER_RANK)
        pad_rows = max(ROWS_PER_RANK)
        dgrads = []  # rank 0: the BatchNorm-input gradient of all 8 rows, per step
        losses = []
        for step, (x, y) in enumerate(batches):
            x_local, y_local = local_rows(x, rank), local_rows(y, rank)
            optimizer.zero_grad()
            out = model(x_local)
            local_loss = (out - y_local).pow(2).sum() / (n_total * D_OUT)  # share of the global mean
            local_loss.backward()
            with torch.no_grad():  # data-parallel gradient sync (sum of the shares)
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                dist.all_reduce(flat)
                offset = 0
                for p in params:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            optimizer.step()
            loss = local_loss.detach().clone()
            dist.all_reduce(loss)  # global loss, for reporting only
            losses.append(loss.item())
            # send the BatchNorm-input gradient to rank 0 (padded: gloo gathers equal shapes)
            dg = torch.zeros(pad_rows, D_HIDDEN)
            dg[:x_local.shape[0]] = model.pre_bn.grad
            parts = [torch.empty_like(dg) for _ in range(world)]
            dist.all_gather(parts, dg)
            if rank == 0:
                dgrads.append(torch.cat([parts[r][:ROWS_PER_RANK[r]] for r in range(world)]))
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(),
                    "time": time.time(),
                    "metrics": {"local_loss": local_loss.item(),
                                "grad_norm": float(flat.norm()),
                                "local_rows": float(x_local.shape[0])}})

        # Oracle: single-process BatchNorm reference on all rows, replayed on rank 0.
        final = torch.cat([p.detach().reshape(-1) for p in params])
        if rank == 0:
            ref_params, ref_losses, ref_dgrads = reference_run(init, batches)
            ref_final = torch.cat([p.reshape(-1) for p in ref_params])
            dgrad_errs = [rel_err(a, b) for a, b in zip(dgrads, ref_dgrads)]
            param_err = rel_err(final, ref_final)
            worst_dgrad = max(dgrad_errs) if dgrad_errs else 0.0
            loss_errs = [abs(a - b) / (abs(b) + 1e-12) for a, b in zip(losses, ref_losses)]
            worst_loss = max(loss_errs) if loss_errs else 0.0
            manifested = param_err > REL_ERR_THRESHOLD or worst_loss > REL_ERR_THRESHOLD
            if manifested:
                summary = ("training with SyncBatchNorm differs from single-process BatchNorm on all rows: "
                           "final params rel. err %.3g, loss rel. err up to %.3g; the BatchNorm input "
                           "gradient is off by %.3g at step 0" % (param_err, worst_loss, dgrad_errs[0]))
            else:
                summary = ("SyncBatchNorm matches single-process BatchNorm (final params rel. err %.2g, "
                           "loss %.2g, dgrad <= %.2g)" % (param_err, worst_loss, worst_dgrad))
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"dgrad_rel_err_step0": dgrad_errs[0] if dgrad_errs else None,
                                 "dgrad_rel_err_max": worst_dgrad,
                                 "final_param_rel_err": param_err,
                                 "loss_rel_err_max": worst_loss,
                                 "threshold": REL_ERR_THRESHOLD,
                                 "rows_per_rank": list(ROWS_PER_RANK),
                                 "parallel_final_loss": losses[-1] if losses else None,
                                 "reference_final_loss": ref_losses[-1] if ref_losses else None}})
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
