"""SilentBench reproducer for PT-179804: a compiled fp32 region under autocast gets a low-precision backward.

The bug
    Under an outer ``torch.autocast(dtype=bfloat16)``, a region that turns autocast off
    (``autocast(enabled=False)``) to compute in fp32 is fp32 in both passes in eager mode:
    the backward runs outside autocast. Once that region is compiled, AOTAutograd traces its
    backward under the forward's ambient autocast (``torch._functorch.config.
    backward_pass_autocast = "same_as_forward"``, the default on torch 2.13) and ignores the
    inner ``enabled=False``: the backward matmuls run in bf16, and the weight gradients differ
    from eager's (issue 179804, open; same family as 153044, for which PR 177287 changes
    the option's default to "off"; torch 2.13 still has "same_as_forward").

This program
    A classifier trained in bf16 autocast on CPU: a bf16 MLP body and an fp32 output head,
    the usual numerically sensitive part kept in fp32 by disabling autocast inside it. The
    head is compiled with ``torch.compile(backend="aot_eager")`` (no code generation: the
    fault is in AOTAutograd's tracing). AdamW (lr 1e-3), cross-entropy, synthetic Gaussian
    blobs, batch 64. The ``buggy`` variant keeps torch 2.13's default; the ``fixed`` variant
    sets ``backward_pass_autocast = "off"`` (the default PR 177287 moves to). Nothing else differs.

Oracle (checked inside the single run)
    Every step the same batch also goes through the uncompiled head with the same weights
    (``torch.autograd.grad``, which leaves the training gradients untouched), the
    comparison the issue makes. *Manifested* means the compiled head's weight gradient
    differs from eager's by more than 1e-4 of its largest entry at some step. The fixed
    variant matches bit for bit; the buggy one differs by about 1e-3 (bf16 rounding).
    Under ``SILENTBENCH_DIFFERENTIAL=1`` every step also reports a few entries of both
    gradients as a ``compare`` record.

Trigger step
    0: the first backward through the compiled head is computed in bf16.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch._functorch.config
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_STEPS = 15
TRIGGER_STEP = 0
BATCH = 64
IN_FEATURES = 32
HIDDEN = 128
CLASSES = 10
LR = 1e-3
REL_DIFF_THRESHOLD = 1e-4
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


class FP32Head(nn.Linear):
    """The output layer, kept in fp32 inside the bf16 autocast region."""

    def forward(self, h):
        with torch.autocast("cpu", enabled=False):
            return F.linear(h.float(), self.weight, self.bias)


def make_batch(centers, gen):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    return centers[labels] + torch.randn(BATCH, IN_FEATURES, generator=gen), labels


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    if args.variant == "buggy":
        torch._functorch.config.backward_pass_autocast = "same_as_forward"  # BUG: torch 2.13's default; the compiled backward runs under the outer bf16 autocast
    else:
        torch._functorch.config.backward_pass_autocast = "off"  # FIX: the backward runs without autocast, as in eager (PR 177287)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    centers = 2.0 * torch.randn(CLASSES, IN_FEATURES, generator=gen)
    body = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU())
    head = FP32Head(HIDDEN, CLASSES)
    compiled_head = torch.compile(head, backend="aot_eager")
    params = list(body.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_diff = 0.0
    first_bad_step = None
    for step in range(args.steps):
        x, labels = make_batch(centers, gen)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = body(x)
            logits = compiled_head(h)
        loss = F.cross_entropy(logits, labels)
        loss.backward()

        # Reference: the same head run eagerly on the same (detached) features and weights.
        h_ref = h.detach()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits_ref = head(h_ref)
        ref_grad, = torch.autograd.grad(F.cross_entropy(logits_ref, labels), head.weight)
        got = head.weight.grad
        rel_diff = float((got - ref_grad).abs().max() / ref_grad.abs().max().clamp_min(1e-12))
        optimizer.step()

        max_rel_diff = max(max_rel_diff, rel_diff)
        if rel_diff > REL_DIFF_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"acc": acc, "head_grad_rel_diff_vs_eager": rel_diff}})
        if DIFFERENTIAL:
            report({"event": "compare", "step": step, "rank": 0, "quantity": "head_weight_grad",
                    "value": got.reshape(-1)[:32].tolist(), "reference": ref_grad.reshape(-1)[:32].tolist(),
                    "time": time.time()})

    manifested = first_bad_step is not None
    if manifested:
        summary = ("the compiled fp32 head's weight gradient differed from eager from step %d (max rel. diff "
                   "%.3g > %g): its backward ran in bf16" % (first_bad_step, max_rel_diff, REL_DIFF_THRESHOLD))
    else:
        summary = "the compiled head's gradient matched eager at every step (max rel. diff %.2g)" % max_rel_diff
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_rel_diff": max_rel_diff, "threshold": REL_DIFF_THRESHOLD,
                         "first_bad_step": first_bad_step,
                         "backward_pass_autocast": torch._functorch.config.backward_pass_autocast}})


if __name__ == "__main__":
    main()
