"""SilentBench reproducer for PT-188166: an assign=True load leaves assign mode in the state dict, and a later default load swaps the model's parameters out from under its optimizer.

The bug
    ``Module.load_state_dict(sd, assign=True)`` writes ``assign_to_params_buffers=True`` into
    ``sd._metadata`` (it takes each module's metadata entry by reference). A later
    ``load_state_dict(sd)`` from the same dict, with the default ``assign=False``, therefore
    assigns new ``Parameter`` objects wrapping the checkpoint's tensors instead of copying
    into the module's parameters. An optimizer built before that load keeps updating the
    old parameters, which the model no longer uses (issue 188166, open; fix PR 195990 copies
    the metadata before writing the flag; torch 2.13 still mutates it).

This program
    Fine-tuning with a frozen reference model, as in RLHF- or distillation-style training: the
    checkpoint (a saved and reloaded state dict) is loaded into a reference MLP built on the
    meta device with ``assign=True`` (the documented way to skip initialisation), then into
    the fine-tuned MLP (32 -> 64 -> 64 -> 8), whose AdamW optimizer (lr 1e-3) already exists,
    with the default load. Loss: cross-entropy on Gaussian blobs plus 0.1 x the KL divergence
    to the reference's predictions, batch 64. The ``buggy`` variant loads the reference from
    the checkpoint itself; the ``fixed`` variant from a copy with private metadata, which is
    what PR 195990 does inside ``load_state_dict``. Nothing else differs.

Oracle (checked inside the single run)
    The fine-tuned model's parameters are copied right after loading; *manifested* means none
    of them changed by the end although ``optimizer.step()`` ran every step. How many of the
    optimizer's parameters are the model's, whether the model shares its tensors with the
    reference, and the first and last loss are evidence.

Trigger step
    0: the first ``optimizer.step()`` already updates parameters the model does not use.
"""
import argparse
import io
import json
import math
import os
import sys
import time
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_STEPS = 20
TRIGGER_STEP = 0
IN_FEATURES = 32
HIDDEN = 64
CLASSES = 8
BATCH = 64
LR = 1e-3
KL_WEIGHT = 0.1


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


def build_mlp():
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                         nn.Linear(HIDDEN, CLASSES))


def load_checkpoint():
    """The pretrained weights as a training script gets them: saved, then read back with their metadata."""
    buffer = io.BytesIO()
    torch.save(build_mlp().state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def with_private_metadata(state_dict):
    """The same tensors under metadata of their own: what PR 195990 gives every load."""
    private = OrderedDict(state_dict)
    private._metadata = OrderedDict((key, dict(value)) for key, value in state_dict._metadata.items())
    return private


def make_batch(centers, gen):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    return centers[labels] + torch.randn(BATCH, IN_FEATURES, generator=gen), labels


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    centers = 1.5 * torch.randn(CLASSES, IN_FEATURES, generator=gen)
    checkpoint = load_checkpoint()

    with torch.device("meta"):
        reference = build_mlp()
    if args.variant == "buggy":
        reference.load_state_dict(checkpoint, assign=True)  # BUG: torch 2.13 leaves assign mode in checkpoint._metadata
    else:
        reference.load_state_dict(with_private_metadata(checkpoint), assign=True)  # FIX: the flag stays local (PR 195990)
    reference.requires_grad_(False)

    model = build_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model.load_state_dict(checkpoint)  # the default load, expected to copy into the optimizer's parameters
    loaded = [p.detach().clone() for p in model.parameters()]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    in_optimizer = sum(id(p) in optimized for p in model.parameters())
    shared = sum(p.data_ptr() == r.data_ptr() for p, r in zip(model.parameters(), reference.parameters()))

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    losses = []
    for step in range(args.steps):
        x, labels = make_batch(centers, gen)
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        with torch.no_grad():
            ref_log_probs = F.log_softmax(reference(x), dim=1)
        kl = F.kl_div(F.log_softmax(logits, dim=1), ref_log_probs, log_target=True, reduction="batchmean")
        loss = F.cross_entropy(logits, labels) + KL_WEIGHT * kl
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"acc": acc, "kl_to_reference": kl.item()}})

    delta = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), loaded))
    manifested = delta == 0.0
    if manifested:
        summary = ("the model never changed over %d optimizer steps (loss %.3f -> %.3f): %d of its %d parameters "
                   "are in the optimizer" % (args.steps, losses[0], losses[-1], in_optimizer, len(loaded)))
    else:
        summary = "the model trained (max |delta| %.3g, loss %.3f -> %.3f)" % (delta, losses[0], losses[-1])
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_param_delta": delta, "params_in_optimizer": in_optimizer, "params": len(loaded),
                         "params_shared_with_reference": shared, "first_loss": losses[0] if losses else None,
                         "last_loss": losses[-1] if losses else None,
                         "metadata_after_assign_load": bool(checkpoint._metadata[""].get("assign_to_params_buffers"))}})


if __name__ == "__main__":
    main()
