"""SilentBench reproducer for HF-34191: gradient accumulation averages the micro-batches' token means, so training differs from the full batch it stands for.

The bug
    Before transformers 4.46 a model's default loss was the mean cross-entropy over the
    non-padded tokens of its own forward pass, and the Trainer divided it by
    ``gradient_accumulation_steps`` before ``backward()``. Over an accumulation window that is
    the mean of the micro-batches' token means: with variable-length sequences a token of a
    short micro-batch weighs more than a token of a long one, and the run is no longer the
    full-batch run it stands for; its logged loss and its model differ (PR 34191, and the
    Hugging Face blog post "Fixing Gradient Accumulation", Oct 2024).

This program (injected: the Trainer's loss scaling, before and after the fix)
    A small causal language model (48-token vocabulary, embedding 32, MLP 32 -> 64 -> 48, each
    position predicting the next token) learns synthetic Markov-chain sequences of 4 to 60
    tokens, padded with label -100. Each optimizer step (AdamW, lr 3e-3) accumulates 4
    micro-batches of 2 sequences, each padded to its own length as a collator does. The
    ``buggy`` variant backpropagates each micro-batch's mean token loss divided by the number
    of micro-batches (the old Trainer); the ``fixed`` variant its summed token loss divided by
    the number of label tokens in the whole window (``num_items_in_batch``, PR 34191). Nothing
    else differs.

Oracle (checked inside the single run)
    A copy of the model with the same initial weights trains in lockstep on the same 8
    sequences as one batch (mean token cross-entropy, the same AdamW update written out by
    hand so that the run keeps one ``torch.optim`` optimizer): the run gradient accumulation
    is meant to equal. *Manifested* means the logged loss of some step differs from the copy's
    by more than 1e-3 (relative), the comparison of the blog post. The largest parameter
    difference between the two models is evidence. Under ``SILENTBENCH_DIFFERENTIAL=1`` every
    step also reports both losses as a ``compare`` record.

Trigger step
    0: the first accumulated gradient is already weighted wrongly.
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
VOCAB = 48
EMBED = 32
HIDDEN = 64
MIN_LEN, MAX_LEN = 4, 60
MICRO_BATCHES = 4
MICRO_BATCH_SIZE = 2
LR = 3e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01
REL_LOSS_THRESHOLD = 1e-3
IGNORE = -100
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


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.mlp = nn.Sequential(nn.Linear(EMBED, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, VOCAB))

    def forward(self, tokens):
        return self.mlp(self.embed(tokens))


def make_sequences(transitions, count, gen):
    sequences = []
    for _ in range(count):
        length = int(torch.randint(MIN_LEN, MAX_LEN + 1, (1,), generator=gen))
        seq = [int(torch.randint(0, VOCAB, (1,), generator=gen))]
        for _ in range(length - 1):
            seq.append(int(torch.multinomial(transitions[seq[-1]], 1, generator=gen)))
        sequences.append(torch.tensor(seq))
    return sequences


def collate(sequences):
    """Inputs and next-token labels, padded to the longest sequence (labels with -100)."""
    width = max(len(s) for s in sequences) - 1
    inputs = torch.zeros(len(sequences), width, dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE, dtype=torch.long)
    for i, s in enumerate(sequences):
        inputs[i, :len(s) - 1] = s[:-1]
        labels[i, :len(s) - 1] = s[1:]
    return inputs, labels


def token_loss(model, batch, reduction):
    inputs, labels = batch
    return F.cross_entropy(model(inputs).reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE,
                           reduction=reduction)


class HandAdamW:
    """torch.optim.AdamW's update (single-tensor form) for the reference copy."""

    def __init__(self, params):
        self.params = list(params)
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads):
        self.t += 1
        beta1, beta2 = BETAS
        correction1, correction2 = 1 - beta1 ** self.t, 1 - beta2 ** self.t
        for p, g, (m, v) in zip(self.params, grads, self.moments):
            p.mul_(1 - LR * WEIGHT_DECAY)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / math.sqrt(correction2)).add_(EPS)
            p.addcdiv_(m, denom, value=-LR / correction1)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    transitions = F.softmax(3.0 * torch.randn(VOCAB, VOCAB, generator=gen), dim=1)

    model = TinyLM()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    reference_update = HandAdamW(reference.parameters())

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_diff = 0.0
    first_bad_step = None
    for step in range(args.steps):
        sequences = make_sequences(transitions, MICRO_BATCHES * MICRO_BATCH_SIZE, gen)
        micro_batches = [collate(sequences[i:i + MICRO_BATCH_SIZE])
                         for i in range(0, len(sequences), MICRO_BATCH_SIZE)]
        num_items_in_batch = sum(int((labels != IGNORE).sum()) for _, labels in micro_batches)

        optimizer.zero_grad(set_to_none=True)
        logged_loss = 0.0
        for batch in micro_batches:
            if args.variant == "buggy":
                loss = token_loss(model, batch, "mean") / MICRO_BATCHES  # BUG: a mean of the micro-batches' token means
            else:
                loss = token_loss(model, batch, "sum") / num_items_in_batch  # FIX: each token of the window weighs the same
            loss.backward()
            logged_loss += loss.item()
        optimizer.step()

        reference_loss = token_loss(reference, collate(sequences), "mean")
        reference_update.step(torch.autograd.grad(reference_loss, reference_update.params))
        rel_diff = abs(logged_loss - reference_loss.item()) / reference_loss.item()
        max_rel_diff = max(max_rel_diff, rel_diff)
        if rel_diff > REL_LOSS_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": logged_loss, "time": time.time(),
                "metrics": {"full_batch_loss": reference_loss.item(), "loss_rel_diff_vs_full_batch": rel_diff,
                            "tokens": float(num_items_in_batch)}})
        if DIFFERENTIAL:
            report({"event": "compare", "step": step, "rank": 0, "quantity": "loss", "value": logged_loss,
                    "reference": reference_loss.item(), "time": time.time()})

    param_gap = max(float((p - r).abs().max()) for p, r in zip(model.parameters(), reference.parameters()))
    manifested = first_bad_step is not None
    if manifested:
        summary = ("with gradient accumulation the loss differed from full-batch training from step %d (max rel. "
                   "diff %.3g > %g); parameters apart by up to %.3g" % (first_bad_step, max_rel_diff,
                                                                       REL_LOSS_THRESHOLD, param_gap))
    else:
        summary = "gradient accumulation matched full-batch training (max rel. loss diff %.2g)" % max_rel_diff
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_rel_loss_diff": max_rel_diff, "threshold": REL_LOSS_THRESHOLD,
                         "first_bad_step": first_bad_step, "param_max_abs_diff": param_gap}})


if __name__ == "__main__":
    main()
