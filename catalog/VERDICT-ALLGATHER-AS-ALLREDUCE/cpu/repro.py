"""SilentBench reproducer for VERDICT-ALLGATHER-AS-ALLREDUCE: feature shards summed, not concatenated.

The bug
    VERDICT (SOSP 2025) crafted faults into nnScaler execution plans; in bug 4 a communication
    step that must *all-gather* the shards of a tensor-parallel activation (concatenate them
    along the partitioned dimension) was emitted as an *all-reduce* (element-wise sum). The
    result holds the sum of unrelated slices instead of the full tensor. VERDICT catches it as
    an unsatisfiable shape constraint; in a real run the shapes can be made to fit (here the
    summed shard is tiled to the planned width) and training continues on wrong activations.

This program (injected: the faulty logic is rebuilt in a small loop)
    Two processes (gloo, launched by this file with torch.multiprocessing.spawn) form one
    tensor-parallel group. The model is a column-parallel Linear (hidden features split over
    the ranks) -> gather of the hidden features -> replicated LayerNorm -> GELU -> replicated
    output Linear, trained with SGD + momentum on a regression task generated from the seed.
    In the ``fixed`` plan the gather is an all-gather (concatenate the shards; backward keeps
    the local slice of the gradient). In the ``buggy`` plan it is an all-reduce (sum of the
    shards; identity backward), and the [batch, hidden/2] sum is repeated to the planned
    [batch, hidden] shape, so every later op runs without error. Nothing else differs.

Oracle
    Parallel-vs-single-device equivalence. Rank 0 also holds an unsharded copy of the same
    model with the same initial weights and optimizer, and trains it in lockstep on the same
    batches. After every step the shards of all ranks are gathered on rank 0 and compared with
    the single-device parameters: *manifested* means that the relative L2 distance between the
    parallel and the single-device parameters exceeds 1e-3 at some step (the fixed plan stays
    below 1e-7, float32 rounding only).

Trigger step
    0: the wrong collective runs in the first forward pass.
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
BATCH = 32
LR = 0.05
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


class _AllGatherColumns(torch.autograd.Function):
    """Concatenates the column shards of all ranks; backward returns the local slice."""

    @staticmethod
    def forward(ctx, local):
        world = dist.get_world_size()
        ctx.rank, ctx.width = dist.get_rank(), local.shape[-1]
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        lo = ctx.rank * ctx.width
        return grad[..., lo:lo + ctx.width].contiguous()


class _AllReduceSum(torch.autograd.Function):
    """Sums the tensor over the ranks; identity backward (the consumers are replicated)."""

    @staticmethod
    def forward(ctx, local):
        out = local.contiguous().clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


def gather_hidden(local, variant):
    """The plan's communication step that rebuilds the full hidden activation."""
    if variant == "fixed":
        # FIX: all-gather, i.e. the shards are concatenated along the partitioned dimension
        return _AllGatherColumns.apply(local)
    # BUG: all-reduce, i.e. the shards are summed element-wise; the sum is tiled to the
    # planned [batch, hidden] shape, so no later op complains
    return _AllReduceSum.apply(local).repeat(1, dist.get_world_size())


def init_full_weights(gen):
    """Full (unsharded) initial weights, drawn identically on every rank."""
    return {
        "w1": torch.randn(D_HIDDEN, D_IN, generator=gen) / math.sqrt(D_IN),
        "b1": 0.1 * torch.randn(D_HIDDEN, generator=gen),
        "ln_w": 1.0 + 0.1 * torch.randn(D_HIDDEN, generator=gen),
        "ln_b": 0.1 * torch.randn(D_HIDDEN, generator=gen),
        "w2": torch.randn(D_OUT, D_HIDDEN, generator=gen) / math.sqrt(D_HIDDEN),
        "b2": torch.zeros(D_OUT),
    }


class ReferenceMLP(nn.Module):
    """The single-device model."""

    def __init__(self, full):
        super().__init__()
        for name, value in full.items():
            setattr(self, name, nn.Parameter(value.clone()))

    def forward(self, x):
        h = F.linear(x, self.w1, self.b1)
        h = F.layer_norm(h, (D_HIDDEN,), self.ln_w, self.ln_b)
        return F.linear(F.gelu(h), self.w2, self.b2)


class ParallelMLP(nn.Module):
    """The same model with the first Linear split by output features over the ranks."""

    SHARDED = ("w1", "b1")  # split along dim 0

    def __init__(self, full, rank, world):
        super().__init__()
        shard = D_HIDDEN // world
        lo, hi = rank * shard, (rank + 1) * shard
        for name, value in full.items():
            local = value[lo:hi] if name in self.SHARDED else value
            setattr(self, name, nn.Parameter(local.clone()))

    def forward(self, x, variant):
        local = F.linear(x, self.w1, self.b1)  # [batch, hidden / world]
        h = gather_hidden(local, variant)  # [batch, hidden]
        h = F.layer_norm(h, (D_HIDDEN,), self.ln_w, self.ln_b)
        return F.linear(F.gelu(h), self.w2, self.b2)


@torch.no_grad()
def gather_full_params(model, world):
    """Collective: the full parameters of the parallel model (rank 0 uses the result)."""
    full = {}
    for name, p in model.named_parameters():
        if name in ParallelMLP.SHARDED:
            parts = [torch.empty_like(p) for _ in range(world)]
            dist.all_gather(parts, p.detach().contiguous())
            full[name] = torch.cat(parts, dim=0)
        else:
            full[name] = p.detach().clone()
    return full


@torch.no_grad()
def relative_distance(params, reference):
    num = sum(float((params[n] - r.detach()).double().pow(2).sum()) for n, r in reference.named_parameters())
    den = sum(float(r.detach().double().pow(2).sum()) for r in reference.parameters())
    return math.sqrt(num / den)


def make_data(gen, steps):
    teacher = torch.randn(D_OUT, D_IN, generator=gen) / math.sqrt(D_IN)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, D_IN, generator=gen)
        y = torch.sin(2.0 * x @ teacher.T)
        batches.append((x, y))
    return batches


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    full = init_full_weights(gen)
    batches = make_data(gen, steps)
    model = ParallelMLP(full, rank, world)
    reference = ReferenceMLP(full) if rank == 0 else None
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

        distances, loss_diffs = [], []
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x, variant), y)
            loss.backward()
            optimizer.step()
            params = gather_full_params(model, world)
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
                metrics = {"ref_loss": ref_loss.item(), "loss_rel_diff": loss_diff,
                           "param_rel_diff": distance}
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(),
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
