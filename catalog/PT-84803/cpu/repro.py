"""SilentBench reproducer for PT-84803: peer-to-peer transfers silently deliver zeros (IOMMU/ACS).

The bug
    PyTorch issue 84803 (and the older 13803, the later 132397): on some multi-GPU hosts
    direct GPU-to-GPU (P2P) DMA is reported as available, but the PCIe path (IOMMU
    translation, or ACS redirecting peer traffic through a root complex that does not
    forward it) drops the transfer. ``x.to("cuda:1")`` returns zeros or denormal garbage and
    P2P-based collectives hand the receiver a partly wrong payload, with no error from the
    driver, NCCL or PyTorch. In data-parallel training this means a rank applies a gradient
    that is not the all-reduced one: replicas that should stay bitwise identical drift
    apart, while every loss curve keeps going down. It is a platform fault, not a code bug;
    the fix is iommu=pt / disabling ACS or P2P (NCCL_P2P_DISABLE=1).

This program (injected: the faulty transfer is simulated on one rank)
    Two processes (gloo, spawned by this file) train a replicated MLP classifier
    (24 -> 64 -> 64 -> 6, ReLU) on synthetic Gaussian-blob data with plain data
    parallelism: each rank draws its own batch, runs backward, flattens its gradients into
    one buffer and all-reduces it (sum, then / world size), exactly what DDP does; SGD with
    momentum, one ``optimizer.step()`` per step. In the ``buggy`` variant the all-reduce
    payload that rank 1 receives is corrupted from step 2 on, the way a dropped DMA page
    looks: a contiguous run of 2% of the elements (at a position that changes every step)
    reads as zeros. The ``fixed`` variant receives the payload intact. Nothing else differs.
    As a payload check, every rank also all-gathers the inputs of each gradient all-reduce
    and compares the sum of the inputs with what it received. Under
    ``SILENTBENCH_DIFFERENTIAL=1`` every rank also reports, every step, checksums (absolute
    sums of 16 contiguous chunks) of the received all-reduce result against those of that sum.

Oracle (the symptom: replicas that must stay identical drift apart)
    At the end rank 0 gathers both replicas. *Manifested* means the largest absolute
    difference between the two ranks' parameters exceeds 1e-6. In the fixed variant both
    ranks apply the same bits, so the replicas are identical (difference 0). The cause is
    reported as evidence: how many all-reduce results differed from the sum of their inputs
    by more than 1e-6 (relative), from which step, and how many elements were zeroed.

Trigger step
    2: the first step whose gradient all-reduce delivers a corrupted payload (steps 0 and 1
    are clean in both variants, so a detector that fires there raises a false alarm).
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
TRIGGER_STEP = 2
WORLD_SIZE = 2
CORRUPTED_RANK = 1
CORRUPTED_FRACTION = 0.02  # contiguous share of the received payload that reads as zeros
D_IN = 24
D_HIDDEN = 64
N_CLASSES = 6
BATCH = 32
LR = 0.05
DIVERGENCE_THRESHOLD = 1e-6
PAYLOAD_RTOL = 1e-6
CHECKSUM_CHUNKS = 16
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


def build_model(gen):
    model = nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(),
                          nn.Linear(D_HIDDEN, D_HIDDEN), nn.ReLU(),
                          nn.Linear(D_HIDDEN, N_CLASSES))
    with torch.no_grad():  # identical initial replicas: drawn from the shared stream
        for p in model.parameters():
            fan_in = p.shape[1] if p.dim() == 2 else D_HIDDEN
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
    return model


def make_data(seed, rank, steps):
    centers = torch.randn(N_CLASSES, D_IN, generator=torch.Generator().manual_seed(seed)) * 0.4
    gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)  # each rank: its own shard
    batches = []
    for _ in range(steps):
        y = torch.randint(0, N_CLASSES, (BATCH,), generator=gen)
        x = centers[y] + torch.randn(BATCH, D_IN, generator=gen)
        batches.append((x, y))
    return batches


def corrupt_received_payload(buf, seed, step):
    """A dropped DMA page: a contiguous run of the received buffer reads as zeros."""
    n = max(1, int(buf.numel() * CORRUPTED_FRACTION))
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    start = int(torch.randint(0, buf.numel() - n + 1, (1,), generator=gen))
    buf[start:start + n] = 0.0
    return n


@torch.no_grad()
def allreduce_gradients(params, rank, world, variant, seed, step):
    """DDP-style gradient sync through one flat buffer; returns (payload error, zeroed elems)."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    sent = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(sent, flat)  # what every rank put into the all-reduce (payload check)
    dist.all_reduce(flat)
    corrupted_link = rank == CORRUPTED_RANK and step >= TRIGGER_STEP
    if variant == "buggy":
        # BUG: from the trigger step on, rank 1's P2P receive silently delivers a zeroed page
        zeroed = corrupt_received_payload(flat, seed, step) if corrupted_link else 0
    else:
        zeroed = 0  # FIX: the payload arrives intact (iommu=pt, ACS off or P2P disabled)
    expected = torch.stack(sent).sum(0)
    payload_err = float((flat - expected).abs().max() / (expected.abs().max() + 1e-12))
    if DIFFERENTIAL:  # the sum two ways: what the all-reduce delivered vs the gathered inputs added up here
        report({"event": "compare", "step": step, "rank": rank, "quantity": "allreduce_chunk_abs_sums",
                "value": [float(c.abs().sum()) for c in flat.chunk(CHECKSUM_CHUNKS)],
                "reference": [float(c.abs().sum()) for c in expected.chunk(CHECKSUM_CHUNKS)], "time": time.time()})
    flat /= world
    offset = 0
    for g in grads:
        k = g.numel()
        g.copy_(flat[offset:offset + k].view_as(g))
        offset += k
    return payload_err, zeroed


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = build_model(torch.Generator().manual_seed(seed))
    batches = make_data(seed, rank, steps)
    params = list(model.parameters())
    # Built *before* the process group on purpose: the optimizer constructor imports
    # torch._dynamo, and doing that while a group exists makes destroy_process_group()
    # racy (gloo threads outlive it; ~1 in 10 clean runs die with SIGABRT at exit).
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        bad_allreduces = 0
        first_bad_step = -1
        worst_payload_err = 0.0
        zeroed_total = 0
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            payload_err, zeroed = allreduce_gradients(params, rank, world, variant, seed, step)
            optimizer.step()
            zeroed_total += zeroed
            worst_payload_err = max(worst_payload_err, payload_err)
            if payload_err > PAYLOAD_RTOL:
                bad_allreduces += 1
                if first_bad_step < 0:
                    first_bad_step = step
            grad_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params))
            acc = float((logits.argmax(1) == y).float().mean())
            report({"event": "step", "step": step, "rank": rank, "loss": loss.item(),
                    "time": time.time(), "metrics": {"grad_norm": grad_norm, "accuracy": acc}})

        # Oracle: compare the replicas of all ranks, collect the payload checks, on rank 0.
        local = torch.cat([p.detach().reshape(-1) for p in params])
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        checks = torch.tensor([float(bad_allreduces), float(first_bad_step), worst_payload_err,
                               float(zeroed_total)], dtype=torch.float64)
        all_checks = [torch.empty_like(checks) for _ in range(world)]
        dist.all_gather(all_checks, checks)
        if rank == 0:
            param_diff = max(float((gathered[0] - g).abs().max()) for g in gathered[1:])
            bad_total = int(sum(float(c[0]) for c in all_checks))
            firsts = [int(c[1]) for c in all_checks if c[1] >= 0]
            first_bad = min(firsts) if firsts else None
            worst = max(float(c[2]) for c in all_checks)
            manifested = param_diff > DIVERGENCE_THRESHOLD
            if manifested:
                summary = ("data-parallel replicas diverged: max |rank0 - rank1| = %.3g; %d gradient "
                           "all-reduce results differ from the sum of their inputs (first at step %s)"
                           % (param_diff, bad_total, first_bad))
            else:
                summary = ("replicas identical (max diff %.3g); %d all-reduce results differ from the sum "
                           "of their inputs" % (param_diff, bad_total))
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"param_max_abs_diff": param_diff,
                                 "divergence_threshold": DIVERGENCE_THRESHOLD,
                                 "bad_allreduces": bad_total, "first_bad_allreduce_step": first_bad,
                                 "worst_payload_rel_err": worst, "payload_rtol": PAYLOAD_RTOL,
                                 "zeroed_elements_per_rank": [int(c[3]) for c in all_checks],
                                 "payload_elements": int(local.numel())}})
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
