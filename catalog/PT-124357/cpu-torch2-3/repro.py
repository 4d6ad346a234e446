"""SilentBench reproducer for PT-124357 on torch 2.2-2.4: torch.compile reuses a graph specialised on a stale module attribute.

The bug
    Dynamo treats a plain Python attribute of an ``nn.Module`` that ``forward`` reads (an
    int in the issue) as a constant and specialises the traced graph on its value, but with
    its default ``guard_nn_modules=False`` it installs no guard on that attribute: the cached
    graph keeps being reused after the attribute changes, and the compiled module silently
    computes with the first value while eager mode follows the new one (issue 124357, same
    family as 111785 and 98928; the workaround of the time was
    ``torch._dynamo.config.guard_nn_modules=True``).

This program
    Runs the real code path on a release that has it, with no help: torch 2.2.x, 2.3.x or
    2.4.x. (The issue's own example, an int attribute added to a tensor, is guarded from
    2.4.0 on; this program's pattern, an int attribute that sets how many blocks a loop
    runs, stays unguarded through 2.4.1 and is guarded from 2.5.0, where Dynamo started
    tracing modules' attributes like any object's.) A residual MLP regressor whose
    ``forward`` runs the first ``active_blocks`` of three residual blocks (a Python int
    attribute, read by an index loop: with the slice ``self.blocks[:n]`` of the ``cpu``
    reproducer, ``guard_nn_modules=True`` fails to build its guards on 2.3) is compiled with ``torch.compile(backend="eager")`` (the fault is in Dynamo's
    guards, so no code needs to be generated) and warmed up on one batch with
    ``active_blocks = 1``. Training then follows a progressive-depth curriculum: 1 block for
    steps 0-3, 2 blocks for steps 4-7, 3 blocks from step 8, with AdamW(lr=3e-3) on a
    synthetic regression task; each step ends with exactly one ``optimizer.step()``. The
    ``buggy`` variant keeps Dynamo's default; the ``fixed`` variant sets
    ``guard_nn_modules=True`` before compiling, so the changed attribute fails a guard and
    Dynamo recompiles. Nothing else differs.

Oracle (checked inside the single run)
    Every step also runs the uncompiled module eagerly on the same batch (no grad) and
    compares: ``rel_diff = max|compiled - eager| / max|eager|``. *Manifested* means
    ``rel_diff`` exceeded 1e-3 at some step. With the eager backend the fixed variant
    matches exactly (0.0); in the buggy variant the compiled model keeps running one block,
    the added blocks never receive gradients, and ``rel_diff`` is of order 0.1-1.
    Under ``SILENTBENCH_DIFFERENTIAL=1`` every step also reports the compiled output (all 64
    samples) against that eager output as a ``compare`` record.

Trigger step
    4: the first step at which ``active_blocks`` differs from its value at compile time.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_STEPS = 12
GROW_AT = (4, 8)  # steps at which one more residual block becomes active
TRIGGER_STEP = GROW_AT[0]
BATCH = 64
IN_FEATURES = 16
WIDTH = 32
BLOCKS = 3
LR = 3e-3
REL_DIFF_THRESHOLD = 1e-3
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


class GrowingResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(IN_FEATURES, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH)) for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 1)
        self.active_blocks = 1  # plain Python int read in forward; changed by the curriculum

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        for i in range(self.active_blocks):
            h = h + self.blocks[i](h)
        return self.head(h)


def make_batch(teacher, gen):
    x = torch.randn(BATCH, IN_FEATURES, generator=gen)
    with torch.no_grad():
        y = teacher(x)
    return x, y


def blocks_for_step(step):
    return 1 + sum(step >= s for s in GROW_AT)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared CPU

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    teacher = nn.Sequential(nn.Linear(IN_FEATURES, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    model = GrowingResMLP()
    # BUG (torch 2.2-2.4): Dynamo's default, guard_nn_modules=False, installs no guard on this plain attribute of
    # the module, so the graph traced with active_blocks=1 stays valid when the attribute changes.
    # FIX: the workaround of the time, guard_nn_modules=True, guards the module's attributes and recompiles.
    torch._dynamo.config.guard_nn_modules = args.variant == "fixed"
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

    # Warm-up: compile once (forward and backward) with the initial attribute value.
    warm_x, warm_y = make_batch(teacher, gen)
    F.mse_loss(compiled(warm_x), warm_y).backward()
    optimizer.zero_grad(set_to_none=True)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_diff = 0.0
    first_bad_step = None
    block_params = {i: [p.detach().clone() for p in model.blocks[i].parameters()] for i in range(BLOCKS)}
    for step in range(args.steps):
        model.active_blocks = blocks_for_step(step)
        x, y = make_batch(teacher, gen)
        optimizer.zero_grad(set_to_none=True)
        out = compiled(x)
        loss = F.mse_loss(out, y)
        loss.backward()
        with torch.no_grad():
            eager_out = model(x)
        rel_diff = float((out.detach() - eager_out).abs().max() / eager_out.abs().max().clamp_min(1e-12))
        optimizer.step()

        max_rel_diff = max(max_rel_diff, rel_diff)
        if rel_diff > REL_DIFF_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"compiled_vs_eager_rel_diff": rel_diff,
                            "eager_loss": float(F.mse_loss(eager_out, y)),
                            "active_blocks": float(model.active_blocks)}})
        if DIFFERENTIAL:  # the same batch two ways: compiled module vs the module run eagerly
            report({"event": "compare", "step": step, "rank": 0, "quantity": "compiled_output",
                    "value": out.detach().reshape(-1).tolist(), "reference": eager_out.reshape(-1).tolist(),
                    "time": time.time()})

    trained_blocks = [i for i in range(BLOCKS)
                      if any(not torch.equal(p.detach(), s) for p, s in zip(model.blocks[i].parameters(), block_params[i]))]
    manifested = first_bad_step is not None
    if manifested:
        summary = ("compiled output diverged from eager from step %d (max rel. diff %.3g): the graph "
                   "traced with active_blocks=1 was reused; blocks trained: %s"
                   % (first_bad_step, max_rel_diff, trained_blocks))
    else:
        summary = "compiled output matched eager at every step (max rel. diff %.2g)" % max_rel_diff
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_rel_diff": max_rel_diff, "threshold": REL_DIFF_THRESHOLD,
                         "first_bad_step": first_bad_step, "trained_blocks": trained_blocks,
                         "final_active_blocks": model.active_blocks, "grow_at_steps": list(GROW_AT),
                         "torch": torch.__version__}})


if __name__ == "__main__":
    main()
