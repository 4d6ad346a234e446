"""SilentBench clean reference pipeline: a small CNN trained with SGD + momentum on synthetic images.

What it trains
    A small convolutional network (two Conv2d(bias=False) + BatchNorm2d + ReLU + max-pool blocks
    and a linear head) classifies 3x16x16 colour images into eight classes with cross-entropy
    and ``torch.optim.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4)``. The images are generated
    from the seed: eight smooth colour class templates (upsampled random 3x4x4 patches), each
    sample being its class template shifted by up to 2 pixels, at a random contrast, plus
    Gaussian noise. A fresh batch of 32 is drawn every step. The convolutions have no bias
    because a BatchNorm follows each of them (a bias there would be cancelled by the BatchNorm).

Clean reference
    This program contains no fault. It exists so that invariant-learning detectors can fit on
    correct training code and so that false-positive rates can be measured on it. ``--variant``
    changes nothing: ``buggy`` runs the same clean program. Each step calls ``optimizer.zero_grad()``, runs forward and
    backward, and ends with exactly one ``optimizer.step()``.

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
import torch.nn.functional as F

DEFAULT_STEPS = 40
TRIGGER_STEP = None  # clean pipeline: no fault is ever active
BATCH = 32
N_CLASSES = 8
LR = 0.01
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4


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


def make_templates(gen):
    """Eight smooth 3x16x16 colour templates: upsampled random 3x4x4 patches, centred."""
    coarse = torch.randn(N_CLASSES, 3, 4, 4, generator=gen)
    fine = F.interpolate(coarse, size=(16, 16), mode="bilinear", align_corners=False)
    return fine - fine.mean(dim=(1, 2, 3), keepdim=True)


def make_batch(templates, gen, batch=BATCH):
    labels = torch.randint(0, N_CLASSES, (batch,), generator=gen)
    contrast = 0.5 + 0.5 * torch.rand(batch, 1, 1, 1, generator=gen)
    shifts = torch.randint(-2, 3, (batch, 2), generator=gen).tolist()  # small random translations
    clean = torch.stack([torch.roll(templates[c], shifts=(dy, dx), dims=(1, 2))
                         for c, (dy, dx) in zip(labels.tolist(), shifts)])
    images = contrast * clean + 1.0 * torch.randn(batch, 3, 16, 16, generator=gen)
    return images, labels


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32 * 4 * 4, N_CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


@torch.no_grad()
def grad_norm(params):
    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum()
    return float(total.sqrt())


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)  # the same either way
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    torch.set_num_threads(1)  # deterministic and light on a shared CPU
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    templates = make_templates(gen)
    eval_images, eval_labels = make_batch(templates, gen, batch=256)

    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    criterion = nn.CrossEntropyLoss()
    model.train()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    losses = []
    for step in range(args.steps):
        images, labels = make_batch(templates, gen)
        optimizer.zero_grad()
        logits = model(images)
        loss = criterion(logits, labels)
        loss.backward()
        norm = grad_norm(model.parameters())
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        losses.append(loss.item())
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": losses[-1], "time": time.time(),
                "metrics": {"grad_norm": norm, "lr": lr, "acc": acc}})

    model.eval()
    with torch.no_grad():
        eval_acc = (model(eval_images).argmax(dim=1) == eval_labels).float().mean().item()
    manifested, evidence = training_failed(losses)
    evidence["heldout_acc"] = eval_acc
    summary = ("training %s: mean loss %.4f over the first quarter, %.4f over the last; held-out acc %.2f"
               % (verdict(manifested, evidence), evidence["first_quarter_mean_loss"],
                  evidence["last_quarter_mean_loss"], eval_acc))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
