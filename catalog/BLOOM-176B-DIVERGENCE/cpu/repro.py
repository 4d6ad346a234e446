"""SilentBench reproducer for BLOOM-176B-DIVERGENCE: sequence-parallel LayerNorm grads never all-reduced.

The bug
    Under tensor parallelism (TP) a LayerNorm is not split: every TP rank holds a full copy
    of its weight and bias, and all copies must receive the same update. With *sequence
    parallelism* (Megatron-LM ``--sequence-parallel``) the regions between the parallel
    linears are split along the sequence dimension instead of being computed redundantly,
    so each TP rank runs the LayerNorm on a different slice of the tokens. Its parameter
    gradients are then partial sums over that rank's tokens, and the framework has to sum
    them over the TP group before the optimizer step (Megatron's optimizer-side
    "all-reduce layernorm grads"; TransformerEngine leaves that all-reduce to the caller,
    TE issue 435). When that all-reduce is missing or not applied (Megatron-LM issue 1446:
    final_layernorm main_grad differs across TP ranks with TP+SP), each rank updates its
    LayerNorm copy with the gradient of its own sequence shard only. Loss curves look
    healthy; the replicas silently drift apart, which bites when the TP shards are merged
    into one checkpoint (the same family as the BLOOM-176B LayerNorm divergence).

This program (injected: the faulty logic is rebuilt in a small loop)
    Two processes (gloo, spawned by this file) form one TP group of size 2 with sequence
    parallelism. Input activations have shape [seq=16, batch=4, d=32]; each rank owns 8
    consecutive positions. The block is: LayerNorm (replicated, on the local sequence
    shard) -> all-gather along the sequence (backward: reduce-scatter) -> column-parallel
    Linear (hidden 64 split over the ranks) -> GELU -> row-parallel Linear (partial
    outputs) -> reduce-scatter along the sequence (backward: all-gather) -> + residual.
    The loss is the mean squared error against a teacher target over all tokens; each rank
    computes its share, so the global loss is the sum over ranks (reported on every rank).
    With these conjugate collectives the sharded weights get exactly their single-device
    gradients, and only the LayerNorm gradients remain per-shard partial sums. After
    ``backward()`` a finalize step all-reduces (sum) the LayerNorm gradients over the TP
    group; the ``buggy`` variant skips that all-reduce. Nothing else differs. AdamW, one
    ``optimizer.step()`` per step on every rank.

Oracle
    At the end rank 0 gathers both ranks' LayerNorm weight and bias: *manifested* means the
    largest absolute difference between the replicas exceeds 1e-6. In the fixed variant both
    replicas get bitwise identical gradients and updates, so the difference is exactly 0;
    in the buggy one it is of the order of lr * steps (1e-2 .. 1e-1).

Trigger step
    0: the LayerNorm gradients of the very first step are left partial.
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
SEQ = 16
BATCH = 4
D_MODEL = 32
D_HIDDEN = 64
LR = 3e-3
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


def _seq_chunk(t):
    """This rank's slice of a tensor split along dim 0 (the sequence dimension)."""
    n = t.shape[0] // dist.get_world_size()
    r = dist.get_rank()
    return t[r * n:(r + 1) * n]


class _GatherFromSequenceParallel(torch.autograd.Function):
    """Forward: all-gather the sequence shards. Backward: reduce-scatter the gradient."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # reduce-scatter = all-reduce + keep own chunk (gloo has none)
        return _seq_chunk(grad).contiguous()


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Forward: sum the partial outputs and keep this rank's sequence shard. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return _seq_chunk(x).contiguous()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad)
        return torch.cat(parts, dim=0)


class SequenceParallelBlock(nn.Module):
    """LayerNorm on the sequence shard -> column-parallel -> GELU -> row-parallel, + residual."""

    def __init__(self, rank, world, gen):
        super().__init__()
        shard = D_HIDDEN // world
        lo, hi = rank * shard, (rank + 1) * shard
        # Full weights are drawn identically on every rank; each rank keeps its shard.
        full_w1 = torch.randn(D_HIDDEN, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
        full_b1 = 0.1 * torch.randn(D_HIDDEN, generator=gen)
        full_w2 = torch.randn(D_MODEL, D_HIDDEN, generator=gen) / math.sqrt(D_HIDDEN)
        ln_w = 1.0 + 0.1 * torch.randn(D_MODEL, generator=gen)
        ln_b = 0.1 * torch.randn(D_MODEL, generator=gen)

        self.norm = nn.LayerNorm(D_MODEL)
        with torch.no_grad():
            self.norm.weight.copy_(ln_w)
            self.norm.bias.copy_(ln_b)
        for p in self.norm.parameters():
            p.sequence_parallel = True  # replicated, but fed with a sequence shard
        self.w1 = nn.Parameter(full_w1[lo:hi].clone())  # column-parallel weight shard
        self.b1 = nn.Parameter(full_b1[lo:hi].clone())  # column-parallel bias shard
        self.w2 = nn.Parameter(full_w2[:, lo:hi].clone())  # row-parallel weight shard

    def forward(self, x_local):
        h = _GatherFromSequenceParallel.apply(self.norm(x_local))
        a = F.gelu(F.linear(h, self.w1, self.b1))
        partial = F.linear(a, self.w2)
        return x_local + _ReduceScatterToSequenceParallel.apply(partial)


@torch.no_grad()
def finalize_sequence_parallel_grads(model, variant):
    """Sum the gradients of sequence-parallel replicated params over the TP group."""
    grads = [p.grad for p in model.parameters()
             if getattr(p, "sequence_parallel", False) and p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    if variant == "fixed":
        dist.all_reduce(flat)  # FIX: each rank's partial LayerNorm grad is summed over the TP group
    else:
        pass  # BUG: the all-reduce of the LayerNorm grads is dropped; each rank keeps its partial grad
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def make_data(gen, steps):
    teacher_in = torch.randn(D_MODEL, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
    teacher_out = torch.randn(D_MODEL, D_MODEL, generator=gen) / math.sqrt(D_MODEL)
    # A position-dependent offset makes the two sequence halves statistically different,
    # as the beginning and the end of real sequences are.
    pos = torch.linspace(-1.0, 1.0, SEQ).view(SEQ, 1, 1)
    batches = []
    for _ in range(steps):
        x = torch.randn(SEQ, BATCH, D_MODEL, generator=gen) + 1.5 * pos
        y = x + torch.tanh(x @ teacher_in.T) @ teacher_out.T
        batches.append((x, y))
    return batches


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    model = SequenceParallelBlock(rank, world, gen)
    batches = make_data(gen, steps)
    # Built *before* the process group on purpose: the optimizer constructor imports
    # torch._dynamo, and doing that while a group exists makes destroy_process_group()
    # racy (gloo threads outlive it; ~1 in 10 clean runs die with SIGABRT at exit).
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        n_total = SEQ * BATCH * D_MODEL
        for step, (x, y) in enumerate(batches):
            x_local, y_local = _seq_chunk(x), _seq_chunk(y)
            optimizer.zero_grad()
            out = model(x_local)
            local_loss = (out - y_local).pow(2).sum() / n_total  # this rank's share of the mean
            local_loss.backward()
            finalize_sequence_parallel_grads(model, variant)
            optimizer.step()
            loss = local_loss.detach().clone()
            dist.all_reduce(loss)  # global loss, for reporting only
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(),
                    "time": time.time(),
                    "metrics": {"local_loss": local_loss.item(),
                                "ln_weight_grad_norm": float(model.norm.weight.grad.norm())}})

        # Oracle: compare the LayerNorm replicas of all ranks on rank 0.
        local = torch.cat([model.norm.weight.detach(), model.norm.bias.detach()]).contiguous()
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        if rank == 0:
            w_diff = max(float((gathered[0][:D_MODEL] - g[:D_MODEL]).abs().max()) for g in gathered[1:])
            b_diff = max(float((gathered[0][D_MODEL:] - g[D_MODEL:]).abs().max()) for g in gathered[1:])
            ln_diff = max(w_diff, b_diff)
            manifested = ln_diff > DIVERGENCE_THRESHOLD
            if manifested:
                summary = ("sequence-parallel LayerNorm replicas diverged across TP ranks: "
                           "max |rank0 - rank1| = %.3g after %d steps" % (ln_diff, steps))
            else:
                summary = "LayerNorm replicas identical across TP ranks (max diff %.3g)" % ln_diff
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"ln_weight_max_abs_diff": w_diff, "ln_bias_max_abs_diff": b_diff,
                                 "threshold": DIVERGENCE_THRESHOLD,
                                 "sequence_shard_tokens_per_rank": SEQ // world * BATCH}})
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
