"""SilentBench reproducer for VERDICT-MISSING-ALLREDUCE: a tensor-parallel plan drops an all-reduce.

The bug
    VERDICT (SOSP 2025) checks that a parallelised training plan computes the same thing as
    the single-device model. Its bug 1 is a plan in which the all-reduce that must sum the
    partial results of a tensor-parallel (row-parallel) operator is missing while the
    dataflow stays connected: every rank simply continues with its own partial sum (the
    artifact's counter-example is a reference value of -2 against -1 on each of two ranks).
    Nothing crashes and every shape is right; activations, loss and gradients silently
    differ from the single-device model.

This program (injected: the faulty plan is rebuilt in a small loop)
    Two processes (gloo, spawned by this file) form a tensor-parallel group of size 2 and
    train LayerNorm(32, replicated) -> column-parallel Linear(32->64, output features split)
    -> GELU -> row-parallel Linear(64->16, input features split) -> sum over ranks ->
    + replicated bias, with Megatron's conjugate pair (identity forward / all-reduce backward
    in front of the column-parallel layer, all-reduce forward / identity backward after the
    row-parallel one). The ``fixed`` variant applies that all-reduce to the row-parallel
    partial outputs; the ``buggy`` variant lets each rank go on with its partial output, as in
    the faulty plan. Nothing else differs. MSE regression against a teacher, SGD with
    momentum, one ``optimizer.step()`` per step on every rank; each rank reports the loss it
    computed.

Oracle (parallel vs single-device equivalence, computed inside the run)
    The full weights are drawn from the seed on every rank and each rank keeps its shard, so
    the sharded model starts equal to one single-device model. After training, rank 0
    replays the same batches through that single-device model (plain tensors and a
    hand-written momentum-SGD update, so no second module or optimizer is seen by
    detectors), gathers the shards into full weights and compares. *Manifested* means the
    relative error of the final parameters ||p_parallel - p_single|| / ||p_single|| or of any
    step's loss exceeds 1e-3. The fixed variant agrees to float32 rounding (~1e-7); the
    buggy one is off from the first step. Under ``SILENTBENCH_DIFFERENTIAL=1`` every rank also
    reports, every step, the per-feature RMS of its model output against that of the
    single-device forward pass with the full weights gathered from the shards at that step.

Trigger step
    0: the first forward pass already skips the all-reduce.
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
D_MODEL = 32
D_HIDDEN = 64
D_OUT = 16
BATCH = 32
LR = 0.05
MOMENTUM = 0.9
REL_ERR_THRESHOLD = 1e-3
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


def full_params(gen):
    """Single-device parameters: ln.weight, ln.bias, w1, b1, w2, b2 (shared stream)."""
    return [1.0 + 0.1 * torch.randn(D_MODEL, generator=gen),
            0.1 * torch.randn(D_MODEL, generator=gen),
            torch.randn(D_HIDDEN, D_MODEL, generator=gen) / math.sqrt(D_MODEL),
            0.1 * torch.randn(D_HIDDEN, generator=gen),
            torch.randn(D_OUT, D_HIDDEN, generator=gen) / math.sqrt(D_HIDDEN),
            torch.zeros(D_OUT)]


class TPMLP(nn.Module):
    """LayerNorm (replicated) -> column-parallel Linear -> GELU -> row-parallel Linear + bias."""

    def __init__(self, full, rank, world, variant):
        super().__init__()
        self.variant = variant
        shard = D_HIDDEN // world
        lo, hi = rank * shard, (rank + 1) * shard
        ln_w, ln_b, w1, b1, w2, b2 = full
        self.norm = nn.LayerNorm(D_MODEL)
        with torch.no_grad():
            self.norm.weight.copy_(ln_w)
            self.norm.bias.copy_(ln_b)
        self.w1 = nn.Parameter(w1[lo:hi].clone())  # column-parallel weight shard
        self.b1 = nn.Parameter(b1[lo:hi].clone())  # column-parallel bias shard
        self.w2 = nn.Parameter(w2[:, lo:hi].clone())  # row-parallel weight shard
        self.b2 = nn.Parameter(b2.clone())  # replicated output bias

    def forward(self, x):
        h = _CopyToTensorParallel.apply(self.norm(x))
        a = F.gelu(F.linear(h, self.w1, self.b1))
        partial = F.linear(a, self.w2)
        if self.variant == "fixed":
            out = _ReduceFromTensorParallel.apply(partial)  # FIX: sum the partial outputs over the TP group
        else:
            out = partial  # BUG: the plan has no all-reduce here; each rank keeps its partial sum
        return out + self.b2


def single_device_forward(p, x):
    ln_w, ln_b, w1, b1, w2, b2 = p
    h = F.layer_norm(x, (D_MODEL,), ln_w, ln_b)
    return F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2)


def reference_run(init, batches):
    """The single-device model on the same data: same init, same SGD+momentum, plain tensors."""
    params = [p.clone().requires_grad_(True) for p in init]
    bufs = [None] * len(params)
    losses = []
    for x, y in batches:
        loss = (single_device_forward(params, x) - y).pow(2).mean()
        grads = torch.autograd.grad(loss, params)
        losses.append(loss.item())
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads)):
                bufs[i] = g.clone() if bufs[i] is None else bufs[i].mul_(MOMENTUM).add_(g)
                p.add_(bufs[i], alpha=-LR)
    return [p.detach() for p in params], losses


def gather_full_params(model, world):
    """Reassemble single-device parameters from the shards (replicated ones from rank 0)."""
    def gather(t):
        t = t.detach().contiguous()
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        return parts
    w1 = torch.cat(gather(model.w1), dim=0)
    b1 = torch.cat(gather(model.b1), dim=0)
    w2 = torch.cat(gather(model.w2), dim=1)
    ln_w, ln_b, b2 = gather(model.norm.weight)[0], gather(model.norm.bias)[0], gather(model.b2)[0]
    return [ln_w, ln_b, w1, b1, w2, b2]


def make_data(gen, steps):
    teacher_in = torch.randn(D_MODEL, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
    teacher_out = torch.randn(D_OUT, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
    batches = []
    for _ in range(steps):
        x = 2.0 * torch.randn(BATCH, D_MODEL, generator=gen) + 0.5
        y = torch.tanh(x @ teacher_in.T) @ teacher_out.T
        batches.append((x, y))
    return batches


def rel_err(a, b):
    return float((a - b).norm() / (b.norm() + 1e-12))


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    init = full_params(gen)
    batches = make_data(gen, steps)
    model = TPMLP(init, rank, world, variant)
    # Built *before* the process group on purpose: the optimizer constructor imports
    # torch._dynamo, and doing that while a group exists makes destroy_process_group()
    # racy (gloo threads outlive it; ~1 in 10 clean runs die with SIGABRT at exit).
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        losses = []
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            out = model(x)
            loss = (out - y).pow(2).mean()
            loss.backward()
            if DIFFERENTIAL:  # the output two ways: the tensor-parallel plan vs one device with the gathered weights
                with torch.no_grad():
                    single = single_device_forward(gather_full_params(model, world), x)
                report({"event": "compare", "step": step, "rank": rank, "quantity": "output_feature_rms",
                        "value": out.detach().pow(2).mean(0).sqrt().tolist(),
                        "reference": single.pow(2).mean(0).sqrt().tolist(), "time": time.time()})
            optimizer.step()
            losses.append(loss.item())
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(),
                    "time": time.time(),
                    "metrics": {"output_rms": float(out.detach().pow(2).mean().sqrt())}})

        # Oracle: parallel vs single-device equivalence, checked on rank 0.
        full = gather_full_params(model, world)
        if rank == 0:
            ref_params, ref_losses = reference_run(init, batches)
            param_err = rel_err(torch.cat([p.reshape(-1) for p in full]),
                                torch.cat([p.reshape(-1) for p in ref_params]))
            loss_errs = [abs(a - b) / (abs(b) + 1e-12) for a, b in zip(losses, ref_losses)]
            worst_loss = max(loss_errs) if loss_errs else 0.0
            first_bad = next((i for i, e in enumerate(loss_errs) if e > REL_ERR_THRESHOLD), None)
            manifested = param_err > REL_ERR_THRESHOLD or worst_loss > REL_ERR_THRESHOLD
            if manifested:
                summary = ("tensor-parallel run differs from the single-device model: final params "
                           "rel. err %.3g, loss rel. err up to %.3g (first at step %s)"
                           % (param_err, worst_loss, first_bad))
            else:
                summary = ("tensor-parallel run matches the single-device model (params rel. err "
                           "%.2g, loss rel. err <= %.2g)" % (param_err, worst_loss))
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"final_param_rel_err": param_err, "loss_rel_err_max": worst_loss,
                                 "first_step_loss_mismatch": first_bad,
                                 "threshold": REL_ERR_THRESHOLD,
                                 "parallel_loss_step0": losses[0] if losses else None,
                                 "single_device_loss_step0": ref_losses[0] if ref_losses else None,
                                 "parallel_final_loss": losses[-1] if losses else None,
                                 "single_device_final_loss": ref_losses[-1] if ref_losses else None}})
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
