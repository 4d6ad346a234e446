"""SilentBench reproducer for PT-36485 (CUDA): the vectorised softmax kernel for rows wider than 1024.

The bug
    PR 36485 vectorised PyTorch's non-persistent CUDA (log_)softmax kernels, which handle
    rows longer than 1024 elements. Rows of a contiguous [N, C] tensor start at offset r*C,
    which is misaligned for the vector loads when C is not a multiple of the vector width;
    the kernel then skipped the tail of such rows, leaving up to three entries per row
    unnormalised or unwritten (``torch.rand(32, 65537).cuda().log_softmax(1)`` gave positive
    log-probabilities at the ends of rows 1, 2, 3, ...). MoCo's 65537-way contrastive
    softmax lost accuracy, and the PR was reverted (PR 38534, "it produces incorrect
    results"). Only CUDA nightlies built between the merge and the revert (May 2020) are
    affected; on any other build this program reports ``manifested: false`` for both variants.

This program
    A 2-layer MLP classifier with C = 1027 classes (> 1024, 1027 % 4 == 3) is trained on one
    GPU with ``F.nll_loss`` on log-probabilities, Adam(lr=1e-3), batches of 64 synthetic
    samples; every step ends with exactly one ``optimizer.step()``. The ``buggy`` variant
    takes ``F.log_softmax(logits, dim=1)`` directly, which on an affected build runs the
    faulty vectorised kernel. The ``fixed`` variant pads the class dimension with -inf
    columns to a multiple of 8 before ``F.log_softmax`` and slices the padding off again:
    the same values, but every row starts aligned, so the kernel's tail bug is never hit.
    Nothing else differs.

Oracle (checked inside the single run)
    Every step copies the logits to the CPU and compares the GPU log-probabilities with
    ``torch.log_softmax`` computed in float64 on the CPU, and checks that every row of
    ``exp(logp)`` sums to 1. *Manifested* means either deviation exceeded 1e-3 (or was not
    finite) at some step. At the end, a sweep over C = 1020..1032 and C = 65537 (32 random
    rows each, same variant) is recorded as evidence of which widths are affected.

Trigger step
    0: the first forward already runs the kernel.

Requirements
    A CUDA GPU (and, to see the bug, an affected nightly build). Without CUDA the program
    exits with status 2 and a message on stderr. The CPU analogue is ``catalog/PT-36485/cpu``.
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
IN_FEATURES = 32
CLASSES = 1027  # > 1024 and not a multiple of 4
LR = 1e-3
DEVIATION_THRESHOLD = 1e-3
SWEEP_WIDTHS = list(range(1020, 1033)) + [65537]


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


def pad_columns(logits, multiple):
    """Append -inf columns so that the row width is a multiple of ``multiple``."""
    return F.pad(logits, (0, (-logits.shape[1]) % multiple), value=float("-inf"))


def class_log_probs(logits, variant):
    width = logits.shape[1]
    if variant == "buggy":
        return F.log_softmax(logits, dim=1)  # BUG: misaligned rows of width > 1024 hit the vectorised kernel's tail bug
    else:
        return F.log_softmax(pad_columns(logits, 8), dim=1)[:, :width]  # FIX: aligned rows; -inf padding adds no mass


def deviations(logp_gpu, logits_gpu):
    """(max |logp - CPU float64 reference|, max |row sum of exp(logp) - 1|); inf if not finite."""
    logp = logp_gpu.detach().double().cpu()
    ref = torch.log_softmax(logits_gpu.detach().double().cpu(), dim=1)
    dev = (logp - ref).abs().max().item()
    rowsum = (logp.exp().sum(dim=1) - 1).abs().max().item()
    dev = dev if math.isfinite(dev) else math.inf
    rowsum = rowsum if math.isfinite(rowsum) else math.inf
    return dev, rowsum, int((logp > 0).sum().item())


def make_batch(centers, gen, device):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    x = centers[labels] + 0.5 * torch.randn(BATCH, IN_FEATURES, generator=gen)
    return x.to(device), labels.to(device)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-36485/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s). Run catalog/PT-36485/cpu for the CPU analogue.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device("cuda", 0)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU, then moved
    centers = torch.randn(CLASSES, IN_FEATURES, generator=gen)
    model = nn.Sequential(nn.Linear(IN_FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_dev = 0.0
    max_rowsum_dev = 0.0
    max_positive = 0
    first_bad_step = None
    for step in range(args.steps):
        x, labels = make_batch(centers, gen, device)
        optimizer.zero_grad()
        logits = model(x)
        logp = class_log_probs(logits, args.variant)
        loss = F.nll_loss(logp, labels)
        loss.backward()
        optimizer.step()

        dev, rowsum_dev, positive = deviations(logp, logits)
        max_dev = max(max_dev, dev)
        max_rowsum_dev = max(max_rowsum_dev, rowsum_dev)
        max_positive = max(max_positive, positive)
        if max(dev, rowsum_dev) > DEVIATION_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"max_abs_dev_vs_cpu": dev, "max_row_sum_dev": rowsum_dev,
                            "positive_log_probs": float(positive)}})

    sweep = {}
    with torch.no_grad():
        for width in SWEEP_WIDTHS:
            logits = torch.rand(32, width, generator=gen).to(device)
            dev, rowsum_dev, positive = deviations(class_log_probs(logits, args.variant), logits)
            sweep[str(width)] = {"max_abs_dev": dev, "max_row_sum_dev": rowsum_dev, "positive_log_probs": positive}
    affected = [int(w) for w, r in sweep.items() if max(r["max_abs_dev"], r["max_row_sum_dev"]) > DEVIATION_THRESHOLD]

    manifested = first_bad_step is not None
    if manifested:
        summary = ("GPU log_softmax rows do not sum to 1 (max |sum-1| %.3g) and differ from the CPU by up to "
                   "%.3g from step %d; affected widths in the sweep: %s"
                   % (max_rowsum_dev, max_dev, first_bad_step, affected))
    else:
        summary = ("GPU log_softmax matched the CPU reference (max dev %.2g, max |row sum - 1| %.2g); "
                   "affected widths in the sweep: %s" % (max_dev, max_rowsum_dev, affected))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_abs_dev_vs_cpu": max_dev, "max_row_sum_dev": max_rowsum_dev,
                         "max_positive_log_probs": max_positive, "threshold": DEVIATION_THRESHOLD,
                         "first_bad_step": first_bad_step, "classes": CLASSES,
                         "sweep": sweep, "sweep_affected_widths": affected,
                         "torch": torch.__version__, "cuda": torch.version.cuda,
                         "gpu": torch.cuda.get_device_name(device)}})


if __name__ == "__main__":
    main()
