"""SilentBench reproducer for PT-197888: compiled adaptive_max_pool3d on channels_last_3d input scatters gradients wrongly.

The bug
    The CPU kernel of ``adaptive_max_pool3d_backward`` makes ``grad_output`` contiguous but
    reads the saved ``indices`` through their raw data pointer, as if they were contiguous.
    Eager autograd always hands it contiguous indices; Inductor lays the saved indices out
    in the input's memory format, so a ``torch.compile``'d network whose input follows the
    ``channels_last_3d`` recommendation gets its max-pool gradient scattered to the wrong
    positions, with no error, while the forward values and indices are right (issue 197888,
    open, reported on 2.14 and nightly; reproduces on 2.13.0 CPU; ``aot_eager`` is correct).

This program
    A small volumetric classifier: Conv3d (2 -> 4 channels, 3x3x3), ReLU,
    ``F.adaptive_max_pool3d`` to 2x3x5, a linear head over 3 classes, compiled with Inductor.
    Synthetic 2x4x6x10 volumes, batch 4, Adam (lr 1e-2), cross-entropy. The ``buggy``
    variant keeps the model and the volumes in ``channels_last_3d``; the ``fixed`` variant
    keeps the default contiguous layout (the workaround until the kernel honours strides).
    The model is compiled and warmed up on a separate batch before step 0.

Oracle (checked inside the single run)
    Every step the same model runs uncompiled on the same batch and its conv weight gradient
    is taken with ``torch.autograd.grad`` (training untouched): the issue's comparison of
    compiled with eager. *Manifested* means the compiled gradient differs from eager's by more
    than 1% of eager's largest entry at some step. Under ``SILENTBENCH_DIFFERENTIAL=1`` every
    step also reports a few entries of both gradients as a ``compare`` record.

Trigger step
    0: the first compiled backward already scatters the gradient wrongly.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch._inductor.config
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_STEPS = 10
TRIGGER_STEP = 0
BATCH = 4
CLASSES = 3
VOLUME = (4, 6, 10)
POOLED = (2, 3, 5)
LR = 1e-2
REL_DIFF_THRESHOLD = 1e-2
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


class VolumeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, kernel_size=3, padding=1)
        self.head = nn.Linear(4 * POOLED[0] * POOLED[1] * POOLED[2], CLASSES)

    def forward(self, x):
        h = F.adaptive_max_pool3d(F.relu(self.conv(x)), POOLED)
        return self.head(h.flatten(1))


def make_batch(prototypes, gen):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    return prototypes[labels] + 0.5 * torch.randn(BATCH, 2, *VOLUME, generator=gen), labels


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1  # compile in this process: fewer processes, less memory

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    prototypes = torch.randn(CLASSES, 2, *VOLUME, generator=gen)
    if args.variant == "buggy":
        layout = torch.channels_last_3d  # BUG: Inductor saves the pool's indices channels-last; the CPU backward reads them as contiguous
    else:
        layout = torch.contiguous_format  # FIX: contiguous layout, whose indices the CPU backward reads correctly
    model = VolumeNet().to(memory_format=layout)
    compiled = torch.compile(model, backend="inductor")
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    # Warm-up: compile forward and backward once, on a batch of its own, without touching .grad.
    warm_x = torch.randn(BATCH, 2, *VOLUME, generator=torch.Generator().manual_seed(10_000 + args.seed))
    torch.autograd.grad(compiled(warm_x.to(memory_format=layout)).sum(), list(model.parameters()))

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_diff = 0.0
    first_bad_step = None
    for step in range(args.steps):
        x, labels = make_batch(prototypes, gen)
        x = x.to(memory_format=layout)
        optimizer.zero_grad(set_to_none=True)
        logits = compiled(x)
        loss = F.cross_entropy(logits, labels)
        loss.backward()

        ref_grad, = torch.autograd.grad(F.cross_entropy(model(x), labels), [model.conv.weight])
        got = model.conv.weight.grad
        rel_diff = float((got - ref_grad).abs().max() / ref_grad.abs().max().clamp_min(1e-12))
        if DIFFERENTIAL:
            report({"event": "compare", "step": step, "rank": 0, "quantity": "conv_weight_grad",
                    "value": got.reshape(-1)[:54].tolist(), "reference": ref_grad.reshape(-1)[:54].tolist(),
                    "time": time.time()})
        optimizer.step()

        max_rel_diff = max(max_rel_diff, rel_diff)
        if rel_diff > REL_DIFF_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"acc": acc, "conv_grad_rel_diff_vs_eager": rel_diff}})

    manifested = first_bad_step is not None
    if manifested:
        summary = ("compiled conv gradient differed from eager from step %d (max rel. diff %.3g > %g): the "
                   "pool's gradient went to the wrong positions" % (first_bad_step, max_rel_diff, REL_DIFF_THRESHOLD))
    else:
        summary = "compiled conv gradient matched eager at every step (max rel. diff %.2g)" % max_rel_diff
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_rel_diff": max_rel_diff, "threshold": REL_DIFF_THRESHOLD,
                         "first_bad_step": first_bad_step, "memory_format": str(layout)}})


if __name__ == "__main__":
    main()
