"""SilentBench reproducer for VERDICT-PIPELINE-WRONG-RANK: activations moved to the wrong stage rank.

The bug
    VERDICT (SOSP 2025) crafted faults into nnScaler execution plans (2-way data, tensor and
    pipeline parallelism); in bug 6 a tensor move between two pipeline stages was given the
    wrong source/destination ranks. The consuming stage then does not receive the activation of
    its own predecessor. When the shapes happen to match, as they do between data-parallel
    replicas, nothing fails: the stage simply computes on another replica's activations.

This program (injected: the faulty logic is rebuilt in a small loop)
    Four processes (gloo, launched by this file with torch.multiprocessing.spawn) form a
    2 (pipeline stages) x 2 (data-parallel replicas) grid: ranks 0 and 1 hold stage 0
    (Linear -> GELU -> Linear -> GELU) for replicas 0 and 1, ranks 2 and 3 hold stage 1
    (Linear -> GELU -> Linear -> MSE loss) for replicas 0 and 1. Every step each replica
    runs 2 microbatches of its share of the global batch through a GPipe schedule (all
    forwards, then all backwards) with blocking send/recv between the stages; the labels are
    read by the last stage of the same replica. Gradients are then averaged inside each
    stage's data-parallel group and every rank does one SGD + momentum step. The stage-0 ->
    stage-1 moves (and the matching gradient moves back) follow a rank table: the ``fixed``
    plan links every stage-0 rank to the stage-1 rank of the same replica, the ``buggy``
    plan assigns the destinations in reverse replica order. Nothing else differs.

Oracle
    Parallel-vs-single-device equivalence. Rank 0 also holds the unsplit model (both stages)
    with the same initial weights and optimizer, and trains it in lockstep on the whole
    global batch. After every step rank 0 gathers the stage parameters of replica 0 and
    compares them with the single-device parameters: *manifested* means that their relative
    L2 distance exceeds 1e-3 at some step (the fixed plan stays below 1e-7, float32 rounding
    only).

Trigger step
    0: the wrong move happens in the first forward pass.
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
PP = 2  # pipeline stages
DP = 2  # data-parallel replicas
WORLD_SIZE = PP * DP  # rank = stage * DP + replica
N_MICRO = 2
MICRO_BATCH = 8
GLOBAL_BATCH = DP * N_MICRO * MICRO_BATCH
D_IN = 16
D_HIDDEN = 32
D_OUT = 8
LR = 0.05
MOMENTUM = 0.9
TOLERANCE = 1e-3  # relative parameter distance parallel vs single-device
STAGE_PARAMS = (("w0", "b0", "w1", "b1"), ("w2", "b2", "w3", "b3"))


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


def stage_move_table(variant):
    """The plan's stage-0 -> stage-1 activation moves, as {source rank: destination rank}."""
    if variant == "fixed":
        # FIX: each stage-0 rank sends to the stage-1 rank of the same data-parallel replica
        return {dp: DP + dp for dp in range(DP)}
    # BUG: the destination ranks are assigned in reverse replica order, so the stage-1 rank
    # of replica d receives (and later returns gradients to) the stage-0 rank of replica DP-1-d
    return {dp: DP + (DP - 1 - dp) for dp in range(DP)}


def init_full_weights(gen):
    """Full initial weights of both stages, drawn identically on every rank."""
    dims = [(D_HIDDEN, D_IN), (D_HIDDEN, D_HIDDEN), (D_HIDDEN, D_HIDDEN), (D_OUT, D_HIDDEN)]
    full = {}
    for i, (n_out, n_in) in enumerate(dims):
        full["w%d" % i] = torch.randn(n_out, n_in, generator=gen) / math.sqrt(n_in)
        full["b%d" % i] = 0.1 * torch.randn(n_out, generator=gen)
    return full


def stage_forward(p, stage, h):
    if stage == 0:
        h = F.gelu(F.linear(h, p["w0"], p["b0"]))
        return F.gelu(F.linear(h, p["w1"], p["b1"]))
    h = F.gelu(F.linear(h, p["w2"], p["b2"]))
    return F.linear(h, p["w3"], p["b3"])


class Stage(nn.Module):
    def __init__(self, full, names):
        super().__init__()
        self.p = nn.ParameterDict({n: nn.Parameter(full[n].clone()) for n in names})


def make_data(gen, steps):
    teacher = torch.randn(D_OUT, D_IN, generator=gen) / math.sqrt(D_IN)
    batches = []
    for _ in range(steps):
        x = torch.randn(GLOBAL_BATCH, D_IN, generator=gen)
        y = torch.sin(2.0 * x @ teacher.T)
        batches.append((x, y))
    return batches


def micro_slice(replica, micro):
    lo = (replica * N_MICRO + micro) * MICRO_BATCH
    return slice(lo, lo + MICRO_BATCH)


def pipeline_step(rank, stage, replica, module, x, y, moves, dp_group):
    """One GPipe step of this rank; returns the sum of its microbatch losses (0 on stage 0)."""
    p = module.p
    inputs, outputs, losses = [], [], []
    if stage == 0:
        dst = moves[rank]
        for m in range(N_MICRO):
            h = stage_forward(p, 0, x[micro_slice(replica, m)])
            dist.send(h.detach().contiguous(), dst=dst)
            outputs.append(h)
        for m in range(N_MICRO):
            grad = torch.empty(MICRO_BATCH, D_HIDDEN)
            dist.recv(grad, src=dst)
            outputs[m].backward(grad)
    else:
        src = {d: s for s, d in moves.items()}[rank]
        for m in range(N_MICRO):
            h = torch.empty(MICRO_BATCH, D_HIDDEN)
            dist.recv(h, src=src)
            h.requires_grad_(True)
            out = stage_forward(p, 1, h)
            losses.append(F.mse_loss(out, y[micro_slice(replica, m)]) / N_MICRO)
            inputs.append(h)
        for m in range(N_MICRO):
            losses[m].backward()
            dist.send(inputs[m].grad.contiguous(), dst=src)
    for q in p.values():  # average gradients over the stage's data-parallel replicas
        dist.all_reduce(q.grad, group=dp_group)
        q.grad.div_(DP)
    return float(sum(l.item() for l in losses))


def worker(rank, world, port, variant, seed, steps):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    stage, replica = divmod(rank, DP)
    gen = torch.Generator().manual_seed(seed)  # same stream on every rank
    full = init_full_weights(gen)
    batches = make_data(gen, steps)
    module = Stage(full, STAGE_PARAMS[stage])
    reference = Stage(full, STAGE_PARAMS[0] + STAGE_PARAMS[1]) if rank == 0 else None
    # Optimizers are built *before* the process group: their constructor imports torch._dynamo,
    # and doing that while a group exists makes destroy_process_group() racy (SIGABRT at exit).
    optimizer = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM) if reference else None
    moves = stage_move_table(variant)
    n_full = sum(v.numel() for v in full.values())
    offsets, o = {}, 0
    for name, v in full.items():
        offsets[name] = (o, v.numel())
        o += v.numel()

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        dp_groups = [dist.new_group([s * DP + d for d in range(DP)]) for s in range(PP)]
        if rank == 0:
            report({"event": "start", "time": time.time(), "variant": variant, "seed": seed,
                    "steps": steps, "world_size": world})

        distances, loss_diffs, drifts = [], [], []
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            local_loss = pipeline_step(rank, stage, replica, module, x, y, moves, dp_groups[stage])
            optimizer.step()
            # global loss (mean over the global batch) and every rank's params, for logging/oracle
            loss_t = torch.tensor([local_loss / DP])
            dist.all_reduce(loss_t)
            flat = torch.zeros(n_full)
            with torch.no_grad():
                for name, q in module.p.items():
                    lo, n = offsets[name]
                    flat[lo:lo + n] = q.detach().reshape(-1)
            gathered = [torch.empty(n_full) for _ in range(world)]
            dist.all_gather(gathered, flat)
            loss = float(loss_t)
            metrics = {}
            if rank == 0:  # the single-device run, in lockstep on the whole global batch
                ref_optimizer.zero_grad()
                out = stage_forward(reference.p, 1, stage_forward(reference.p, 0, x))
                ref_loss = F.mse_loss(out, y)
                ref_loss.backward()
                ref_optimizer.step()
                with torch.no_grad():
                    ref_flat = torch.cat([reference.p[n].detach().reshape(-1) for n in full])
                    # replica 0 of the parallel model: stage 0 from rank 0, stage 1 from rank DP
                    par_flat = gathered[0] + gathered[DP]
                    distance = float((par_flat - ref_flat).double().norm() / ref_flat.double().norm())
                    drift = max(float((gathered[s * DP] - gathered[s * DP + d]).abs().max())
                                for s in range(PP) for d in range(1, DP))
                loss_diff = abs(loss - ref_loss.item()) / max(abs(ref_loss.item()), 1e-12)
                distances.append(distance)
                loss_diffs.append(loss_diff)
                drifts.append(drift)
                metrics = {"ref_loss": ref_loss.item(), "loss_rel_diff": loss_diff,
                           "param_rel_diff": distance, "replica_max_abs_diff": drift}
            report({"event": "step", "step": step, "rank": rank, "loss": loss,
                    "time": time.time(), "metrics": metrics})

        if rank == 0:
            worst = max(distances, default=0.0)
            manifested = worst > TOLERANCE
            first_bad = next((i for i, d in enumerate(distances) if d > TOLERANCE), None)
            if manifested:
                summary = ("pipeline run departs from the single-device run: relative parameter "
                           "distance %.3g (tolerance %.0e), first over it at step %s"
                           % (worst, TOLERANCE, first_bad))
            else:
                summary = ("pipeline run matches the single-device run: max relative parameter "
                           "distance %.3g" % worst)
            report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
                    "summary": summary,
                    "evidence": {"max_param_rel_diff": worst, "final_param_rel_diff": distances[-1] if distances else None,
                                 "max_loss_rel_diff": max(loss_diffs, default=0.0),
                                 "replica_max_abs_diff": max(drifts, default=0.0),
                                 "first_step_over_tolerance": first_bad, "tolerance": TOLERANCE,
                                 "stage_moves": {str(s): d for s, d in moves.items()}}})
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
