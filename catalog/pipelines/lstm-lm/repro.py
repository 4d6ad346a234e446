"""SilentBench clean reference pipeline: an LSTM language model on a synthetic Markov token stream.

What it trains
    A word-level language model (Embedding(24, 32) -> 1-layer LSTM(64) -> Linear(64, 24)) learns
    next-token prediction with cross-entropy and ``torch.optim.Adam(lr=3e-3)``; gradients are
    clipped to a global norm of 0.25 with ``torch.nn.utils.clip_grad_norm_``. The text is a
    first-order Markov chain over a 24-token vocabulary whose transition matrix is drawn from
    the seed (peaked rows, so the chain is far from uniform). Sixteen parallel streams are
    consumed in chunks of 32 tokens (truncated back-propagation through time): the hidden state
    is carried from one chunk to the next and detached from the graph of the previous chunk.
    The entropy rate of the chain (the best achievable loss) is reported as evidence.

Clean reference
    This program contains no fault. It exists so that invariant-learning detectors can fit on
    correct training code and so that false-positive rates can be measured on it. ``--variant``
    changes nothing: ``buggy`` runs the same clean program. Each step calls ``optimizer.zero_grad()``, runs forward and
    backward, clips, and ends with exactly one ``optimizer.step()``.

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
import torch.nn.functional as F

DEFAULT_STEPS = 40
TRIGGER_STEP = None  # clean pipeline: no fault is ever active
VOCAB = 24
EMBED = 32
HIDDEN = 64
STREAMS = 16  # batch size: parallel token streams
BPTT = 32  # tokens per stream per step
LR = 3e-3
MAX_NORM = 0.25


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


def make_chain(gen):
    """A seeded first-order Markov chain: (transition matrix, entropy rate in nats)."""
    transition = torch.softmax(2.5 * torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64), dim=1)
    stationary = torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)
    for _ in range(500):  # power iteration
        stationary = stationary @ transition
    row_entropy = -(transition * transition.log()).sum(dim=1)
    return transition.float(), float((stationary * row_entropy).sum())


class TokenStreams:
    """STREAMS independent walks on the chain, read BPTT tokens at a time."""

    def __init__(self, transition, gen):
        self.transition = transition
        self.gen = gen
        self.current = torch.randint(0, VOCAB, (STREAMS,), generator=gen)

    def next_chunk(self):
        tokens = [self.current]
        for _ in range(BPTT):
            tokens.append(torch.multinomial(self.transition[tokens[-1]], 1, generator=self.gen).squeeze(1))
        chunk = torch.stack(tokens, dim=1)  # (STREAMS, BPTT + 1)
        self.current = chunk[:, -1]
        return chunk[:, :-1], chunk[:, 1:]  # inputs, next-token targets


class LSTMLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.lstm = nn.LSTM(EMBED, HIDDEN, num_layers=1, batch_first=True)
        self.decoder = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens, hidden):
        out, hidden = self.lstm(self.embed(tokens), hidden)
        return self.decoder(out), hidden

    def init_hidden(self, batch):
        weight = next(self.parameters())
        return (weight.new_zeros(1, batch, HIDDEN), weight.new_zeros(1, batch, HIDDEN))


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)  # the same either way
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    torch.set_num_threads(1)  # deterministic and light on a shared CPU
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    transition, entropy_rate = make_chain(gen)
    streams = TokenStreams(transition, gen)

    model = LSTMLanguageModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    hidden = model.init_hidden(STREAMS)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    losses = []
    clipped_steps = 0
    for step in range(args.steps):
        inputs, targets = streams.next_chunk()
        hidden = tuple(h.detach() for h in hidden)  # truncated BPTT: keep the state, drop the graph
        optimizer.zero_grad()
        logits, hidden = model(inputs, hidden)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        losses.append(loss.item())
        clipped_steps += int(norm > MAX_NORM)
        report({"event": "step", "step": step, "rank": 0, "loss": losses[-1], "time": time.time(),
                "metrics": {"grad_norm": norm, "lr": lr, "perplexity": math.exp(min(losses[-1], 50.0))}})

    manifested, evidence = training_failed(losses)
    evidence.update({"entropy_rate": entropy_rate, "uniform_loss": math.log(VOCAB),
                     "clipped_steps": clipped_steps, "max_norm": MAX_NORM})
    summary = ("training %s: mean loss %.4f over the first quarter, %.4f over the last "
               "(chain entropy rate %.4f, uniform %.4f)"
               % (verdict(manifested, evidence), evidence["first_quarter_mean_loss"],
                  evidence["last_quarter_mean_loss"], entropy_rate, math.log(VOCAB)))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
