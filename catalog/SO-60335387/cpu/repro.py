"""SilentBench reproducer for SO-60335387: the training loop never clears the gradients.

The bug
    PyTorch adds every new gradient into ``param.grad``; clearing it is the job of
    ``optimizer.zero_grad()`` (or ``model.zero_grad()``). The user's loop (StackOverflow
    question 60335387, catalogued as a "missing optimizer.zero_grad" bug by the TrainCheck
    study) leaves that call out. Nothing crashes: from the second iteration on, the
    optimizer is fed the running *sum* of all past mini-batch gradients instead of the
    gradient of the current batch. Adam normalises the step size, so the sum acts like a
    momentum that never decays: early on the loss falls even faster than in the correct
    loop, then the updates keep pushing past the minimum and the loss climbs back up and
    swings, at a learning rate where the correct loop trains smoothly.

This program
    The upstream setup is kept where a CPU run allows: Adam, the mean cross-entropy
    (``nn.CrossEntropyLoss()``), batches of 64, one ``optimizer.step()`` per step. A small
    MLP classifier (784-128-10) stands in for the question's CNN and synthetic MNIST-like
    28x28 images (ten random blob prototypes plus pixel noise, drawn from the seed) for
    MNIST. The ``buggy`` variant omits ``optimizer.zero_grad()``; the ``fixed`` variant
    calls it. Nothing else differs. The learning rate is 1e-3 (Adam's default) instead of
    the question's 1e-4: the synthetic classes are separable, so at 1e-4 the accumulated
    gradient keeps lowering the loss for at least 400 steps, while at 1e-3 the buggy loop
    destabilises within 20-41 steps (seeds 0-19) and the correct one converges.

Oracle (the symptom a user sees: the loss curve)
    ``smoothed`` is the mean loss of the last 5 steps. *Manifested* means that, at some
    step, ``smoothed`` climbed back more than 0.5 (nats) above the lowest value it had
    reached before, or the loss was not finite: training first learns, then falls apart.
    The correct loop, at the same learning rate, only goes down (its largest climb is 0.00
    on seeds 0-19; buggy: 1.28 to 3.93 within the 60 default steps). As evidence, the
    cause is measured too: just before ``loss.backward()`` the program copies whatever
    ``.grad`` already holds, so ``stale_ratio = ||.grad before backward|| / ||gradient of
    this batch||`` (0 in the fixed variant) is reported every step with the gradient norms.

Trigger step
    1. At step 0 ``.grad`` is still ``None`` in both variants, so step 0 is identical;
    step 1 is the first step whose update contains a stale gradient (that of step 0).

Reported loss
    ``loss`` in the step records is the batch's mean cross-entropy, so it starts near
    ln(10) = 2.3; non-finite values are written as null.
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

DEFAULT_STEPS = 60
TRIGGER_STEP = 1
BATCH = 64
LR = 1e-3
WINDOW = 5  # steps in the smoothed loss
CLIMB_THRESHOLD = 0.5  # nats the smoothed loss may climb back above its lowest value


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
    optimizer = torch.optim.Adam(params, lr=LR)
    criterion = nn.CrossEntropyLoss()  # the mean over the batch, as in the question

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    recent = []
    lowest = math.inf
    lowest_step = None
    max_climb = 0.0
    climb_step = None
    first_nonfinite_loss_step = None
    max_ratio = 0.0
    last = {}
    for step in range(args.steps):
        images, labels = make_batch(protos, gen)

        if args.variant == "fixed":
            optimizer.zero_grad()  # FIX: clear the gradients left by the previous step
        # BUG: in the buggy variant nothing clears .grad, so backward() adds onto it

        logits = model(images)
        loss = criterion(logits, labels)

        # Evidence of the cause: what .grad holds before this batch's backward.
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

        # The symptom: the smoothed loss climbs back above the lowest value it had reached.
        loss_value = loss.item()
        if not math.isfinite(loss_value) and first_nonfinite_loss_step is None:
            first_nonfinite_loss_step = step
        recent = (recent + [loss_value])[-WINDOW:]
        if len(recent) == WINDOW and math.isfinite(smoothed := sum(recent) / WINDOW):
            if smoothed < lowest:
                lowest, lowest_step = smoothed, step
            max_climb = max(max_climb, smoothed - lowest)
            if smoothed - lowest > CLIMB_THRESHOLD and climb_step is None:
                climb_step = step
        if math.isfinite(ratio):
            max_ratio = max(max_ratio, ratio)
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        last = {"loss": loss_value, "grad_norm": grad_norm, "acc": acc}
        report({"event": "step", "step": step, "rank": 0, "loss": loss_value, "time": time.time(),
                "metrics": {"grad_norm": grad_norm, "fresh_grad_norm": fresh_norm,
                            "stale_ratio": ratio, "acc": acc}})

    manifested = climb_step is not None or first_nonfinite_loss_step is not None
    if first_nonfinite_loss_step is not None:
        summary = "training diverged: the loss was not finite at step %d" % first_nonfinite_loss_step
    elif manifested:
        summary = ("training fell apart after learning: the %d-step mean loss fell to %.3g (step %d), then "
                   "climbed back by %.2f (more than %.1f at step %d)"
                   % (WINDOW, lowest, lowest_step, max_climb, CLIMB_THRESHOLD, climb_step))
    else:
        summary = ("the %d-step mean loss never climbed back more than %.1f above its lowest value "
                   "(largest climb %.3g)" % (WINDOW, CLIMB_THRESHOLD, max_climb))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_loss_climb": max_climb, "threshold": CLIMB_THRESHOLD, "window": WINDOW,
                         "lowest_smoothed_loss": lowest if math.isfinite(lowest) else None,
                         "lowest_step": lowest_step, "climb_step": climb_step,
                         "first_nonfinite_loss_step": first_nonfinite_loss_step,
                         "final_loss": last.get("loss"), "final_acc": last.get("acc"),
                         "final_grad_norm": last.get("grad_norm"),
                         "max_stale_ratio": max_ratio, "lr": LR}})

if __name__ == "__main__":
    main()
