"""SilentBench clean reference pipeline: a tiny Transformer encoder trained with AdamW and an LR schedule.

What it trains
    A tiny Transformer (token + learned position embeddings, ``nn.TransformerEncoder`` with 2
    layers, d_model 32, 4 heads, feed-forward 64, dropout 0.1, mean pooling and a linear head)
    classifies token sequences with cross-entropy and ``torch.optim.AdamW(lr=3e-3,
    weight_decay=0.01)``. The learning rate follows ``torch.optim.lr_scheduler.LambdaLR``:
    linear warmup over the first 10% of the steps (starting at 1/warmup of the peak, never 0),
    then cosine decay to 10% of the peak at the last step, so the LR is never 0. The data are
    generated from the seed: four classes, each with its own token distribution over a
    16-token vocabulary; a sequence of 16 tokens is drawn from its class's distribution.
    A fresh batch of 32 sequences is drawn every step.

Clean reference
    This program contains no fault. It exists so that invariant-learning detectors can fit on
    correct training code and so that false-positive rates can be measured on it. ``--variant``
    changes nothing: ``buggy`` runs the same clean program. Each step calls ``optimizer.zero_grad()``, runs forward and
    backward, ends with exactly one ``optimizer.step()`` and then advances the scheduler.

Oracle
    *manifested* is true only if training visibly failed: a non-finite loss appeared, or
    (with at least 4 steps) the mean loss of the last quarter of the steps is not below the
    mean of the first quarter. It is false on every seed. There is no fault, so the
    trigger step is null.
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
VOCAB = 16
SEQ_LEN = 16
N_CLASSES = 4
D_MODEL = 32
N_HEADS = 4
D_FF = 64
N_LAYERS = 2
DROPOUT = 0.1
BATCH = 32
LR = 3e-3
WEIGHT_DECAY = 0.01
WARMUP_FRACTION = 0.1
MIN_LR_FACTOR = 0.1


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


def make_class_distributions(gen):
    """One token distribution per class over the vocabulary."""
    return torch.softmax(1.5 * torch.randn(N_CLASSES, VOCAB, generator=gen), dim=1)


def make_batch(distributions, gen, batch=BATCH):
    labels = torch.randint(0, N_CLASSES, (batch,), generator=gen)
    tokens = torch.multinomial(distributions[labels], SEQ_LEN, replacement=True, generator=gen)
    return tokens, labels


def lr_factor(step, total_steps):
    """Linear warmup, then cosine decay to MIN_LR_FACTOR; always strictly positive."""
    warmup = max(1, round(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return MIN_LR_FACTOR + (1.0 - MIN_LR_FACTOR) * 0.5 * (1.0 + math.cos(math.pi * progress))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, SEQ_LEN, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, N_HEADS, dim_feedforward=D_FF, dropout=DROPOUT,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=N_LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, N_CLASSES)

    def forward(self, tokens):
        x = self.token_embed(tokens) + self.pos_embed[:, : tokens.shape[1]]
        x = self.encoder(x)
        return self.head(x.mean(dim=1))


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
    distributions = make_class_distributions(gen)
    eval_tokens, eval_labels = make_batch(distributions, gen, batch=256)

    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, args.steps))
    criterion = nn.CrossEntropyLoss()
    model.train()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    losses = []
    lrs = []
    for step in range(args.steps):
        tokens, labels = make_batch(distributions, gen)
        optimizer.zero_grad()
        logits = model(tokens)
        loss = criterion(logits, labels)
        loss.backward()
        norm = grad_norm(model.parameters())
        lr = optimizer.param_groups[0]["lr"]  # the LR this step uses
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        lrs.append(lr)
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": losses[-1], "time": time.time(),
                "metrics": {"grad_norm": norm, "lr": lr, "acc": acc}})

    model.eval()
    with torch.no_grad():
        eval_acc = (model(eval_tokens).argmax(dim=1) == eval_labels).float().mean().item()
    manifested, evidence = training_failed(losses)
    evidence.update({"heldout_acc": eval_acc, "min_lr": min(lrs) if lrs else None,
                     "max_lr": max(lrs) if lrs else None})
    summary = ("training %s: mean loss %.4f over the first quarter, %.4f over the last; held-out acc %.2f"
               % (verdict(manifested, evidence), evidence["first_quarter_mean_loss"],
                  evidence["last_quarter_mean_loss"], eval_acc))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
