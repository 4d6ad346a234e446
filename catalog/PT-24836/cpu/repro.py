"""SilentBench reproducer for PT-24836: Gloo scatter sends non-contiguous shards as if contiguous, so a tensor-parallel model is loaded with scrambled weights.

The bug
    ``dist.scatter`` on the Gloo backend passes each tensor of ``scatter_list`` to the
    transport by data pointer and element count, as if it were contiguous. A column block
    ``W[:, a:b]`` of a weight (``W.chunk(n, dim=1)``) is strided: the receiver gets the ``numel``
    elements that follow the block's first element in memory, i.e. whole rows of ``W``, not
    its column block. NCCL refuses such tensors; Gloo raises nothing (issue 24836, open since
    2019; issue 192920 of Aug 2026: scatter, broadcast and reduce still affected, gather and
    all_gather were fixed by PR 158903, which makes the tensors contiguous).

This program
    Two processes (gloo, spawned by this file) fine-tune a 2-way tensor-parallel MLP
    (32 -> 64 -> 10, ReLU): the first layer column-parallel (each rank holds 32 of its 64 output
    rows), the second row-parallel (each rank holds 32 of its 64 input columns, partial outputs
    summed by an all-reduce, Megatron's layout). Rank 0 holds the checkpoint and scatters each
    layer's shards; the row-parallel weight is split along dim 1, so its chunks are strided.
    Both ranks see the same batches of Gaussian inputs labelled by the checkpoint's own
    predictions; SGD (lr 0.1), cross-entropy, batch 64. The ``buggy`` variant scatters the
    chunks as ``torch.chunk`` returns them; the ``fixed`` variant makes them contiguous first
    (the fix PR 158903 applied inside Gloo for gather). Nothing else differs.

Oracle (checked inside the run, on rank 0)
    Rank 0 also trains the unsharded model, loaded from the same checkpoint, on the same
    batches in lockstep (the equivalence check of tensor-parallel tests). *Manifested* means the
    tensor-parallel loss differs from the unsharded one by more than 1e-3 (relative) at some
    step. How far each rank's received shard is from the checkpoint's slice is evidence.
    Under ``SILENTBENCH_DIFFERENTIAL=1`` rank 0 reports both losses every step as a
    ``compare`` record.

Trigger step
    0: the model is wrong from the first forward pass.
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

DEFAULT_STEPS = 15
TRIGGER_STEP = 0
WORLD_SIZE = 2
IN_FEATURES = 32
HIDDEN = 64
CLASSES = 10
BATCH = 64
LR = 0.1
REL_LOSS_THRESHOLD = 1e-3
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


class ReduceFromTensorParallel(torch.autograd.Function):
    """Sum the ranks' partial outputs in forward; the gradient passes through unchanged (Megatron's g)."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


def make_checkpoint(seed):
    """The pretrained model (fc1: 64x32, fc2: 10x64), as rank 0 reads it from disk."""
    gen = torch.Generator().manual_seed(seed * 7 + 1)
    model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / math.sqrt(p.shape[-1])))
    return model


def make_batches(teacher, seed, steps):
    """The fine-tuning set: Gaussian inputs labelled by the checkpoint itself, the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1000 + 17)
    batches = []
    with torch.no_grad():
        for _ in range(steps):
            x = torch.randn(BATCH, IN_FEATURES, generator=gen)
            batches.append((x, teacher(x).argmax(dim=1)))
    return batches


def unsharded_sgd_step(model, x, labels):
    """One SGD step of the unsharded reference, by hand: the run keeps one torch.optim optimizer per rank."""
    params = list(model.parameters())
    loss = F.cross_entropy(model(x), labels)
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(g, alpha=LR)
    return loss


def scatter_from_rank0(tensor, chunks, rank):
    with torch.no_grad():
        dist.scatter(tensor, chunks if rank == 0 else None, src=0)


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    checkpoint = make_checkpoint(seed)
    batches = make_batches(checkpoint, seed, steps)
    shard = HIDDEN // world
    fc1_w = nn.Parameter(torch.zeros(shard, IN_FEATURES))
    fc1_b = nn.Parameter(torch.zeros(shard))
    fc2_w = nn.Parameter(torch.zeros(CLASSES, shard))
    fc2_b = nn.Parameter(torch.zeros(CLASSES))
    # Built *before* the process group: the optimizer constructor imports torch._dynamo, and doing that
    # while a group exists makes destroy_process_group() racy.
    optimizer = torch.optim.SGD([fc1_w, fc1_b, fc2_w, fc2_b], lr=LR)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        full_fc1, full_fc2 = checkpoint[0], checkpoint[2]
        row_blocks = list(full_fc1.weight.detach().chunk(world, dim=0))  # contiguous
        column_blocks = list(full_fc2.weight.detach().chunk(world, dim=1))  # strided views
        scatter_from_rank0(fc1_w, row_blocks, rank)
        scatter_from_rank0(fc1_b, list(full_fc1.bias.detach().chunk(world)), rank)
        if variant == "buggy":
            fc2_blocks = column_blocks  # BUG: strided column blocks; Gloo sends whole rows of fc2 instead
        else:
            fc2_blocks = [w.contiguous() for w in column_blocks]  # FIX: contiguous copies, as PR 158903 does for gather
        scatter_from_rank0(fc2_w, fc2_blocks, rank)
        with torch.no_grad():
            if rank == 0:
                fc2_b.copy_(full_fc2.bias)
            dist.broadcast(fc2_b, src=0)  # replicated, contiguous: arrives intact
        # Evidence only: every rank can rebuild the checkpoint from the seed to check the shard it received.
        expected = full_fc2.weight.detach()[:, rank * shard:(rank + 1) * shard]
        shard_error = torch.tensor([float((fc2_w.detach() - expected).abs().max())])
        shard_errors = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(shard_errors, shard_error)

        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})
        max_rel_diff = 0.0
        first_bad_step = None
        for step, (x, labels) in enumerate(batches):
            optimizer.zero_grad(set_to_none=True)
            hidden = F.relu(F.linear(x, fc1_w, fc1_b))
            logits = ReduceFromTensorParallel.apply(F.linear(hidden, fc2_w)) + fc2_b
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            acc = (logits.argmax(dim=1) == labels).float().mean().item()
            metrics = {"acc": acc}
            if rank == 0:
                reference_loss = unsharded_sgd_step(checkpoint, x, labels)
                rel_diff = abs(loss.item() - reference_loss.item()) / max(abs(reference_loss.item()), 1e-12)
                max_rel_diff = max(max_rel_diff, rel_diff)
                if rel_diff > REL_LOSS_THRESHOLD and first_bad_step is None:
                    first_bad_step = step
                metrics["loss_rel_diff_vs_unsharded"] = rel_diff
                if DIFFERENTIAL:
                    report({"event": "compare", "step": step, "rank": 0, "quantity": "loss",
                            "value": loss.item(), "reference": reference_loss.item(), "time": time.time()})
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(), "time": time.time(),
                    "metrics": metrics})

        if rank == 0:
            manifested = first_bad_step is not None
            if manifested:
                summary = ("the tensor-parallel model's loss differed from the unsharded model's from step %d (max "
                           "rel. diff %.3g > %g): the scattered row-parallel shards are off by up to %.3g"
                           % (first_bad_step, max_rel_diff, REL_LOSS_THRESHOLD,
                              max(float(e) for e in shard_errors)))
            else:
                summary = "the tensor-parallel model matched the unsharded one at every step (max rel. diff %.2g)" % (
                    max_rel_diff)
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
                    "evidence": {"max_rel_loss_diff": max_rel_diff, "threshold": REL_LOSS_THRESHOLD,
                                 "first_bad_step": first_bad_step,
                                 "shard_max_abs_error_per_rank": [float(e) for e in shard_errors],
                                 "scattered_blocks_contiguous": all(b.is_contiguous() for b in fc2_blocks)}})
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
