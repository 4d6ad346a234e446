"""SilentBench reproducer for PT-115607 on torch 2.2: a compiled optimizer step reuses its "all grads None" graph.

The bug
    ``torch.compile`` of an optimizer's ``step()`` left out of the traced graph every
    parameter whose ``.grad`` was ``None``, and Dynamo installed no guard saying "this grad
    is None". After a step in which every grad was ``None`` (a legitimate no-op), the graph
    traced then, which updates nothing, sat at the front of the cache and its guards kept
    passing once the grads were populated again: the optimizer never moved a parameter
    again, with no error, while the loss kept being computed and logged (issue 115607,
    fixed by PR 121291, "guard on grads being None in compiled optimizers", first released
    in torch 2.3.0).

This program
    Runs the real code path: ``torch.optim.Adam`` whose ``step()`` is compiled with
    ``torch.compile(backend="eager")`` (the fault is in Dynamo's guards, so no code needs to
    be generated), on a torch release that still has the fault (2.2.x; on 2.3.0 and later the
    guard exists and the buggy variant trains normally; on 2.1.2 the compiled step keeps no
    stale graph). An MLP classifier (20-64-64 backbone + linear head, 5 classes) is trained
    on synthetic Gaussian blobs with cross-entropy, batch 64. At step 3 the data stream yields a corrupt batch (one row of
    non-finite features); the loop skips the backward of a non-finite loss, a common guard,
    so every ``.grad`` is ``None`` when the optimizer step runs. Every step ends with
    exactly one ``optimizer.step()`` call.

    The ``buggy`` variant calls the compiled step every step, as the compiled-optimizer
    recipe does. The ``fixed`` variant applies the workaround for releases without the
    guard: a step without any gradient (a no-op for Adam) runs the eager
    ``optimizer.step()``, so no graph is ever traced with the grads ``None``. Nothing else
    differs.

Oracle (checked inside the single run)
    A snapshot of the model is taken after the skipped step. *Manifested* means no
    parameter changed after it although the gradients were non-zero at every later step,
    which is what a user sees: the model stops training while the loss is still logged.
    The Adam step counts of the parameters are evidence.

Trigger step
    4: the first step after the skipped one, where the gradients are back and the stale
    graph ignores them (steps 0-3 are identical in both variants).
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
SKIP_STEP = 3  # the corrupt batch: its loss is not finite, so the loop skips its backward
TRIGGER_STEP = SKIP_STEP + 1
BATCH = 64
IN_FEATURES = 20
CLASSES = 5
LR = 3e-3


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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(self.backbone(x))


def make_batch(centers, gen, corrupt):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    x = centers[labels] + torch.randn(BATCH, IN_FEATURES, generator=gen)
    if corrupt:
        x[0] = float("nan")  # a corrupt record, as a broken shard or a failed decode yields
    return x, labels


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared CPU

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    centers = 1.5 * torch.randn(CLASSES, IN_FEATURES, generator=gen)
    model = Net()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=LR)

    @torch.compile(backend="eager")
    def compiled_step():
        optimizer.step()

    report({"event": "start", "time": time.time(), "variant": args.variant, "seed": args.seed,
            "steps": args.steps, "world_size": 1})

    snapshot = None
    steps_with_grad_after_skip = 0
    for step in range(args.steps):
        x, labels = make_batch(centers, gen, corrupt=step == SKIP_STEP)
        before = [p.detach().clone() for p in params]
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        skipped = not torch.isfinite(loss)
        if not skipped:
            loss.backward()
        grad_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None))
        if args.variant == "fixed" and all(p.grad is None for p in params):
            optimizer.step()  # WORKAROUND: no graph is traced while every grad is None
        else:
            compiled_step()
        max_update = max(float((p.detach() - b).abs().max()) for p, b in zip(params, before))
        if step == SKIP_STEP:
            snapshot = [p.detach().clone() for p in params]
        elif snapshot is not None and grad_norm > 0:
            steps_with_grad_after_skip += 1
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"acc": acc, "grad_norm": grad_norm, "max_update": max_update,
                            "skipped_backward": float(skipped)}})

    delta = None
    if snapshot is not None:
        delta = max(float((p.detach() - s).abs().max()) for p, s in zip(params, snapshot))
    adam_steps = [int(optimizer.state[p]["step"]) if optimizer.state[p] else 0 for p in params]
    manifested = steps_with_grad_after_skip > 0 and delta == 0.0
    if manifested:
        summary = ("no parameter changed over the %d steps after the skipped one although their grads were "
                   "non-zero; the graph traced with every grad None was reused" % steps_with_grad_after_skip)
    elif snapshot is None or steps_with_grad_after_skip == 0:
        summary = "run too short: the corrupt batch comes at step %d" % SKIP_STEP
    else:
        summary = "the model kept training after the skipped step (max |delta| %.3g)" % delta
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_delta_since_skip": delta, "steps_with_grad_after_skip": steps_with_grad_after_skip,
                         "adam_step_counts": adam_steps, "skip_step": SKIP_STEP,
                         "torch": torch.__version__}})


if __name__ == "__main__":
    main()
