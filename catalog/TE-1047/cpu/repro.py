"""SilentBench reproducer for TE-1047: a cached FP8 weight is dequantised with a scale updated after it was cast.

The bug
    Transformer Engine's FP8 layers use *delayed scaling*: the scale that maps a tensor into
    the FP8 range is computed from a history of past absolute maxima (amax) and refreshed
    after every forward. With gradient accumulation, ``is_first_microbatch=True`` makes the
    layer cast its weight to FP8 once, on micro-batch 0, and reuse the cached FP8 bytes on
    micro-batches 1, 2, ... (the weight does not change until the optimizer step). In TE 1.7
    the cached bytes were interpreted with the scale-inverse read from the *current* recipe
    state, which had been updated after micro-batch 0, instead of the scale they were cast
    with. On the first iteration the scale jumps from its initial 1.0 to fp8_max/amax, so
    every later micro-batch sees a weight shrunk by that factor: in the issue micro-batch 0
    is off by 0.07 (normal FP8 error) and micro-batches >= 1 by 1.7, about 25x worse. The
    first-iteration loss is higher and large runs became unstable after upgrading from TE
    1.2.1. No error is raised.

This program
    Transformer Engine needs a GPU, so the faulty logic is rebuilt with ``torch.float8_e4m3fn``
    (which works on CPU). ``DelayedScalingFP8Linear`` keeps an fp32 master weight, an amax
    history (length 16, "max" rule, margin 0) and a scale that starts at 1.0 and is
    refreshed after every forward, as in TE. On the first micro-batch of a step it casts
    ``weight * scale`` to e4m3 (saturating at 448) and caches the bytes together with the
    scale-inverse used; later micro-batches reuse the bytes. The matmul uses the
    dequantised FP8 weight, and the weight gradient flows to the master weight (as TE's
    wgrad does). The ``buggy`` variant dequantises the cached bytes with ``1 / scale`` read
    from the (updated) recipe state; the ``fixed`` variant uses the scale-inverse stored with
    the bytes. Nothing else differs. A two-layer MLP classifier (64-256-8, GELU, both layers
    FP8) is trained on synthetic Gaussian-blob data with AdamW(lr=1e-3) and gradient
    accumulation over 4 micro-batches of 32; each step ends with exactly one
    ``optimizer.step()``.

Oracle (checked inside the single run)
    For every FP8 layer call the program also computes the fp32 reference
    ``F.linear(input, master_weight, bias)`` on the same input and the relative error
    ``||out_fp8 - out_ref|| / ||out_ref||``. *Manifested* means a micro-batch >= 1 had a
    relative error above 0.3. The fixed variant stays at FP8 rounding level (about 0.02-0.03
    on every micro-batch); the buggy one reaches ~1.0 on micro-batches >= 1 of the first step
    (the weight is shrunk by the new scale, ~3500x), 30-40 times micro-batch 0's error. Later
    steps are only mildly affected, because the scale then changes by ~1% per step, as in
    the issue, where the first iteration was the visibly wrong one.

Trigger step
    0: micro-batch 1 of the first step is the first use of a stale scale-inverse.
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

DEFAULT_STEPS = 10
TRIGGER_STEP = 0
MICROBATCHES = 4
MICRO_BATCH = 32
IN_FEATURES = 64
HIDDEN = 256
CLASSES = 8
LR = 1e-3
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
AMAX_HISTORY = 16
REL_ERR_THRESHOLD = 0.3


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


class DelayedScalingFP8Linear(nn.Linear):
    """Linear layer with an FP8 (e4m3) weight, delayed scaling and per-step weight caching."""

    def __init__(self, in_features, out_features, variant):
        super().__init__(in_features, out_features)
        self.variant = variant
        self.register_buffer("scale", torch.ones(()))  # recipe state; TE starts from 1.0
        self.register_buffer("amax_history", torch.zeros(AMAX_HISTORY))
        self.cached_fp8 = None
        self.cached_scale_inv = None
        self.errors = []  # relative error of each call vs the fp32 reference (oracle bookkeeping)

    def forward(self, x, is_first_microbatch):
        if is_first_microbatch or self.cached_fp8 is None:
            with torch.no_grad():
                w = self.weight.detach()
                self.amax_history.copy_(torch.roll(self.amax_history, 1))
                self.amax_history[0] = w.abs().max()
                self.cached_fp8 = (w * self.scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
                self.cached_scale_inv = 1.0 / self.scale.clone()
        if self.variant == "buggy":
            scale_inv = 1.0 / self.scale  # BUG: scale-inverse from the recipe state, updated since the bytes were cast
        else:
            scale_inv = self.cached_scale_inv  # FIX: the scale-inverse the cached FP8 bytes were produced with
        w_fp8 = self.cached_fp8.to(torch.float32) * scale_inv
        # The matmul sees the FP8 weight; its gradient goes to the fp32 master weight.
        w_used = self.weight + (w_fp8 - self.weight).detach()
        out = F.linear(x, w_used, self.bias)

        with torch.no_grad():
            ref = F.linear(x, self.weight, self.bias)
            self.errors.append(float((out - ref).norm() / ref.norm().clamp_min(1e-30)))
            # Delayed scaling: refresh the scale from the amax history after every forward.
            amax = self.amax_history.max()
            if amax > 0:
                self.scale.copy_(FP8_MAX / amax)
        return out


class Net(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.fc1 = DelayedScalingFP8Linear(IN_FEATURES, HIDDEN, variant)
        self.fc2 = DelayedScalingFP8Linear(HIDDEN, CLASSES, variant)

    def forward(self, x, is_first_microbatch):
        return self.fc2(F.gelu(self.fc1(x, is_first_microbatch)), is_first_microbatch)


def make_batch(centers, gen):
    labels = torch.randint(0, CLASSES, (MICRO_BATCH,), generator=gen)
    x = centers[labels] + torch.randn(MICRO_BATCH, IN_FEATURES, generator=gen)
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
    model = Net(args.variant)
    layers = [model.fc1, model.fc2]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    worst_later = 0.0
    worst_first = 0.0
    first_bad_step = None
    step0 = None
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        per_mb = []
        for mb in range(MICROBATCHES):
            x, labels = make_batch(centers, gen)
            for layer in layers:
                layer.errors.clear()
            logits = model(x, is_first_microbatch=(mb == 0))
            loss = F.cross_entropy(logits, labels) / MICROBATCHES
            loss.backward()
            loss_total += loss.item()
            per_mb.append(max(max(layer.errors) for layer in layers))
        optimizer.step()

        later = max(per_mb[1:]) if len(per_mb) > 1 else 0.0
        worst_first = max(worst_first, per_mb[0])
        worst_later = max(worst_later, later)
        if step == 0:
            step0 = per_mb
        if later > REL_ERR_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss_total, "time": time.time(),
                "metrics": {"fp8_rel_err_mb0": per_mb[0], "fp8_rel_err_later_mb": later,
                            "fc1_scale": float(model.fc1.scale), "fc2_scale": float(model.fc2.scale)}})

    manifested = first_bad_step is not None
    ratio = step0[1] / max(step0[0], 1e-30) if step0 and len(step0) > 1 else None
    if manifested:
        summary = ("FP8 output of micro-batches >= 1 off by up to %.3g (relative) vs fp32 from step %d; "
                   "step 0: micro-batch 1 error %.1fx that of micro-batch 0" % (worst_later, first_bad_step, ratio))
    else:
        summary = ("FP8 error stays at rounding level on every micro-batch (max %.3g; micro-batch 0 max %.3g)"
                   % (worst_later, worst_first))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_rel_err_later_microbatches": worst_later, "max_rel_err_microbatch0": worst_first,
                         "threshold": REL_ERR_THRESHOLD, "first_bad_step": first_bad_step,
                         "step0_rel_err_per_microbatch": step0,
                         "step0_mb1_over_mb0_error_ratio": ratio}})


if __name__ == "__main__":
    main()
