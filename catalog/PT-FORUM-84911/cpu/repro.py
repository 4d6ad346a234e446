"""SilentBench reproducer for PT-FORUM-84911: the optimizer only owns frozen parameters.

The bug
    In PyTorch forum thread 84911 (catalogued by the TrainCheck study as "no trainable
    layers exist") a user fine-tunes a network: first every parameter except those of
    the BatchNorm layers is frozen with ``requires_grad = False``, then the classifier head
    is frozen as well, while the optimizer is built over the head's parameters. PyTorch
    accepts an optimizer whose parameters never receive a gradient, ``loss.backward()``
    works because the BatchNorm affine parameters still require grad, and ``Adam.step()``
    simply skips every parameter whose ``.grad`` is ``None``. The run finishes, the loss
    wanders around ln(10), accuracy stays near chance and no weight ever changes.

This program
    A small CNN (two conv + BatchNorm2d + ReLU blocks and a linear head) is trained with
    Adam(lr=1e-3) on synthetic MNIST-like 28x28 images generated from the seed. The
    backbone's conv weights are frozen and its BatchNorm layers are left trainable (as in
    the thread); the optimizer owns the head. The ``buggy`` variant freezes the head too;
    the ``fixed`` variant keeps the head trainable. Nothing else differs. Each step ends
    with exactly one ``optimizer.step()``.

Oracle
    A copy of every parameter is taken before training. At the end the program compares
    the parameters with that copy: *manifested* means no parameter changed at all although
    ``optimizer.step()`` ran every step. In the fixed variant the head's weights change.

Trigger step
    0: the very first ``optimizer.step()`` is already a no-op.
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
TRIGGER_STEP = 0
BATCH = 64
LR = 1e-3


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
    images = (images - 0.13) / 0.31
    return images, labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


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
    eval_images, eval_labels = make_batch(protos, gen)

    model = Net()
    # Freeze everything except the BatchNorm layers (the thread's first freezing pass).
    for module in model.modules():
        if not isinstance(module, nn.BatchNorm2d):
            for p in module.parameters(recurse=False):
                p.requires_grad = False
    # Second pass over the classifier head.
    for p in model.head.parameters():
        if args.variant == "buggy":
            p.requires_grad = False  # BUG: the head, the only thing the optimizer owns, is frozen too
        else:
            p.requires_grad = True  # FIX: keep the head trainable
    optimizer = torch.optim.Adam(model.head.parameters(), lr=LR)
    criterion = nn.CrossEntropyLoss()

    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.train()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    for step in range(args.steps):
        images, labels = make_batch(protos, gen)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        logits = model(images)
        loss = criterion(logits, labels)
        loss.backward()
        optimizer.step()
        update = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"max_param_update": update, "acc": acc}})

    changed = {}
    for name, p in model.named_parameters():
        delta = float((p.detach() - initial[name]).abs().max())
        if delta > 0.0:
            changed[name] = delta
    model.eval()
    with torch.no_grad():
        eval_acc = (model(eval_images).argmax(dim=1) == eval_labels).float().mean().item()

    manifested = len(changed) == 0
    if manifested:
        summary = ("no parameter changed in %d optimizer steps; held-out accuracy %.2f"
                   % (args.steps, eval_acc))
    else:
        summary = ("%d parameter tensors changed (max |delta| %.3g); held-out accuracy %.2f"
                   % (len(changed), max(changed.values()), eval_acc))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"changed_parameters": changed,
                         "n_parameter_tensors": len(initial),
                         "optimizer_param_requires_grad": [p.requires_grad for g in optimizer.param_groups
                                                           for p in g["params"]],
                         "heldout_acc": eval_acc}})


if __name__ == "__main__":
    main()
