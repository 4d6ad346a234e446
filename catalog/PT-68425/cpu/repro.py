"""SilentBench reproducer for PT-68425: torch.where turns the gradient of an inactive overflowing branch into NaN.

The bug
    ``torch.where(cond, a, b)`` evaluates both branches. Its backward sends a zero gradient to
    the branch that was not selected, and autograd multiplies that zero by the branch's local
    derivative. Where the unselected branch overflowed (``exp`` of a large number is ``inf``),
    ``0 * inf`` is NaN, so the input's gradient is NaN although the forward value is finite
    and correct (issue 68425: ``torch.where(a <= 0, torch.exp(a), 1 + a)`` gives ``a.grad ==
    nan`` at ``a = 100``; still the behaviour on torch 2.13, documented as a pitfall).

This program
    An MLP regressor whose hidden activation is written, as in the issue, as
    ``torch.where(a <= 0, torch.exp(a), 1 + a)`` (smooth at 0: value 1 and slope 1 on both
    sides). Its inputs are raw, unnormalised sensor readings with a few large channels, so
    some pre-activations exceed 88.7 (where float32 ``exp`` overflows) from the first steps;
    the forward value there is the finite ``1 + a``. Adam (lr 1e-3), MSE, batch 64. The
    ``buggy`` variant uses the issue's expression; the ``fixed`` variant the workaround given
    in the thread (mask the input of the unsafe branch: ``torch.exp(torch.where(a <= 0, a,
    0))``), which computes exactly the same forward values. Nothing else differs.

Oracle (checked inside the single run)
    *Manifested* means the training loss became non-finite at some step (the user-visible
    symptom: a NaN gradient poisons the weights at the first overflow, and every later loss is
    NaN). The count of NaN gradient entries at the first overflow step is evidence.

Trigger step
    The first step at which some pre-activation exceeds log(float32 max) = 88.72: before it
    both variants compute the same values. It depends on the seed's data and is the same for
    both variants of a seed (they are identical until then); the program reports it.
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
BATCH = 64
IN_FEATURES = 12
HIDDEN = 64
LR = 1e-3
EXP_OVERFLOW = math.log(torch.finfo(torch.float32).max)  # 88.72
# per-channel scale of the raw readings: most channels are O(1), a few are large counters
CHANNEL_SCALE = torch.tensor([1.0, 1.0, 2.0, 1.0, 5.0, 1.0, 1.0, 300.0, 1.0, 3.0, 1.0, 500.0])


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


class ExpLinearMLP(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.variant = variant
        self.fc1 = nn.Linear(IN_FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, 1)
        self.max_preact = 0.0

    def act(self, a):
        self.max_preact = max(self.max_preact, float(a.detach().max()))
        if self.variant == "buggy":
            return torch.where(a <= 0, torch.exp(a), 1 + a)  # BUG: exp(a) overflows where a > 88.7; its zero gradient times inf is NaN
        return torch.where(a <= 0, torch.exp(torch.where(a <= 0, a, 0.0)), 1 + a)  # FIX: mask the unsafe branch's input

    def forward(self, x):
        return self.out(self.act(self.fc2(self.act(self.fc1(x)))))


def make_batch(w_true, gen):
    z = torch.randn(BATCH, IN_FEATURES, generator=gen)
    y = torch.tanh(z @ w_true).unsqueeze(1) + 0.05 * torch.randn(BATCH, 1, generator=gen)
    return z.abs() * CHANNEL_SCALE, y  # raw, unnormalised readings (non-negative)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    w_true = torch.randn(IN_FEATURES, generator=gen) / math.sqrt(IN_FEATURES)
    model = ExpLinearMLP(args.variant)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    first_overflow_step = None
    first_nonfinite_loss_step = None
    nan_grad_entries_at_overflow = None
    losses = []
    for step in range(args.steps):
        x, y = make_batch(w_true, gen)
        optimizer.zero_grad(set_to_none=True)
        model.max_preact = 0.0
        loss = F.mse_loss(model(x), y)
        loss.backward()
        # A detector that stops backward (detect_anomaly) leaves the gradients None: nothing to count then.
        nan_grads = sum(int(torch.isnan(p.grad).sum()) for p in model.parameters() if p.grad is not None)
        optimizer.step()

        value = loss.item()
        losses.append(value)
        if first_overflow_step is None and model.max_preact > EXP_OVERFLOW:
            first_overflow_step = step
            nan_grad_entries_at_overflow = nan_grads
        if first_nonfinite_loss_step is None and not math.isfinite(value):
            first_nonfinite_loss_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": value, "time": time.time(),
                "metrics": {"max_preactivation": model.max_preact, "nan_grad_entries": float(nan_grads)}})

    manifested = first_nonfinite_loss_step is not None
    if manifested:
        summary = ("loss became non-finite at step %d after a pre-activation passed %.1f at step %s: "
                   "the unselected exp branch of torch.where sent NaN into the gradients"
                   % (first_nonfinite_loss_step, EXP_OVERFLOW, first_overflow_step))
    else:
        finite = [v for v in losses if math.isfinite(v)]
        summary = "loss stayed finite over %d steps (first %.3f, last %.3f)" % (len(losses), finite[0], finite[-1])
    report({"event": "oracle", "manifested": manifested,
            "trigger_step": first_overflow_step if first_overflow_step is not None else 0,
            "summary": summary,
            "evidence": {"first_overflow_step": first_overflow_step,
                         "first_nonfinite_loss_step": first_nonfinite_loss_step,
                         "nan_grad_entries_at_overflow": nan_grad_entries_at_overflow,
                         "exp_overflow_threshold": EXP_OVERFLOW}})


if __name__ == "__main__":
    main()
