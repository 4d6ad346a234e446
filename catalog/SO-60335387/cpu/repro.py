"""SilentBench reproducer for SO-60335387: the training loop never clears the gradients.

The bug
    PyTorch adds every new gradient into ``param.grad``; clearing it is the job of
    ``optimizer.zero_grad()`` (or ``model.zero_grad()``). The user's loop (StackOverflow
    question 60335387, catalogued as a "missing optimizer.zero_grad" bug by the TrainCheck
    study) leaves that call out. Nothing crashes: from the second iteration on, the
    optimizer is fed the running *sum* of all past mini-batch gradients instead of the
    gradient of the current batch, so the effective step size keeps growing. With a
    summed loss and SGD with momentum the run is fine at lr 1e-5 (where the extra
    "momentum" even makes the loss look better) but goes unstable at lr 1e-4, which is
    the behaviour reported in the question.

This program
    A small MLP classifier (784-128-10) is trained on synthetic MNIST-like 28x28 images
    (ten random blob prototypes plus pixel noise, drawn from the seed) with a summed
    cross-entropy, SGD(lr=1e-4, momentum=0.9) and batches of 64. The ``buggy`` variant
    omits ``optimizer.zero_grad()``; the ``fixed`` variant calls it. Nothing else differs.
    Every step ends with exactly one ``optimizer.step()``.

Oracle (checked inside the single run)
    Just before ``loss.backward()`` the program copies whatever ``.grad`` already holds.
    After backward, the gradient of the current batch alone is ``.grad - copy``. The
    symptom is that the gradient the optimizer is about to consume is not the gradient
    of the current batch: ``stale_ratio = ||.grad - fresh|| / ||fresh||`` (global L2 norms
    over all parameters). The oracle says *manifested* if, at some step, that ratio is
    above 0.5 or the consumed gradient is not finite. In the fixed variant ``.grad`` is
    ``None`` before every backward, so the ratio is exactly 0.

Trigger step
    1. At step 0 ``.grad`` is still ``None`` in both variants, so step 0 is identical;
    step 1 is the first step whose update contains a stale gradient (that of step 0).

Reported loss
    ``loss`` in the step records is the per-sample mean (summed loss / batch size), so it
    starts near ln(10) = 2.3; non-finite values are written as null.
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

DEFAULT_STEPS = 30
TRIGGER_STEP = 1
BATCH = 64
LR = 1e-4
STALE_RATIO_THRESHOLD = 0.5


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


def make_prototypes(gen):
    """Ten binary 28x28 'digit' templates: upsampled random 7x7 blobs."""
    coarse = torch.rand(10, 1, 7, 7, generator=gen)
    fine = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    return (fine > 0.55).float()


def make_batch(protos, gen):
    labels = torch.randint(0, 10, (BATCH,), generator=gen)
    images = (protos[labels] + torch.randn(BATCH, 1, 28, 28, generator=gen)).clamp(0.0, 1.0)
    images = (images - 0.13) / 0.31  # MNIST-style normalisation
    return images, labels


def global_norm(tensors):
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    torch.set_num_threads(1)  # tiny model: one thread is as fast, and results do not depend on the core count
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    protos = make_prototypes(gen)

    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)
    criterion = nn.CrossEntropyLoss(reduction="sum")

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_ratio = 0.0
    first_stale_step = None
    first_nonfinite_loss_step = None
    nonfinite_grad = False
    last = {}
    for step in range(args.steps):
        images, labels = make_batch(protos, gen)

        if args.variant == "fixed":
            optimizer.zero_grad()  # FIX: clear the gradients left by the previous step
        # BUG: in the buggy variant nothing clears .grad, so backward() adds onto it

        logits = model(images)
        loss = criterion(logits, labels)

        # Oracle bookkeeping: what .grad holds before this batch's backward.
        before = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                  for p in params]
        loss.backward()
        consumed = [p.grad.detach() for p in params]
        fresh = [c - b for c, b in zip(consumed, before)]

        grad_norm = global_norm(consumed)
        fresh_norm = global_norm(fresh)
        stale_norm = global_norm(before)
        ratio = stale_norm / fresh_norm if fresh_norm > 0 else (0.0 if stale_norm == 0 else math.inf)

        optimizer.step()

        loss_value = loss.item() / BATCH
        if not math.isfinite(loss_value) and first_nonfinite_loss_step is None:
            first_nonfinite_loss_step = step
        if not math.isfinite(grad_norm):
            nonfinite_grad = True
        if math.isfinite(ratio):
            max_ratio = max(max_ratio, ratio)
        if (ratio > STALE_RATIO_THRESHOLD or not math.isfinite(grad_norm)) and first_stale_step is None:
            first_stale_step = step
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        last = {"loss": loss_value, "grad_norm": grad_norm, "fresh_grad_norm": fresh_norm,
                "stale_ratio": ratio, "acc": acc}
        report({"event": "step", "step": step, "rank": 0, "loss": loss_value, "time": time.time(),
                "metrics": {"grad_norm": grad_norm, "fresh_grad_norm": fresh_norm,
                            "stale_ratio": ratio, "acc": acc}})

    manifested = first_stale_step is not None
    if manifested:
        summary = ("optimizer consumed accumulated gradients: from step %d on, .grad held stale "
                   "mass up to %.1fx the current batch gradient" % (first_stale_step, max_ratio))
    else:
        summary = "every step used exactly the current batch gradient (stale ratio %.3g)" % max_ratio
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_stale_ratio": max_ratio, "threshold": STALE_RATIO_THRESHOLD,
                         "first_stale_step": first_stale_step,
                         "nonfinite_grad": nonfinite_grad,
                         "first_nonfinite_loss_step": first_nonfinite_loss_step,
                         "final_loss": last.get("loss"), "final_acc": last.get("acc"),
                         "final_grad_norm": last.get("grad_norm"),
                         "final_fresh_grad_norm": last.get("fresh_grad_norm"),
                         "lr": LR}})


if __name__ == "__main__":
    main()
