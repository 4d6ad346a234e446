"""SilentBench reproducer for PT-FORUM-19117: reentrant checkpointing of a block whose input needs no grad freezes the block.

The bug
    ``torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=True)`` runs ``fn`` under
    ``no_grad`` and connects it to the graph through its tensor inputs only. When no input
    requires grad (the block sits right after a frozen embedding, or takes the data itself),
    the output does not require grad either: the block's own parameters get no gradient,
    ``optimizer.step()`` skips them, and training carries on with a randomly initialised
    block. Only a ``UserWarning`` ("None of the inputs have requires_grad=True") is printed
    (PyTorch forum thread 19117; HuggingFace issue 21381 for frozen embeddings + gradient
    checkpointing; still the documented behaviour of the reentrant variant on torch 2.13).

This program
    A text classifier: a frozen, "pretrained" embedding table (``requires_grad=False``), mean
    pooling, two checkpointed residual MLP blocks and a linear head, trained with AdamW
    (lr 1e-3) and cross-entropy on synthetic token sequences. The ``buggy`` variant
    checkpoints the blocks with ``use_reentrant=True``; the ``fixed`` variant with
    ``use_reentrant=False`` (the fix the documentation and the threads recommend), which is
    exact recomputation. Nothing else differs.

Oracle (checked inside the single run)
    The blocks' parameters, which require grad and are in the optimizer, are copied before
    training; *manifested* means none of them changed by the end although ``optimizer.step()``
    ran every step. The head's change and the number of block parameters with a gradient are
    evidence.

Trigger step
    0: the first backward already leaves the blocks without gradients.
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
from torch.utils.checkpoint import checkpoint

DEFAULT_STEPS = 20
TRIGGER_STEP = 0
VOCAB = 200
EMBED = 32
SEQ = 12
BATCH = 32
CLASSES = 4
LR = 1e-3


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


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(EMBED), nn.Linear(EMBED, 64), nn.GELU(), nn.Linear(64, EMBED))

    def forward(self, h):
        return h + self.net(h)


class Classifier(nn.Module):
    def __init__(self, use_reentrant):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.embed.weight.requires_grad_(False)  # frozen pretrained embeddings
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(EMBED, CLASSES)

    def forward(self, tokens):
        h = self.embed(tokens).mean(dim=1)  # does not require grad: the embedding is frozen
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=self.use_reentrant)
        return self.head(h)


def make_batch(class_tokens, gen):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    noise = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    keep = torch.rand(BATCH, SEQ, generator=gen) < 0.5
    signal = class_tokens[labels][:, torch.randint(0, class_tokens.shape[1], (SEQ,), generator=gen)]
    return torch.where(keep, signal, noise), labels


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    class_tokens = torch.randperm(VOCAB, generator=gen)[: CLASSES * 10].view(CLASSES, 10)
    if args.variant == "buggy":
        model = Classifier(use_reentrant=True)  # BUG: reentrant checkpoint; no input requires grad, so the blocks get no grad
    else:
        model = Classifier(use_reentrant=False)  # FIX: non-reentrant checkpoint records the blocks' parameters
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    block_before = [p.detach().clone() for p in model.blocks.parameters()]
    head_before = [p.detach().clone() for p in model.head.parameters()]

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    block_params_with_grad = 0
    for step in range(args.steps):
        tokens, labels = make_batch(class_tokens, gen)
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        with_grad = sum(p.grad is not None for p in model.blocks.parameters())
        block_params_with_grad = max(block_params_with_grad, with_grad)
        optimizer.step()
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"acc": acc, "block_params_with_grad": float(with_grad)}})

    block_delta = max(float((p.detach() - b).abs().max()) for p, b in zip(model.blocks.parameters(), block_before))
    head_delta = max(float((p.detach() - b).abs().max()) for p, b in zip(model.head.parameters(), head_before))
    manifested = block_delta == 0.0
    if manifested:
        summary = ("the checkpointed blocks never changed over %d optimizer steps (head moved by %.3g): "
                   "they received no gradient" % (args.steps, head_delta))
    else:
        summary = "the checkpointed blocks trained (max |delta| %.3g)" % block_delta
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"block_max_delta": block_delta, "head_max_delta": head_delta,
                         "block_params_with_grad": block_params_with_grad,
                         "block_params": len(block_before)}})


if __name__ == "__main__":
    main()
