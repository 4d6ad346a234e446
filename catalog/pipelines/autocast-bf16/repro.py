"""SilentBench clean reference pipeline: a small MLP trained under CPU bf16 autocast.

What it trains
    A small MLP classifier (Linear(32, 128) -> GELU -> LayerNorm -> Linear(128, 128) -> GELU ->
    Linear(128, 6)) is trained with cross-entropy and ``torch.optim.SGD(lr=0.05, momentum=0.9)``.
    The forward pass and the loss run under ``torch.autocast(device_type="cpu",
    dtype=torch.bfloat16)``: the linear layers compute in bfloat16 while the parameters, their
    gradients and the optimizer state stay in float32 (autocast's mixed precision; bf16 needs
    no gradient scaler). ``loss.backward()`` runs outside the autocast region, as recommended.
    The data are generated from the seed: six Gaussian classes in 32 dimensions whose means
    are passed through a fixed random rotation and a sign-flip nonlinearity, so the classes are
    not linearly trivial. A fresh batch of 64 is drawn every step.

Clean reference
    This program contains no fault. It exists so that invariant-learning detectors can fit on
    correct training code and so that false-positive rates can be measured on it. ``--variant``
    changes nothing: ``buggy`` runs the same clean program. Each step calls ``optimizer.zero_grad()``, runs forward and
    backward, and ends with exactly one ``optimizer.step()``.

Oracle
    *manifested* is true only if training visibly failed: a non-finite loss appeared, or
    (with at least 4 steps) the mean loss of the last quarter of the steps is not below the
    mean of the first quarter. It is false on every seed. There is no fault, so the
    trigger step is null. The dtypes seen under autocast are reported as evidence.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn

DEFAULT_STEPS = 40
TRIGGER_STEP = None  # clean pipeline: no fault is ever active
D_IN = 32
D_HIDDEN = 128
N_CLASSES = 6
BATCH = 64
LR = 0.05
MOMENTUM = 0.9
AUTOCAST_DTYPE = torch.bfloat16


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


def training_failed(losses):
    """(failed, evidence): a non-finite loss, or no decrease from the first to the last quarter."""
    nonfinite = [i for i, value in enumerate(losses) if not math.isfinite(value)]
    quarter = max(1, len(losses) // 4)
    first = sum(losses[:quarter]) / quarter if losses else float("nan")
    last = sum(losses[-quarter:]) / quarter if losses else float("nan")
    trend_judged = len(losses) >= 4  # fewer steps: only a non-finite loss counts as a failure
    no_decrease = trend_judged and not (last < first)
    evidence = {"first_quarter_mean_loss": first, "last_quarter_mean_loss": last,
                "quarter_len": quarter, "trend_judged": trend_judged, "nonfinite_steps": nonfinite[:20],
                "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
    return bool(nonfinite) or no_decrease, evidence


def verdict(manifested, evidence):
    if manifested:
        return "failed"
    return "progressed" if evidence["trend_judged"] else "too short to judge"


def make_task(gen):
    """Class means and a fixed random rotation."""
    means = 0.7 * torch.randn(N_CLASSES, D_IN, generator=gen)
    rotation, _ = torch.linalg.qr(torch.randn(D_IN, D_IN, generator=gen))
    return means, rotation


def make_batch(task, gen, batch=BATCH):
    means, rotation = task
    labels = torch.randint(0, N_CLASSES, (batch,), generator=gen)
    z = means[labels] + torch.randn(batch, D_IN, generator=gen)
    x = z @ rotation
    x = torch.where(z[:, :1] > 0, x, -x)  # sign flip tied to a latent coordinate
    return x, labels


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, D_HIDDEN)
        self.norm = nn.LayerNorm(D_HIDDEN)
        self.fc2 = nn.Linear(D_HIDDEN, D_HIDDEN)
        self.head = nn.Linear(D_HIDDEN, N_CLASSES)
        self.act = nn.GELU()

    def forward(self, x):
        x = self.norm(self.act(self.fc1(x)))
        x = self.act(self.fc2(x))
        return self.head(x)


@torch.no_grad()
def grad_norm(params):
    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum()
    return float(total.sqrt())


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)  # the same either way
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    torch.set_num_threads(1)  # deterministic and light on a shared CPU
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    task = make_task(gen)
    eval_x, eval_labels = make_batch(task, gen, batch=512)

    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    criterion = nn.CrossEntropyLoss()
    model.train()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    losses = []
    dtypes = {}
    for step in range(args.steps):
        x, labels = make_batch(task, gen)
        optimizer.zero_grad()
        with torch.autocast(device_type="cpu", dtype=AUTOCAST_DTYPE):
            logits = model(x)
            loss = criterion(logits, labels)
        loss.backward()
        norm = grad_norm(model.parameters())
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        losses.append(loss.item())
        if not dtypes:
            dtypes = {"logits": str(logits.dtype), "loss": str(loss.dtype),
                      "params": str(model.fc1.weight.dtype), "grads": str(model.fc1.weight.grad.dtype)}
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": losses[-1], "time": time.time(),
                "metrics": {"grad_norm": norm, "lr": lr, "acc": acc}})

    model.eval()
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=AUTOCAST_DTYPE):
        eval_acc = (model(eval_x).argmax(dim=1) == eval_labels).float().mean().item()
    manifested, evidence = training_failed(losses)
    evidence.update({"heldout_acc": eval_acc, "autocast_dtype": str(AUTOCAST_DTYPE), "dtypes": dtypes})
    summary = ("training %s under bf16 autocast: mean loss %.4f over the first quarter, %.4f over the "
               "last; held-out acc %.2f"
               % (verdict(manifested, evidence), evidence["first_quarter_mean_loss"],
                  evidence["last_quarter_mean_loss"], eval_acc))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
