"""SilentBench reproducer for PT-115607: a cached compiled optimizer step has no guard on grads being None.

The bug
    When ``torch.compile`` traced an optimizer's ``step()``, parameters whose ``.grad`` was
    ``None`` were simply left out of the traced graph, and Dynamo installed no guard saying
    "this grad is None". Guards existed only for the grads that were tensors. A graph traced
    while some (or all) grads were ``None`` therefore stayed valid after those grads were
    populated again: its guards still passed, it sat at the front of the cache, and it kept
    being selected. The parameters it had specialised away were never updated again, with no
    error, while the loss kept being computed and logged (issue 115607, fixed by PR 121291,
    "guard on grads being None in compiled optimizers").

This program
    torch 2.13 contains the fix, so the faulty caching logic is rebuilt in a few lines.
    ``CachedCompiledAdam`` is a ``torch.optim.Optimizer`` whose ``step()`` works like a
    Dynamo-compiled step: it looks up a cache of "graphs" (newest entry first, as in Dynamo's
    cache), each with a list of guards; on a miss it "traces" a new graph specialised to the
    parameters that currently have a gradient (a hand-written Adam update over exactly those
    parameters) and puts it at the front. Tensor grads get a tensor-match guard (not None,
    same shape and dtype). The ``buggy`` variant installs no guard for a grad that is ``None``
    at trace time; the ``fixed`` variant guards on it being ``None`` (the PR's fix). Nothing
    else differs.

    Training: an MLP (backbone 20-64-64 + linear head, 5 classes) on synthetic Gaussian-blob
    data with a common fine-tuning schedule: the backbone is frozen (``requires_grad=False``,
    so its grads are ``None``) for the first two steps while the head warms up, and unfrozen
    from step 2 on. Every step ends with exactly one ``optimizer.step()``.

Oracle (checked inside the single run)
    A snapshot of the backbone is taken when it is unfrozen. At the end, *manifested* means
    no backbone parameter changed after the unfreeze although the backbone's gradients were
    non-zero at every one of those steps. In the fixed variant the first step with backbone
    grads misses the guarded cache entry, a new graph is traced and the backbone trains.
    Under ``SILENTBENCH_DIFFERENTIAL=1`` every step also reports each parameter's update norm
    against the update norm that a stock ``torch.optim.Adam`` gives on clones of the same
    parameters, grads and optimizer state.

Trigger step
    2: the first step at which the backbone has gradients that the stale graph ignores
    (steps 0-1 are identical in both variants).
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
UNFREEZE_STEP = 2
TRIGGER_STEP = UNFREEZE_STEP
BATCH = 64
IN_FEATURES = 20
CLASSES = 5
LR = 3e-3
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


def _grad_matches(p, shape, dtype):
    return lambda: p.grad is not None and p.grad.shape == shape and p.grad.dtype == dtype


def _grad_is_none(p):
    return lambda: p.grad is None


class CachedCompiledAdam(torch.optim.Optimizer):
    """Adam whose step() dispatches through a Dynamo-like cache of specialised graphs."""

    def __init__(self, params, variant, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.variant = variant
        self.cache = []  # [(guards, graph)], newest first
        self.compiles = 0

    def _trace(self):
        guards, active = [], []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    if self.variant == "buggy":
                        pass  # BUG: no guard for a None grad, so this graph stays valid once the grad exists
                    else:
                        guards.append(_grad_is_none(p))  # FIX: guard on the grad being None (PR 121291)
                else:
                    guards.append(_grad_matches(p, p.grad.shape, p.grad.dtype))
                    active.append((p, group))

        def graph():
            for p, group in active:  # specialised: only the parameters that had a grad at trace time
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                beta1, beta2 = group["betas"]
                state["step"] += 1
                t = state["step"].item()
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1 ** t))

        self.compiles += 1
        return guards, graph

    @torch.no_grad()
    def step(self, closure=None):
        for guards, graph in self.cache:
            if all(guard() for guard in guards):
                graph()
                return None
        entry = self._trace()
        self.cache.insert(0, entry)
        entry[1]()
        return None


def eager_adam_updates(optimizer, params):
    """The update torch.optim.Adam would apply from the same state, computed on clones (training untouched)."""
    clones = [p.detach().clone() for p in params]
    for c, p in zip(clones, params):
        c.grad = None if p.grad is None else p.grad.clone()
    eager = torch.optim.Adam(clones, **{k: optimizer.defaults[k] for k in ("lr", "betas", "eps")}, foreach=False)
    for c, p in zip(clones, params):
        if optimizer.state.get(p):
            eager.state[c] = {k: v.clone() for k, v in optimizer.state[p].items()}
    eager.step()
    return [c - p.detach() for c, p in zip(clones, params)]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(self.backbone(x))


def make_batch(centers, gen):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    x = centers[labels] + torch.randn(BATCH, IN_FEATURES, generator=gen)
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
    optimizer = CachedCompiledAdam(model.parameters(), args.variant, lr=LR)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    backbone = list(model.backbone.parameters())
    snapshot = None
    steps_with_backbone_grad = 0
    for step in range(args.steps):
        frozen = step < UNFREEZE_STEP
        for p in backbone:
            p.requires_grad_(not frozen)
        if step == UNFREEZE_STEP:
            snapshot = [p.detach().clone() for p in backbone]

        x, labels = make_batch(centers, gen)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        backbone_grad_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in backbone if p.grad is not None))
        if DIFFERENTIAL:  # the update two ways: the cached "compiled" step vs eager torch.optim.Adam
            eager_norms = [float(u.norm()) for u in eager_adam_updates(optimizer, list(model.parameters()))]
        optimizer.step()

        backbone_update = max(float((p.detach() - b).abs().max()) for p, b in zip(backbone, before))
        head_update = max(float((p.detach() - b).abs().max())
                          for p, b in zip(model.head.parameters(), before[len(backbone):]))
        if not frozen and backbone_grad_norm > 0:
            steps_with_backbone_grad += 1
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"acc": acc, "backbone_grad_norm": backbone_grad_norm,
                            "backbone_max_update": backbone_update, "head_max_update": head_update,
                            "cache_entries": float(len(optimizer.cache))}})
        if DIFFERENTIAL:
            report({"event": "compare", "step": step, "rank": 0, "quantity": "param_update_norms",
                    "value": [float((p.detach() - b).norm()) for p, b in zip(model.parameters(), before)],
                    "reference": eager_norms, "time": time.time()})

    backbone_delta = None
    if snapshot is not None:
        backbone_delta = max(float((p.detach() - s).abs().max()) for p, s in zip(backbone, snapshot))
    backbone_steps = [int(optimizer.state[p]["step"].item()) if optimizer.state[p] else 0 for p in backbone]
    manifested = steps_with_backbone_grad > 0 and backbone_delta == 0.0
    if manifested:
        summary = ("backbone unchanged over %d steps after unfreezing although its grads were non-zero; "
                   "the graph traced with its grads None was reused" % steps_with_backbone_grad)
    elif snapshot is None:
        summary = "run too short: the backbone is unfrozen at step %d" % UNFREEZE_STEP
    else:
        summary = "backbone trained after unfreezing (max |delta| %.3g)" % backbone_delta
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"backbone_max_delta_since_unfreeze": backbone_delta,
                         "steps_with_backbone_grad": steps_with_backbone_grad,
                         "backbone_adam_step_counts": backbone_steps,
                         "graphs_traced": optimizer.compiles, "unfreeze_step": UNFREEZE_STEP}})


if __name__ == "__main__":
    main()
