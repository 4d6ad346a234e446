"""SilentBench reproducer for PT-181723 (CPU analogue): a static gradient buffer becomes param.grad.

The bug
    ``torch.cuda.make_graphed_callables`` captures the backward pass in a CUDA graph whose
    outputs live in static buffers. Its autograd ``backward`` hands those buffers back as
    detached views. When a parameter's ``.grad`` is ``None`` (the first micro-batch after
    ``zero_grad(set_to_none=True)``), ``AccumulateGrad`` may adopt the incoming tensor as
    ``param.grad`` without copying it, so ``.grad`` now *is* the static buffer. The next graph
    replay overwrites that buffer with the second micro-batch's gradient g2 and then
    ``AccumulateGrad`` adds g2 onto it in place: the accumulated gradient is g2 + g2 instead of
    g1 + g2. No error, no warning; the optimizer steps with a wrong gradient every iteration.

This program
    The CUDA graph is not needed to hit the aliasing: the part that goes wrong is PyTorch's
    real ``AccumulateGrad`` on CPU. ``StaticGradCallable`` stands in for the graphed callable:
    a custom ``torch.autograd.Function`` whose backward recomputes the gradients of a small
    MLP (16-64-1, tanh), writes them into persistent per-parameter buffers allocated once (the
    "replay" of a captured backward) and returns them to autograd. The ``buggy`` variant
    returns detached views of those buffers, exactly as ``make_graphed_callables`` does; the
    ``fixed`` variant returns owned clones (the fix direction of the report and of
    TransformerEngine PR 2937). Nothing else differs. The MLP is trained on a synthetic
    regression task with SGD (momentum 0.9) and gradient accumulation over two micro-batches;
    ``optimizer.zero_grad(set_to_none=True)`` runs before each step, and each step ends with
    exactly one ``optimizer.step()``.

Oracle (checked inside the single run)
    For every step the program also computes the gradient of each micro-batch separately
    with plain autograd on the same module (``torch.autograd.grad``, which never touches
    ``.grad``) and compares the accumulated ``param.grad`` with g1 + g2:
    ``rel_err = ||grad - (g1 + g2)|| / ||g1 + g2||`` over all parameters. *Manifested* means
    ``rel_err`` exceeded 0.05 at some step. In the fixed variant it stays at float rounding
    (~1e-7); in the buggy one it is of order 1, and ``grad == 2 * g2`` holds.

Trigger step
    0: the very first step accumulates two micro-batches, and ``.grad`` is ``None`` before it.
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

DEFAULT_STEPS = 20
TRIGGER_STEP = 0
MICROBATCHES = 2
MICRO_BATCH = 32
IN_FEATURES = 16
LR = 0.05
REL_ERR_THRESHOLD = 0.05


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


class _ReplayFunction(torch.autograd.Function):
    """Forward/backward of the wrapped module, with gradients delivered through static buffers."""

    @staticmethod
    def forward(ctx, owner, x, *params):
        ctx.owner = owner
        ctx.save_for_backward(x)
        return owner.module(x)  # grad mode is off inside Function.forward

    @staticmethod
    def backward(ctx, grad_out):
        owner = ctx.owner
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            leaves = {name: p.detach().requires_grad_(True) for name, p in owner.named_params}
            out = torch.func.functional_call(owner.module, leaves, (x,))
            grads = torch.autograd.grad(out, list(leaves.values()), grad_out)
        # "Replay" of the captured backward: results land in the same buffers every time.
        for buf, g in zip(owner.static_grads, grads):
            buf.copy_(g)
        if owner.variant == "buggy":
            returned = [buf.detach() for buf in owner.static_grads]  # BUG: aliases of the static buffers go to AccumulateGrad
        else:
            returned = [buf.clone() for buf in owner.static_grads]  # FIX: hand autograd owned copies
        return (None, None) + tuple(returned)


class StaticGradCallable:
    """CPU stand-in for the callable returned by torch.cuda.make_graphed_callables(module, ...)."""

    def __init__(self, module, variant):
        self.module = module
        self.variant = variant
        self.named_params = list(module.named_parameters())
        self.static_grads = [torch.zeros_like(p) for _, p in self.named_params]  # allocated once, like graph outputs

    def __call__(self, x):
        return _ReplayFunction.apply(self, x, *[p for _, p in self.named_params])


def make_batch(teacher, gen):
    x = torch.randn(MICRO_BATCH, IN_FEATURES, generator=gen)
    with torch.no_grad():
        y = teacher(x) + 0.05 * torch.randn(MICRO_BATCH, 1, generator=gen)
    return x, y


def flat_norm(tensors):
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared CPU

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    teacher = nn.Sequential(nn.Linear(IN_FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))
    model = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))
    graphed = StaticGradCallable(model, args.variant)
    params = [p for _, p in graphed.named_params]
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_err = 0.0
    first_bad_step = None
    aliased_steps = 0
    doubled_steps = 0
    for step in range(args.steps):
        batches = [make_batch(teacher, gen) for _ in range(MICROBATCHES)]

        # Reference: each micro-batch's gradient on its own, with plain autograd.
        expected = [torch.zeros_like(p) for p in params]
        last_ref = None
        for x, y in batches:
            ref_loss = F.mse_loss(model(x), y) / MICROBATCHES
            last_ref = torch.autograd.grad(ref_loss, params)
            expected = [e + g for e, g in zip(expected, last_ref)]

        optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for x, y in batches:
            loss = F.mse_loss(graphed(x), y) / MICROBATCHES
            loss.backward()
            loss_total += loss.item()

        grads = [p.grad.detach().clone() for p in params]
        aliased = any(p.grad.data_ptr() == b.data_ptr() for p, b in zip(params, graphed.static_grads))
        rel_err = flat_norm([g - e for g, e in zip(grads, expected)]) / max(flat_norm(expected), 1e-30)
        doubled = all(torch.allclose(g, 2 * r, rtol=1e-5, atol=1e-7) for g, r in zip(grads, last_ref))

        optimizer.step()

        aliased_steps += int(aliased)
        doubled_steps += int(doubled)
        max_rel_err = max(max_rel_err, rel_err)
        if rel_err > REL_ERR_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss_total, "time": time.time(),
                "metrics": {"accum_grad_rel_err": rel_err, "grad_norm": flat_norm(grads),
                            "expected_grad_norm": flat_norm(expected),
                            "grad_aliases_static_buffer": float(aliased)}})

    manifested = first_bad_step is not None
    if manifested:
        summary = ("accumulated grad != g1 + g2 from step %d (max rel. error %.3g); it equals 2*g2 at "
                   "%d/%d steps and aliases the static buffer at %d"
                   % (first_bad_step, max_rel_err, doubled_steps, args.steps, aliased_steps))
    else:
        summary = "accumulated grad == g1 + g2 at every step (max rel. error %.2g)" % max_rel_err
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_rel_err": max_rel_err, "threshold": REL_ERR_THRESHOLD,
                         "first_bad_step": first_bad_step,
                         "steps_grad_equals_2x_g2": doubled_steps,
                         "steps_grad_aliases_static_buffer": aliased_steps,
                         "microbatches": MICROBATCHES}})


if __name__ == "__main__":
    main()
