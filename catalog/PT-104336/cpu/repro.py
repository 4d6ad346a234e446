"""SilentBench reproducer for PT-104336: after a DDP-wrapped model is moved and moved back, DDP no longer synchronises gradients.

The bug
    DistributedDataParallel all-reduces gradients from hooks it registers, when it is built,
    on each parameter's gradient accumulator. ``ddp_model.cpu(); ddp_model.cuda()`` (issue
    104336, Lightning 17937) replaces every parameter's data with ``set_data``, which drops
    the accumulator when the device or dtype changes; the next backward makes new
    accumulators without DDP's hooks. Every rank then steps on its own gradients, with no
    error or warning, and the replicas drift apart. Casting the model to another dtype and
    back takes the same path.

This program
    Two processes (gloo, spawned by this file) train an MLP classifier (24 -> 64 -> 64 -> 6,
    ReLU) wrapped in DDP, each rank on its own Gaussian-blob batches; SGD (lr 0.05, momentum
    0.9), cross-entropy, batch 32. Before step 5 the wrapped model makes a round trip, as
    when a model is moved off its GPU to free memory for another task; a CPU-only run cannot
    change device, so it is cast to float64 and back to float32 (exact, and the same
    ``set_data`` path). The ``buggy`` variant carries on with the same DDP wrapper; the
    ``fixed`` variant wraps the model in a new DDP after the round trip (the workaround of
    TrainCheck's reproduction). Nothing else differs.

Oracle (the symptom: replicas that must stay identical drift apart)
    At the end rank 0 gathers both replicas; *manifested* means their parameters differ by
    more than 1e-6. The cause is evidence: every step the ranks compare their gradients after
    backward, and the steps at which they differed are counted.

Trigger step
    5: the first step after the round trip; steps 0-4 are synchronised in both variants.
"""
import argparse
import gc
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
from torch.nn.parallel import DistributedDataParallel as DDP

DEFAULT_STEPS = 20
MOVE_STEP = 5
TRIGGER_STEP = MOVE_STEP
WORLD_SIZE = 2
D_IN = 24
D_HIDDEN = 64
N_CLASSES = 6
BATCH = 32
LR = 0.05
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


def make_batches(seed, rank, steps):
    centers = torch.randn(N_CLASSES, D_IN, generator=torch.Generator().manual_seed(seed)) * 0.4
    gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)  # each rank: its own shard
    batches = []
    for _ in range(steps):
        y = torch.randint(0, N_CLASSES, (BATCH,), generator=gen)
        batches.append((centers[y] + torch.randn(BATCH, D_IN, generator=gen), y))
    return batches


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def gap_between_ranks(local):
    """The largest difference between rank 0's ``local`` and another rank's (computed on every rank)."""
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return max(float((gathered[0] - g).abs().max()) for g in gathered[1:])


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)  # the same initial model on every rank (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, D_HIDDEN), nn.ReLU(),
                          nn.Linear(D_HIDDEN, N_CLASSES))
    batches = make_batches(seed, rank, steps)
    # Built *before* the process group: the optimizer constructor imports torch._dynamo, and doing that
    # while a group exists makes destroy_process_group() racy.
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ddp_model = DDP(model)
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})
        unsynced_steps = 0
        first_unsynced_step = None
        for step, (x, y) in enumerate(batches):
            if step == MOVE_STEP:
                ddp_model.to(torch.float64)  # off and back, as ddp_model.cpu(); ddp_model.cuda() upstream
                ddp_model.to(torch.float32)
                if variant == "buggy":
                    pass  # BUG: the wrapper's hooks sit on the discarded accumulators; no more all-reduce
                else:
                    ddp_model = DDP(model)  # FIX: a new wrapper hooks the parameters' new gradient accumulators
            optimizer.zero_grad(set_to_none=True)
            logits = ddp_model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            grad_gap = gap_between_ranks(flat(p.grad for p in model.parameters()))
            optimizer.step()
            if grad_gap > 0.0:
                unsynced_steps += 1
                if first_unsynced_step is None:
                    first_unsynced_step = step
            acc = float((logits.argmax(1) == y).float().mean())
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(), "time": time.time(),
                    "metrics": {"acc": acc, "grad_gap_between_ranks": grad_gap}})

        param_gap = gap_between_ranks(flat(model.parameters()))
        if rank == 0:
            manifested = param_gap > DIVERGENCE_THRESHOLD
            if manifested:
                summary = ("data-parallel replicas diverged: max |rank0 - rank1| = %.3g; gradients were not "
                           "synchronised at %d steps, from step %s" % (param_gap, unsynced_steps, first_unsynced_step))
            else:
                summary = "replicas identical (max diff %.3g); gradients synchronised at every step" % param_gap
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
                    "evidence": {"param_max_abs_diff": param_gap, "divergence_threshold": DIVERGENCE_THRESHOLD,
                                 "unsynchronised_steps": unsynced_steps,
                                 "first_unsynchronised_step": first_unsynced_step,
                                 "move_step": MOVE_STEP}})
        dist.barrier()  # nobody tears the group down while another rank still uses it
    finally:
        # Free DDP (its Reducer holds the process group) before the group is destroyed, so that the group's
        # destructor runs inside destroy_process_group(), with the GIL released (as the ddp-gloo pipeline does).
        ddp_model = None
        gc.collect()
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
