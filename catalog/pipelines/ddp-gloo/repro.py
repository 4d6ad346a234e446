"""SilentBench clean reference pipeline: DistributedDataParallel on 2 gloo ranks.

What it trains
    Two processes, launched by this file with ``torch.multiprocessing.spawn`` and joined in a
    gloo process group on 127.0.0.1 (a free port), train one MLP regressor (16 -> 64 -> 64 -> 4,
    ReLU) wrapped in ``torch.nn.parallel.DistributedDataParallel`` with MSE loss and
    ``torch.optim.Adam(lr=3e-3)``. The data set (1024 samples: Gaussian inputs and the outputs
    of a random two-layer tanh teacher network plus a little noise) is generated from the seed
    identically on every rank; a ``DistributedSampler`` (shuffled, seeded, ``set_epoch`` called
    every epoch) gives each rank its own disjoint shard, read in batches of 32. DDP averages
    the gradients over the ranks during ``backward()``, so both replicas take the same step.

Teardown
    Each rank uses one intra-op thread, builds its optimizer before the process group (built
    after it, the optimizer's import of torch._dynamo can keep the group alive past
    ``destroy_process_group()`` and make a clean run abort at interpreter exit), and ends with
    ``dist.barrier()``, then, in a ``finally`` block, drops the DDP wrapper, runs the garbage
    collector and calls ``dist.destroy_process_group()``. The order matters: DDP's C++ Reducer
    holds a reference to the process group. If the Reducer is the last holder (DDP freed after
    ``destroy_process_group()``), the gloo group's destructor runs while the main thread holds
    the GIL and joins gloo's worker threads; a worker still finishing a collective on a
    Python-visible tensor needs the GIL to release it, and the rank hangs for ever (seen once
    in nine runs on a loaded machine). Freed first, the Reducer only drops a reference, and the
    group is destroyed inside ``destroy_process_group()``, which releases the GIL while joining.

Clean reference
    This program contains no fault. It exists so that invariant-learning detectors can fit on
    correct training code and so that false-positive rates can be measured on it. ``--variant``
    changes nothing: ``buggy`` runs the same clean program. Each step calls ``optimizer.zero_grad()``, runs forward and
    backward, and ends with exactly one ``optimizer.step()`` on every rank.

Oracle
    Rank 0 averages the per-step losses of the two ranks and gathers both replicas'
    parameters. *manifested* is true only if training visibly failed: a non-finite loss
    appeared on any rank, (with at least 4 steps) the mean loss of the last quarter of the
    steps is not below the mean of the first quarter, or the replicas' parameters differ by
    more than 1e-6. It is false on every seed. There is no fault, so the trigger step is null.
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
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

DEFAULT_STEPS = 40
TRIGGER_STEP = None  # clean pipeline: no fault is ever active
WORLD_SIZE = 2
N_SAMPLES = 1024
D_IN = 16
D_HIDDEN = 64
D_OUT = 4
BATCH = 32  # per rank
LR = 3e-3
REPLICA_TOLERANCE = 1e-6


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


def training_failed(losses):
    """(failed, evidence): a non-finite loss, or no decrease from the first to the last quarter."""
    nonfinite = [i for i, value in enumerate(losses) if not math.isfinite(value)]
    quarter = max(1, len(losses) // 4)
    first = sum(losses[:quarter]) / quarter if losses else float("nan")
    last = sum(losses[-quarter:]) / quarter if losses else float("nan")
    trend_judged = len(losses) >= 4  # fewer steps: only a non-finite loss counts as a failure
    no_decrease = trend_judged and not (last < first)
    evidence = {"first_quarter_mean_loss": first, "last_quarter_mean_loss": last,
                "quarter_len": quarter, "trend_judged": trend_judged, "nonfinite_steps": nonfinite[:20],
                "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
    return bool(nonfinite) or no_decrease, evidence


def verdict(manifested, evidence):
    if manifested:
        return "failed"
    return "progressed" if evidence["trend_judged"] else "too short to judge"


def make_dataset(gen):
    """Inputs and the outputs of a random tanh teacher; identical on every rank."""
    w1 = torch.randn(32, D_IN, generator=gen) / math.sqrt(D_IN)
    w2 = torch.randn(D_OUT, 32, generator=gen) / math.sqrt(32)
    x = torch.randn(N_SAMPLES, D_IN, generator=gen)
    y = torch.tanh(2.0 * x @ w1.T) @ w2.T + 0.05 * torch.randn(N_SAMPLES, D_OUT, generator=gen)
    return TensorDataset(x, y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, D_HIDDEN)
        self.fc2 = nn.Linear(D_HIDDEN, D_HIDDEN)
        self.fc3 = nn.Linear(D_HIDDEN, D_OUT)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


@torch.no_grad()
def grad_norm(params):
    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum()
    return float(total.sqrt())


def batches(loader, sampler, steps):
    """Yield `steps` batches, starting a new (re-shuffled) epoch whenever the shard is exhausted."""
    epoch = 0
    produced = 0
    while produced < steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            if produced >= steps:
                return
            produced += 1
            yield epoch, batch
        epoch += 1


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    gen = torch.Generator().manual_seed(seed)
    dataset = make_dataset(gen)
    model = MLP()
    # Built before the process group on purpose (see the module docstring): the optimizer
    # constructor imports torch._dynamo, which must not happen while a group exists.
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ddp_model = None
    try:
        ddp_model = DDP(model)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed,
                                     drop_last=True)
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        ddp_model.train()
        losses = []
        epoch = 0
        for step, (epoch, (x, y)) in enumerate(batches(loader, sampler, steps)):
            optimizer.zero_grad()
            loss = F.mse_loss(ddp_model(x), y)
            loss.backward()  # DDP all-reduces (averages) the gradients here
            norm = grad_norm(model.parameters())
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            losses.append(loss.item())
            report({"event": "step", "step": step, "rank": rank, "loss": losses[-1], "time": time.time(),
                    "metrics": {"grad_norm": norm, "lr": lr, "epoch": float(epoch)}})

        # Oracle: mean loss over the ranks, and the replicas compared on rank 0.
        loss_sum = torch.tensor(losses, dtype=torch.float64)
        dist.all_reduce(loss_sum)
        mean_losses = (loss_sum / world).tolist()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        if rank == 0:
            replica_diff = max(float((gathered[0] - g).abs().max()) for g in gathered[1:])
            failed, evidence = training_failed(mean_losses)
            diverged = not (replica_diff <= REPLICA_TOLERANCE)
            manifested = failed or diverged
            evidence.update({"replica_max_abs_diff": replica_diff, "replica_tolerance": REPLICA_TOLERANCE,
                             "epochs_started": epoch + 1 if steps else 0,
                             "shard_size": len(sampler), "loss_is_mean_over_ranks": True})
            summary = ("training %s: mean loss over ranks %.4f in the first quarter, %.4f in the last; "
                       "replicas differ by %.3g"
                       % (verdict(manifested, evidence), evidence["first_quarter_mean_loss"],
                          evidence["last_quarter_mean_loss"], replica_diff))
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary, "evidence": evidence})
        dist.barrier()  # nobody tears the group down while another rank still uses it
    finally:
        # Free DDP (and its Reducer, which references the process group) while the group is still
        # registered, so that the group itself is destroyed by destroy_process_group() with the
        # GIL released (see "Teardown" in the module docstring).
        ddp_model = None
        gc.collect()
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)  # the same either way
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    mp.spawn(worker, args=(WORLD_SIZE, free_port(), args.variant, args.seed, args.steps),
             nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main()
