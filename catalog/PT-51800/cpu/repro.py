"""SilentBench reproducer for PT-51800: legacy spectral_norm used in eval() before any train-mode forward.

The bug
    The hook-based ``torch.nn.utils.spectral_norm`` divides a layer's weight by an estimate
    sigma = u^T W v of its largest singular value. The vectors u and v start as random unit
    vectors and are refined by power iteration, but only in a forward pass in *training* mode
    (the documented "initialisation on the first forward" also happens only then). If the
    module is switched to ``eval()`` before it ever ran a train-mode forward, sigma comes from
    the random u and v: it is typically tens to hundreds of times too small, so the weight is
    hugely over-scaled and layer outputs are orders of magnitude too large (about 1000x in
    the issue). Nothing warns. The parametrization-based
    ``torch.nn.utils.parametrizations.spectral_norm`` fixed this, but the legacy function
    keeps the old behaviour in torch 2.13.

This program
    A spectrally normalised MLP regressor (32-256-256-1, LeakyReLU, dropout; every Linear
    wrapped with the legacy ``spectral_norm``) is built, evaluated once on a validation
    batch, and then fine-tuned with the model kept in ``eval()`` mode (dropout off, a common
    fine-tuning choice) with Adam(lr=1e-3) on a synthetic regression task. The ``buggy``
    variant calls ``model.eval()`` right after construction; the ``fixed`` variant first runs
    one forward in train mode on the validation batch (the workaround from the issue), then
    calls ``model.eval()``. Nothing else differs. Each step ends with exactly one
    ``optimizer.step()``.

Oracle (checked inside the single run: the symptom of the issue, outputs far too large)
    Every step the program also computes what the network should output: the same layers
    with each weight divided by its exact largest singular value
    (``torch.linalg.matrix_norm(weight, ord=2)``), on the same batch. *Manifested* means the
    network's output norm was more than 5 times that expectation at some step. With one
    power iteration (fixed variant) the ratio stays at 1.2-1.8 (seeds 0-7); with the random
    u and v it is 34 to 7e6. The cause is reported as evidence: the largest singular value
    of each effective weight (about 1.0-1.5 when fixed, tens to hundreds with random u, v).

Trigger step
    0: the very first training forward already uses the random u and v.
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
BATCH = 128
IN_FEATURES = 32
LR = 1e-3
OUTPUT_RATIO_THRESHOLD = 5.0  # output norm / the correctly normalised network's output norm


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


def build_model():
    sn = nn.utils.spectral_norm  # the legacy, hook-based implementation
    return nn.Sequential(
        sn(nn.Linear(IN_FEATURES, 256)), nn.LeakyReLU(0.2), nn.Dropout(0.1),
        sn(nn.Linear(256, 256)), nn.LeakyReLU(0.2), nn.Dropout(0.1),
        sn(nn.Linear(256, 1)),
    )


def make_batch(teacher, gen):
    x = torch.randn(BATCH, IN_FEATURES, generator=gen)
    with torch.no_grad():
        y = teacher(x)
    return x, y


def effective_sigmas(linears):
    """Exact largest singular value of each effective (normalised) weight of the last forward."""
    return [float(torch.linalg.matrix_norm(m.weight.detach(), ord=2)) for m in linears]


@torch.no_grad()
def expected_output(model, x):
    """The network's output with every weight divided by its exact largest singular value."""
    h = x
    for module in model:
        if isinstance(module, nn.Linear):
            w = module.weight_orig
            h = F.linear(h, w / torch.linalg.matrix_norm(w, ord=2), module.bias)
        elif isinstance(module, nn.Dropout):
            continue  # eval mode
        else:
            h = module(h)
    return h


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared CPU

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    teacher = nn.Sequential(nn.Linear(IN_FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
    model = build_model()
    linears = [m for m in model if isinstance(m, nn.Linear)]
    val_x, val_y = make_batch(teacher, gen)

    if args.variant == "buggy":
        pass  # BUG: no train-mode forward before eval(): power iteration never runs, u and v stay random
    else:
        with torch.no_grad():
            model.train()(val_x)  # FIX: one train-mode forward first (the workaround) initialises u and v
    model.eval()
    with torch.no_grad():
        val_loss = F.mse_loss(model(val_x), val_y).item()  # baseline evaluation before fine-tuning

    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_sigma = 0.0
    max_ratio = 0.0
    first_bad_step = None
    step0 = {}
    for step in range(args.steps):
        x, y = make_batch(teacher, gen)
        optimizer.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.mse_loss(out, y)
        sigmas = effective_sigmas(linears)
        expected = expected_output(model, x)
        ratio = float(out.detach().norm() / expected.norm().clamp_min(1e-30))
        if step == 0:
            step0 = {"sigmas": sigmas, "output_norm": float(out.detach().norm()),
                     "expected_output_norm": float(expected.norm())}
        loss.backward()
        optimizer.step()

        step_max = max(sigmas) if all(math.isfinite(s) for s in sigmas) else math.inf
        max_sigma = max(max_sigma, step_max)
        ratio = ratio if math.isfinite(ratio) else math.inf
        max_ratio = max(max_ratio, ratio)
        if ratio > OUTPUT_RATIO_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"max_weight_sigma": step_max, "output_to_expected_norm": ratio,
                            "output_to_input_norm": float(out.detach().norm() / x.norm())}})

    manifested = first_bad_step is not None
    if manifested:
        summary = ("outputs more than %.3gx larger than the correctly normalised network's from step %d (up to %.3g); "
                   "largest singular value of an effective weight up to %.3g (expected ~1)"
                   % (OUTPUT_RATIO_THRESHOLD, first_bad_step, max_ratio, max_sigma))
    else:
        summary = ("outputs within %.3gx of the correctly normalised network's (largest singular value <= %.3g)"
                   % (max_ratio, max_sigma))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_output_ratio": max_ratio, "threshold": OUTPUT_RATIO_THRESHOLD,
                         "first_bad_step": first_bad_step, "max_weight_sigma": max_sigma,
                         "step0_layer_sigmas": step0.get("sigmas"),
                         "step0_output_norm": step0.get("output_norm"),
                         "step0_expected_output_norm": step0.get("expected_output_norm"),
                         "baseline_val_loss": val_loss}})


if __name__ == "__main__":
    main()
