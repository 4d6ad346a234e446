"""SilentBench clean reference pipeline: gradient accumulation over micro-batches, with clipping and a schedule.

What it trains
    An MLP (32 -> 64 -> 64 -> 8, ReLU, dropout 0.1 after each hidden layer) classifies points drawn from eight
    Gaussian blobs with cross-entropy and ``torch.optim.AdamW(lr=3e-3, weight_decay=0.01)``. Each step accumulates
    the gradients of 4 micro-batches of 16 (each loss divided by 4, so that the step's gradient is the mean over the
    64 samples), clips them to a global norm of 1.0 with ``torch.nn.utils.clip_grad_norm_``, takes one optimizer
    step, then advances a ``LambdaLR`` schedule: linear warmup over the first 10% of the steps, then cosine decay to
    10% of the peak. The blobs' centres are N(0, 2^2) per feature, drawn from the seed, and each point lies N(0, 4^2)
    around its centre, so that the held-out accuracy ends near 0.8, not at 1. A fresh batch is drawn for every
    micro-batch.

Clean reference
    This program contains no fault. It exists so that invariant-learning detectors can fit on
    correct training code, so that false-positive rates can be measured on it, and as the accumulation pipeline of
    the sensitivity track. ``--variant`` changes nothing: ``buggy`` runs the same clean program. Each step calls
    ``optimizer.zero_grad()`` once, runs 4 forwards and backwards, clips, and ends with exactly one
    ``optimizer.step()``, then advances the scheduler.

Oracle
    *manifested* is true only if training visibly failed: a non-finite loss appeared, or
    (with at least 4 steps) the mean loss of the last quarter of the steps is not below the
    mean of the first quarter. It is false on every seed. There is no fault, so the
    trigger step is null.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn

DEFAULT_STEPS = 40
TRIGGER_STEP = None  # clean pipeline: no fault is ever active
FEATURES = 32
N_CLASSES = 8
MICRO_BATCH = 16
ACCUMULATION = 4
LR = 3e-3
WEIGHT_DECAY = 0.01
DROPOUT = 0.1
MAX_NORM = 1.0
WARMUP_FRACTION = 0.1
MIN_LR_FACTOR = 0.1


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


def make_centres(gen):
    return 2.0 * torch.randn(N_CLASSES, FEATURES, generator=gen)


def make_batch(centres, gen, batch=MICRO_BATCH):
    labels = torch.randint(0, N_CLASSES, (batch,), generator=gen)
    points = centres[labels] + 4.0 * torch.randn(batch, FEATURES, generator=gen)
    return points, labels


def lr_factor(step, total_steps):
    """Linear warmup, then cosine decay to MIN_LR_FACTOR; always strictly positive."""
    warmup = max(1, round(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return MIN_LR_FACTOR + (1.0 - MIN_LR_FACTOR) * 0.5 * (1.0 + math.cos(math.pi * progress))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Dropout(DROPOUT),
                                    nn.Linear(64, 64), nn.ReLU(), nn.Dropout(DROPOUT), nn.Linear(64, N_CLASSES))

    def forward(self, x):
        return self.layers(x)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)  # the same either way
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    torch.set_num_threads(1)  # deterministic and light on a shared CPU
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    centres = make_centres(gen)
    eval_points, eval_labels = make_batch(centres, gen, batch=512)

    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, args.steps))
    criterion = nn.CrossEntropyLoss()
    model.train()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        step_loss, correct = 0.0, 0
        for _ in range(ACCUMULATION):
            points, labels = make_batch(centres, gen)
            logits = model(points)
            loss = criterion(logits, labels) / ACCUMULATION
            loss.backward()
            step_loss += loss.item()
            correct += int((logits.argmax(dim=1) == labels).sum())
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
        lr = optimizer.param_groups[0]["lr"]  # the LR this step uses
        optimizer.step()
        scheduler.step()
        losses.append(step_loss)
        report({"event": "step", "step": step, "rank": 0, "loss": step_loss, "time": time.time(),
                "metrics": {"grad_norm": norm, "lr": lr, "acc": correct / (ACCUMULATION * MICRO_BATCH)}})

    model.eval()
    with torch.no_grad():
        eval_acc = (model(eval_points).argmax(dim=1) == eval_labels).float().mean().item()
    manifested, evidence = training_failed(losses)
    evidence["heldout_acc"] = eval_acc
    summary = ("training %s: mean loss %.4f over the first quarter, %.4f over the last; held-out acc %.2f"
               % (verdict(manifested, evidence), evidence["first_quarter_mean_loss"],
                  evidence["last_quarter_mean_loss"], eval_acc))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
