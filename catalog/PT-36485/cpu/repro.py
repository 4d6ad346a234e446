"""SilentBench reproducer for PT-36485 (CPU analogue): vectorised softmax drops the tail of misaligned rows.

The bug
    PR 36485 vectorised PyTorch's CUDA (log_)softmax kernels for rows longer than 1024
    elements (the "non-persistent" kernels): each thread loads several elements at once with
    aligned vector loads. A row of a contiguous [N, C] tensor starts at offset r*C, which is
    not aligned to the vector width when C is not a multiple of it. The kernel masked off
    the slots before a misaligned row start but still visited only C slots, so the last
    (r*C mod 4) elements of such a row were never included in the max/sum and never
    written. In the report on the PR (``torch.rand(32, 65537).cuda().log_softmax(1)``) row 0
    is correct while rows 1, 2, 3 end with 1, 2, 3 garbage entries, including positive
    log-probabilities; MoCo's 65537-way softmax lost accuracy and the PR was reverted (PR
    38534, "it produces incorrect results"). Rows <= 1024 wide and C % 4 == 0 were fine.

This program
    The CUDA kernel is not available here, so its addressing is rebuilt on CPU.
    ``vectorized_log_softmax`` uses an exact ``logsumexp`` for C <= 1024 (the persistent
    path) and, for longer rows, walks the flattened buffer in aligned vectors of 4: per row
    it masks the slots before the row start, reduces a max and a sum of exponentials over
    the valid slots and writes the results into an output buffer that starts as a copy of
    the logits (slots the kernel never writes keep those stale values). The ``buggy``
    variant lets a row's slot loop cover C slots; the ``fixed`` variant covers C + shift,
    the row's real extent in the aligned frame. Nothing else differs. A 2-layer MLP
    classifier with C = 1027 classes (> 1024, 1027 % 4 == 3) is trained with
    ``F.nll_loss`` on top of it, Adam(lr=1e-3), batches of 64 synthetic samples; every step
    ends with exactly one ``optimizer.step()``.

Oracle (checked inside the single run)
    Every step compares the kernel's output with ``torch.log_softmax`` on the same logits
    and checks the softmax invariant (each row of ``exp(logp)`` sums to 1). *Manifested*
    means the maximum absolute deviation of either exceeded 1e-3 at some step. The fixed
    variant agrees to ~1e-6; the buggy one leaves 1-3 unnormalised entries at the end of
    three rows out of four, so row sums are off by O(1) and some log-probabilities are
    positive.

Trigger step
    0: the first forward already goes through the faulty tail handling.
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
VEC = 4  # elements per aligned vector load
PERSISTENT_MAX = 1024  # rows up to this width take the (correct) persistent path
LR = 1e-3
DEVIATION_THRESHOLD = 1e-3


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


def vectorized_log_softmax(logits, variant):
    """log_softmax over dim 1 of a contiguous [N, C] tensor, addressed like the vectorised kernel."""
    rows, width = logits.shape
    if width <= PERSISTENT_MAX:
        return logits - logits.logsumexp(dim=1, keepdim=True)
    flat = logits.reshape(-1)
    row_start = torch.arange(rows) * width
    shift = row_start % VEC  # misalignment of each row start in the flat buffer
    if variant == "buggy":
        span = torch.full_like(shift, width)  # BUG: C slots from the aligned start: the last `shift` elements are never visited
    else:
        span = width + shift  # FIX: the row's full extent in the aligned frame
    n_vec = (int(span.max()) + VEC - 1) // VEC
    slot = torch.arange(n_vec * VEC)
    index = (row_start - shift)[:, None] + slot[None, :]  # flat offset of every slot of every aligned vector
    valid = (slot[None, :] >= shift[:, None]) & (slot[None, :] < span[:, None])
    padded = torch.cat([flat, flat.new_full((n_vec * VEC,), float("-inf"))])
    vals = padded[index].masked_fill(~valid, float("-inf"))
    row_max = vals.view(rows, n_vec, VEC).amax(dim=2).amax(dim=1, keepdim=True)  # per vector, then per row
    row_sum = torch.exp(vals - row_max).sum(dim=1, keepdim=True)
    result = vals - row_max - torch.log(row_sum)
    out = flat.clone()  # output buffer; slots the kernel never writes keep stale values
    out = out.index_put((index[valid],), result[valid])
    return out.view(rows, width)


def make_batch(centers, gen):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    x = centers[labels] + 0.5 * torch.randn(BATCH, IN_FEATURES, generator=gen)
    return x, labels


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared CPU

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    centers = torch.randn(CLASSES, IN_FEATURES, generator=gen)
    model = nn.Sequential(nn.Linear(IN_FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_dev = 0.0
    max_rowsum_dev = 0.0
    max_positive = 0
    first_bad_step = None
    for step in range(args.steps):
        x, labels = make_batch(centers, gen)
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        logp = vectorized_log_softmax(logits, args.variant)
        loss = F.nll_loss(logp, labels)
        loss.backward()
        optimizer.step()

        with torch.no_grad():
            ref = torch.log_softmax(logits.detach(), dim=1)
            dev = float((logp.detach() - ref).abs().max())
            rowsum_dev = float((logp.detach().exp().sum(dim=1) - 1).abs().max())
            positive = int((logp.detach() > 0).sum())
            ref_loss = float(F.nll_loss(ref, labels))
        worst = max(dev, rowsum_dev) if math.isfinite(dev) and math.isfinite(rowsum_dev) else math.inf
        max_dev = max(max_dev, dev)
        max_rowsum_dev = max(max_rowsum_dev, rowsum_dev)
        max_positive = max(max_positive, positive)
        if worst > DEVIATION_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"max_abs_dev_vs_log_softmax": dev, "max_row_sum_dev": rowsum_dev,
                            "positive_log_probs": float(positive), "reference_loss": ref_loss}})

    manifested = first_bad_step is not None
    if manifested:
        summary = ("softmax rows do not sum to 1 (max |sum-1| %.3g) and differ from torch.log_softmax by up "
                   "to %.3g from step %d; up to %d positive log-probs per batch"
                   % (max_rowsum_dev, max_dev, first_bad_step, max_positive))
    else:
        summary = "softmax matched torch.log_softmax (max dev %.2g, max |row sum - 1| %.2g)" % (max_dev, max_rowsum_dev)
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_abs_dev_vs_log_softmax": max_dev, "max_row_sum_dev": max_rowsum_dev,
                         "max_positive_log_probs": max_positive, "threshold": DEVIATION_THRESHOLD,
                         "first_bad_step": first_bad_step, "classes": CLASSES, "vector_width": VEC}})


if __name__ == "__main__":
    main()
