"""SilentBench reproducer for PT-193671: nn.RReLU under non-reentrant activation checkpointing backpropagates through uninitialised noise.

The bug
    In training mode ``F.rrelu`` draws a random slope per element into a ``noise`` tensor that
    ``rrelu_with_noise`` fills in place, and its backward is ``noise * grad_output``. Autograd
    saves ``noise`` for the backward before the kernel fills it. ``checkpoint(...,
    use_reentrant=False)`` recomputes the block in the backward and, with early stop (the
    default), aborts the recomputation as soon as the last saved tensor is packed: before the
    kernel has written the slopes. The backward then multiplies by whatever the fresh buffer
    held. The forward is bit-exact, nothing is raised (issue 193671, open; torch 2.13 still
    does it).

This program
    A classifier MLP (32 -> 64 -> 64 -> 8) whose two hidden blocks (Linear + RReLU) run under
    ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``, as memory-saving training code
    does, trained with Adam (lr 1e-3) and cross-entropy on Gaussian blobs, batch 64, in
    PyTorch's deterministic mode (``torch.use_deterministic_algorithms(True)``, as reproducible
    training sets it), which fills uninitialised memory with NaN: the unwritten slopes are then
    NaN in every run instead of whatever the allocator's memory held, which differs between
    runs. Beside it, the same model without checkpointing, from the same initial weights, on
    the same batches and with the same random slopes (the CPU RNG state is replayed), in
    lockstep: checkpointing must not change training. The ``buggy`` variant checkpoints with the default early stop; the
    ``fixed`` variant runs its steps under ``set_checkpoint_early_stop(False)``, the issue's
    workaround, so the recomputation runs the kernel to the end. Nothing else differs.

Oracle (checked inside the single run)
    *Manifested* means the checkpointed model's training loss differs from the
    non-checkpointed one's by more than 1e-3 (relative), or is not finite, at some step. How
    many entries of the first step's weight gradient are not finite, and how far it is from the
    non-checkpointed one, is evidence. Under
    ``SILENTBENCH_DIFFERENTIAL=1`` both losses are reported every step as a ``compare`` record.

Trigger step
    0: the first backward already multiplies by the uninitialised slopes.
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

DEFAULT_STEPS = 20
TRIGGER_STEP = 0
IN_FEATURES = 32
HIDDEN = 64
CLASSES = 8
BATCH = 64
LR = 1e-3
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


class Classifier(nn.Module):
    """Two Linear + RReLU blocks, checkpointed or not, and a linear head."""

    def __init__(self, checkpointed):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.RReLU()),
                                     nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.RReLU())])
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(x)


def train_step(model, optimizer, x, labels, rng_state, checkpoint_mode):
    """One step from the given CPU RNG state, so that both models draw the same RReLU slopes."""
    torch.set_rng_state(rng_state)
    optimizer.zero_grad(set_to_none=True)
    with checkpoint_mode:
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
    grad = model.blocks[0][0].weight.grad
    # A detector that stops backward (detect_anomaly) leaves it None: no gradient reached the layer.
    first_weight_grad = None if grad is None else grad.detach().clone()
    optimizer.step()
    return loss, logits, first_weight_grad


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)  # uninitialised memory reads as NaN, the same in every run
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    centers = 1.5 * torch.randn(CLASSES, IN_FEATURES, generator=gen)

    model = Classifier(checkpointed=True)
    reference = Classifier(checkpointed=False)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_diff = 0.0
    first_bad_step = None
    first_grad_error = None
    first_grad_nonfinite = None
    for step in range(args.steps):
        labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        x = centers[labels] + torch.randn(BATCH, IN_FEATURES, generator=gen)
        rng_state = torch.get_rng_state()
        if args.variant == "buggy":
            checkpoint_mode = contextlib.nullcontext()  # BUG: early stop ends the recompute before RReLU fills noise
        else:
            checkpoint_mode = set_checkpoint_early_stop(False)  # FIX: the recomputation runs every kernel to the end
        loss, logits, grad = train_step(model, optimizer, x, labels, rng_state, checkpoint_mode)
        reference_loss, _, reference_grad = train_step(reference, reference_optimizer, x, labels, rng_state,
                                                       contextlib.nullcontext())
        if step == 0 and grad is not None and reference_grad is not None:
            first_grad_nonfinite = int((~grad.isfinite()).sum())
            first_grad_error = float((grad - reference_grad).abs().max() / reference_grad.abs().max())
        rel_diff = abs(loss.item() - reference_loss.item()) / max(abs(reference_loss.item()), 1e-12)
        if not math.isfinite(rel_diff):
            rel_diff = math.inf
        max_rel_diff = max(max_rel_diff, rel_diff)
        if rel_diff > REL_LOSS_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        if DIFFERENTIAL:
            report({"event": "compare", "step": step, "rank": 0, "quantity": "loss",
                    "value": loss.item(), "reference": reference_loss.item(), "time": time.time()})
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"acc": acc, "loss_rel_diff_vs_unchecked": rel_diff}})

    manifested = first_bad_step is not None
    if manifested:
        gradient = ("its first weight gradient was never computed (backward was stopped)"
                    if first_grad_nonfinite is None else "%d of the %d entries of its first weight gradient were not "
                    "finite" % (first_grad_nonfinite, HIDDEN * IN_FEATURES))
        summary = ("the checkpointed model's loss differed from the same model trained without checkpointing from "
                   "step %d (max rel. diff %.3g > %g): %s"
                   % (first_bad_step, max_rel_diff, REL_LOSS_THRESHOLD, gradient))
    else:
        summary = "the checkpointed model matched the one without checkpointing at every step (max rel. diff %.2g)" % (
            max_rel_diff)
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_rel_loss_diff": max_rel_diff, "threshold": REL_LOSS_THRESHOLD,
                         "first_bad_step": first_bad_step, "first_step_weight_grad_rel_error": first_grad_error,
                         "first_step_weight_grad_nonfinite": first_grad_nonfinite,
                         "checkpoint_early_stop": args.variant == "buggy"}})


if __name__ == "__main__":
    main()
