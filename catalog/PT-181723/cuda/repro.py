"""SilentBench reproducer for PT-181723 (CUDA): make_graphed_callables corrupts gradient accumulation.

The bug
    ``torch.cuda.make_graphed_callables`` captures a module's forward and backward in CUDA
    graphs. The autograd ``backward`` of the graphed callable returns *detached views of the
    graph's static gradient buffers*. For a parameter whose ``.grad`` is ``None`` (the first
    micro-batch after ``zero_grad(set_to_none=True)``), ``AccumulateGrad`` may install that
    incoming tensor as ``param.grad`` without a copy, so ``.grad`` aliases the static buffer.
    The second micro-batch's replay overwrites the buffer with g2 before ``AccumulateGrad``
    adds g2 in place: the accumulated gradient becomes g2 + g2 instead of g1 + g2. Observed on
    torch 2.11.0a0 / CUDA 13.2 (issue open when catalogued); TransformerEngine fixed its own
    ``make_graphed_callables`` in PR 2937 by cloning parameter gradients.

This program
    A small MLP (16-64-1, tanh) on one GPU is wrapped with the real
    ``torch.cuda.make_graphed_callables`` and trained on a synthetic regression task with SGD
    (momentum 0.9) and gradient accumulation over two micro-batches of fixed shape; every
    step starts with ``optimizer.zero_grad(set_to_none=True)`` and ends with exactly one
    ``optimizer.step()``. The ``buggy`` variant uses the graphed callable as is. The ``fixed``
    variant registers a hook on every parameter that returns ``grad.clone()``: hooks on a leaf
    run before ``AccumulateGrad``, so the tensor it adopts is an owned copy instead of the
    static buffer (the user-side equivalent of cloning in ``Graphed.backward``). Nothing else
    differs.

Oracle (checked inside the single run)
    An eager twin of the MLP (a deep copy made before graphing, re-synchronised with the
    trained weights each step) computes every micro-batch's gradient separately with
    ``torch.autograd.grad``. *Manifested* means that at some step the accumulated
    ``param.grad`` differs from g1 + g2 by more than 5% (relative L2 over all parameters).
    On an affected build the buggy variant gives ``grad == 2 * g2`` at every step.

Trigger step
    0: the first step already accumulates two micro-batches starting from ``.grad = None``.

Requirements
    A CUDA GPU. Without one the program exits with status 2 and a message on stderr (it does
    not pretend to run). The CPU analogue lives in ``catalog/PT-181723/cpu``.
"""
import argparse
import copy
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


def make_batch(teacher, gen, device):
    x = torch.randn(MICRO_BATCH, IN_FEATURES, generator=gen)
    with torch.no_grad():
        y = teacher(x) + 0.05 * torch.randn(MICRO_BATCH, 1, generator=gen)
    return x.to(device), y.to(device)


def flat_norm(tensors):
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-181723/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s). Run catalog/PT-181723/cpu for the CPU analogue.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU, then moved
    teacher = nn.Sequential(nn.Linear(IN_FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))
    model = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    twin = copy.deepcopy(model)  # eager reference, never graphed
    twin_params = list(twin.parameters())
    params = list(model.parameters())

    sample_x = torch.randn(MICRO_BATCH, IN_FEATURES, generator=gen).to(device)
    graphed = torch.cuda.make_graphed_callables(model, (sample_x,))
    if args.variant == "buggy":
        hooks = []  # BUG: param.grad may be installed as an alias of the graph's static grad buffer
    else:
        hooks = [p.register_hook(torch.Tensor.clone) for p in params]  # FIX: AccumulateGrad adopts an owned copy
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_err = 0.0
    first_bad_step = None
    doubled_steps = 0
    for step in range(args.steps):
        batches = [make_batch(teacher, gen, device) for _ in range(MICROBATCHES)]

        with torch.no_grad():
            for t, p in zip(twin_params, params):
                t.copy_(p)
        expected = [torch.zeros_like(p) for p in params]
        last_ref = None
        for x, y in batches:
            ref_loss = F.mse_loss(twin(x), y) / MICROBATCHES
            last_ref = torch.autograd.grad(ref_loss, twin_params)
            expected = [e + g for e, g in zip(expected, last_ref)]

        optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for x, y in batches:
            loss = F.mse_loss(graphed(x), y) / MICROBATCHES
            loss.backward()
            loss_total += loss.item()
        torch.cuda.synchronize()

        grads = [p.grad.detach().clone() for p in params]
        rel_err = flat_norm([g - e for g, e in zip(grads, expected)]) / max(flat_norm(expected), 1e-30)
        doubled = all(torch.allclose(g, 2 * r, rtol=1e-4, atol=1e-6) for g, r in zip(grads, last_ref))

        optimizer.step()

        doubled_steps += int(doubled)
        max_rel_err = max(max_rel_err, rel_err)
        if rel_err > REL_ERR_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss_total, "time": time.time(),
                "metrics": {"accum_grad_rel_err": rel_err, "grad_norm": flat_norm(grads),
                            "expected_grad_norm": flat_norm(expected)}})

    for h in hooks:
        h.remove()
    manifested = first_bad_step is not None
    if manifested:
        summary = ("accumulated grad != g1 + g2 from step %d (max rel. error %.3g); it equals 2*g2 at %d/%d steps"
                   % (first_bad_step, max_rel_err, doubled_steps, args.steps))
    else:
        summary = "accumulated grad == g1 + g2 at every step (max rel. error %.2g)" % max_rel_err
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_rel_err": max_rel_err, "threshold": REL_ERR_THRESHOLD,
                         "first_bad_step": first_bad_step, "steps_grad_equals_2x_g2": doubled_steps,
                         "torch": torch.__version__, "cuda": torch.version.cuda,
                         "gpu": torch.cuda.get_device_name(device)}})


if __name__ == "__main__":
    main()
