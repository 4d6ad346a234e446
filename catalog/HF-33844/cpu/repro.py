"""SilentBench reproducer for HF-33844: attention dropout passed to the fused kernel stays on in eval mode, so validation scores a randomly thinned model.

The bug
    M2M100FlashAttention2 (and the FlashAttention-2 classes copied from Bart's) called the
    fused kernel with ``dropout_p=self.dropout`` whatever the mode. The kernel, like
    ``F.scaled_dot_product_attention``, drops attention weights whenever ``dropout_p > 0``:
    ``model.eval()`` switches the ``nn.Dropout`` modules off but not this argument, so every
    evaluation runs with attention dropout on (transformers PR 33844, Oct 2024; the same
    pattern: PyTorch issue 124464, timm PR 1978).

This program (injected: the attention class before and after the fix)
    A one-layer transformer encoder classifier (vocabulary 64, width 32, 4 heads, attention
    and hidden dropout 0.1 as in M2M100's config, mean pooling, linear head) learns synthetic
    token sequences whose class shows in some of their tokens; AdamW (lr 1e-3), cross-entropy,
    batch 32. After every step it is validated in eval mode on 64 held-out sequences, as a
    Trainer evaluates. Attention goes through ``F.scaled_dot_product_attention``; the
    ``buggy`` variant passes ``dropout_p=self.dropout``, the ``fixed`` one ``self.dropout if
    self.training else 0.0`` (PR 33844). Nothing else differs.

Oracle (checked inside the single run)
    Each validation is repeated with the attention dropout explicitly set to 0, the model a
    user means to evaluate. *Manifested* means the two validation losses differ by more than
    1e-4 (relative) at some step. Under ``SILENTBENCH_DIFFERENTIAL=1`` every step also reports
    the logits of 16 validation sequences, both ways, as a ``compare`` record.

Trigger step
    0: the validation after the first step already runs with attention dropout.
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
VOCAB = 64
WIDTH = 32
HEADS = 4
SEQ = 16
CLASSES = 4
BATCH = 32
VALIDATION = 64
DROPOUT = 0.1
ATTENTION_DROPOUT = 0.1
LR = 1e-3
REL_DIFF_THRESHOLD = 1e-4
COMPARED_SEQUENCES = 16  # the compare record's logits: 16 sequences x 4 classes, within its 64 values
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


class FusedSelfAttention(nn.Module):
    """Self-attention through the fused kernel, as the FlashAttention-2 classes call it."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.dropout = ATTENTION_DROPOUT
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, h):
        batch, seq, _ = h.shape
        q, k, v = self.qkv(h).view(batch, seq, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        if self.fixed:
            dropout_p = self.dropout if self.training else 0.0  # FIX: no attention dropout in eval mode (PR 33844)
        else:
            dropout_p = self.dropout  # BUG: the kernel drops whenever dropout_p > 0, whatever model.eval() said
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        return self.out(attended.transpose(1, 2).reshape(batch, seq, WIDTH))


class Classifier(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(0.02 * torch.randn(SEQ, WIDTH))
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attention = FusedSelfAttention(fixed)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.ffn = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
        self.drop = nn.Dropout(DROPOUT)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens):
        h = self.embed(tokens) + self.position
        h = h + self.drop(self.attention(self.norm1(h)))
        h = h + self.drop(self.ffn(self.norm2(h)))
        return self.head(h.mean(dim=1))


def make_batch(class_tokens, size, gen):
    labels = torch.randint(0, CLASSES, (size,), generator=gen)
    noise = torch.randint(0, VOCAB, (size, SEQ), generator=gen)
    keep = torch.rand(size, SEQ, generator=gen) < 0.3
    signal = class_tokens[labels][:, torch.randint(0, class_tokens.shape[1], (SEQ,), generator=gen)]
    return torch.where(keep, signal, noise), labels


@torch.no_grad()
def validate(model, batch):
    """Loss, accuracy and logits on the validation batch."""
    tokens, labels = batch
    logits = model(tokens)
    return F.cross_entropy(logits, labels).item(), (logits.argmax(dim=1) == labels).float().mean().item(), logits


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    class_tokens = torch.randperm(VOCAB, generator=gen)[: CLASSES * 6].view(CLASSES, 6)
    held_out = make_batch(class_tokens, VALIDATION, gen)

    model = Classifier(fixed=args.variant == "fixed")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_diff = 0.0
    first_bad_step = None
    for step in range(args.steps):
        model.train()
        tokens, labels = make_batch(class_tokens, BATCH, gen)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        optimizer.step()

        model.eval()
        val_loss, val_acc, val_logits = validate(model, held_out)
        model.attention.dropout = 0.0  # the reference: the same weights with attention dropout off
        reference_loss, _, reference_logits = validate(model, held_out)
        model.attention.dropout = ATTENTION_DROPOUT
        rel_diff = abs(val_loss - reference_loss) / reference_loss
        max_rel_diff = max(max_rel_diff, rel_diff)
        if rel_diff > REL_DIFF_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"val_loss": val_loss, "val_acc": val_acc,
                            "val_loss_without_attention_dropout": reference_loss}})
        if DIFFERENTIAL:
            report({"event": "compare", "step": step, "rank": 0, "quantity": "val_logits",
                    "value": val_logits[:COMPARED_SEQUENCES].reshape(-1).tolist(),
                    "reference": reference_logits[:COMPARED_SEQUENCES].reshape(-1).tolist(), "time": time.time()})

    manifested = first_bad_step is not None
    if manifested:
        summary = ("eval-mode validation differed from the same weights without attention dropout from step %d "
                   "(max rel. diff %.3g > %g): attention dropout stays on in eval" % (
                       first_bad_step, max_rel_diff, REL_DIFF_THRESHOLD))
    else:
        summary = "eval-mode validation matched the dropout-free model at every step (max rel. diff %.2g)" % (
            max_rel_diff)
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_rel_diff": max_rel_diff, "threshold": REL_DIFF_THRESHOLD,
                         "first_bad_step": first_bad_step, "attention_dropout": ATTENTION_DROPOUT}})


if __name__ == "__main__":
    main()
