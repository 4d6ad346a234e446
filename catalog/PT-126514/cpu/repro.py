"""SilentBench reproducer for PT-126514 (CPU): a compiled AdamW step turns parameters into NaN at a zero learning rate.

The bug
    ``torch.compile`` of an optimizer step sets ``capturable=True`` in the param groups it
    traces (Dynamo's ``OptimizerVariable``), so a compiled ``torch.optim.Adam``/``AdamW`` step
    runs the capturable update even though the user never asked for it. With the for-loop
    implementation (``_single_tensor_adam``: ``foreach=False``, the default on the CPU) that
    update cannot pass the tensor step size to ``addcdiv_`` and folds it into the
    denominator: ``denom = sqrt(v) / (sqrt(bc2) * step_size_neg) + eps / step_size_neg`` with
    ``step_size_neg = -lr / (1 - beta1**t)``. When ``lr`` is 0 (the first step of every
    linear warmup that starts at zero, as Hugging Face's ``get_linear_schedule_with_warmup``
    does), ``step_size_neg`` is ``-0.0``; wherever the second moment ``v`` is exactly 0 (the
    padding row of an embedding, rows of tokens not yet seen, dead units) the denominator is
    ``0 / -0.0 = NaN`` and ``param.addcdiv_`` writes NaN into the parameter, where the
    intended update is exactly zero. No error or warning. This is the setting of issue
    126514 (weights become NaN with a torch.compile'd optimizer and lr=0.0; reported on H100
    GPUs with DTensor parameters; open); PR 186444 names this code path and proposes a fix
    that torch 2.13 still does not have. On a GPU the same code runs for any
    ``capturable=True, foreach=False`` optimizer (``catalog/PT-126514/cuda``).

This program
    A bag-of-embeddings text classifier (``nn.Embedding(128, 32, padding_idx=0)``, masked
    mean over the non-padding tokens, 32-64-4 MLP head) is trained on the CPU with
    ``torch.optim.AdamW(lr=5e-2, weight_decay=0.01)`` whose ``step()`` is compiled with
    ``torch.compile(backend="eager")`` (the fault is in the optimizer's Python code that
    Dynamo traces, so no code needs to be generated; Inductor gives the same NaN), a
    LambdaLR schedule with linear warmup from 0 over 5 steps and linear decay after (the
    shape of Hugging Face's ``get_linear_schedule_with_warmup``), cross-entropy on synthetic
    token sequences of varying length (batch 32, up to 16 tokens, padded with 0), one
    ``optimizer.step()`` per step. The ``buggy`` variant passes ``foreach=False`` (the CPU's
    default, written out); the ``fixed`` variant passes ``foreach=True``, whose capturable
    update adds eps before it divides by the step size. Nothing else differs.

Oracle (checked inside the single run)
    A float64 twin of the model, made before training, is trained in lockstep on the same
    batches with AdamW written out by hand (its own two moments, decoupled weight decay,
    the same learning rate at every step). *Manifested* means that after some step the
    model's parameters differ from the twin's by more than 5% (relative L2 over all
    parameters) or are not finite. The fixed variant differs from the twin only by float32
    rounding (at most 2.3e-6 over 40 steps, seeds 0-2). The buggy one has NaN in 320-352
    parameter elements after step 0 (the padding row and the rows of tokens missing from
    the first batch); the masked mean multiplies the padding row by 0, which keeps a NaN,
    so every padded example's logits and the loss are NaN from step 1, while the twin's
    loss falls from 1.38 to about 0.8.

Trigger step
    0: the schedule's learning rate is 0 at the first step, the step that writes the NaN.
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

DEFAULT_STEPS = 40
TRIGGER_STEP = 0
VOCAB = 128
EMBED = 32
HIDDEN = 64
CLASSES = 4
BATCH = 32
MAX_LEN = 16
MIN_LEN = 4
LR = 5e-2
WEIGHT_DECAY = 0.01
BETAS = (0.9, 0.999)
EPS = 1e-8
WARMUP = 5
REL_ERR_THRESHOLD = 0.05


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


class BagOfEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMBED, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(EMBED, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, CLASSES))

    def forward(self, tokens):
        mask = (tokens != 0).unsqueeze(-1).to(self.emb.weight.dtype)
        pooled = (self.emb(tokens) * mask).sum(1) / mask.sum(1)  # masked mean over real tokens
        return self.head(pooled)


def make_batch(gen, token_score, device):
    """Token ids in 1..VOCAB-1, right-padded with 0; the label is the argmax of the tokens' mean score."""
    tokens = torch.randint(1, VOCAB, (BATCH, MAX_LEN), generator=gen)
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (BATCH, 1), generator=gen)
    tokens = tokens.masked_fill(torch.arange(MAX_LEN) >= lengths, 0)
    mask = (tokens != 0).unsqueeze(-1).float()
    labels = ((token_score[tokens] * mask).sum(1) / mask.sum(1)).argmax(1)
    return tokens.to(device), labels.to(device)


def lr_factor(total_steps):
    def factor(step):  # linear warmup from 0, then linear decay (get_linear_schedule_with_warmup)
        if step < WARMUP:
            return step / WARMUP
        return max(0.0, (total_steps - step) / max(1, total_steps - WARMUP))
    return factor


@torch.no_grad()
def reference_adamw_step(params, moments, step, lr):
    """AdamW written out in float64: the update torch.optim.AdamW documents, for the twin."""
    beta1, beta2 = BETAS
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
    for p, (m, v) in zip(params, moments):
        p.mul_(1 - lr * WEIGHT_DECAY)
        m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        p.sub_(lr / bc1 * m / (v.sqrt() / math.sqrt(bc2) + EPS))


def param_rel_err(params, ref_params):
    """Relative L2 distance over all parameters, in float64; inf when anything is not finite."""
    diff = ref = 0.0
    for p, r in zip(params, ref_params):
        p64 = p.detach().double()
        if not bool(torch.isfinite(p64).all()):
            return math.inf
        diff += float((p64 - r.detach()).pow(2).sum())
        ref += float(r.detach().pow(2).sum())
    return math.sqrt(diff) / max(math.sqrt(ref), 1e-30)


def train(args, device):
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU, then moved
    token_score = torch.randn(VOCAB, CLASSES, generator=gen)
    model = BagOfEmbeddings().to(device)
    twin = copy.deepcopy(model).double()  # float64 reference, trained by hand in lockstep
    params, twin_params = list(model.parameters()), list(twin.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in twin_params]

    if args.variant == "buggy":
        optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                      foreach=False)  # BUG: compiled, it runs the for-loop capturable path
    else:
        optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                      foreach=True)  # FIX: compiled, it runs the foreach capturable path
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(args.steps))

    @torch.compile(backend="eager")
    def compiled_step():
        optimizer.step()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_err = 0.0
    first_bad_step = first_nonfinite_loss_step = None
    lr_step0 = zero_grad_elems_step0 = nonfinite_after_step0 = nan_rows_after_step0 = None
    loss_value = ref_loss_value = None
    for step in range(args.steps):
        tokens, labels = make_batch(gen, token_score, device)
        lr = optimizer.param_groups[0]["lr"]

        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        if step == 0:
            zero_grad_elems_step0 = int(sum(int((p.grad == 0).sum()) for p in params))
        compiled_step()  # the step's one optimizer.step(), traced by Dynamo
        scheduler.step()

        twin.zero_grad(set_to_none=True)
        ref_loss = F.cross_entropy(twin(tokens), labels)
        ref_loss.backward()
        reference_adamw_step(twin_params, moments, step + 1, lr)

        loss_value, ref_loss_value = loss.item(), ref_loss.item()
        rel_err = param_rel_err(params, twin_params)
        nonfinite = int(sum(int((~torch.isfinite(p)).sum()) for p in params))
        if step == 0:
            lr_step0, nonfinite_after_step0 = lr, nonfinite
            nan_rows_after_step0 = int(torch.isnan(model.emb.weight).any(dim=1).sum())
        if first_nonfinite_loss_step is None and not math.isfinite(loss_value):
            first_nonfinite_loss_step = step
        max_rel_err = max(max_rel_err, rel_err)
        if first_bad_step is None and rel_err > REL_ERR_THRESHOLD:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss_value, "time": time.time(),
                "metrics": {"lr": lr, "param_rel_err": rel_err, "nonfinite_param_elems": float(nonfinite),
                            "reference_loss": ref_loss_value}})

    manifested = first_bad_step is not None
    group = optimizer.param_groups[0]
    if manifested:
        summary = ("compiled AdamW(foreach=%s): parameters differ from the float64 twin from step %d "
                   "(max rel. err %.3g, non-finite counts as inf); lr %.3g at step 0 left %s non-finite "
                   "parameter elements (%s NaN embedding rows); first non-finite loss at step %s"
                   % (group["foreach"], first_bad_step, max_rel_err, lr_step0 or 0.0, nonfinite_after_step0,
                      nan_rows_after_step0, first_nonfinite_loss_step))
    elif args.steps <= TRIGGER_STEP:
        summary = "no step was run, so the zero learning rate of step 0 was never applied"
    else:
        summary = ("compiled AdamW(foreach=%s): parameters stayed finite and within %.2g (rel. L2) of the "
                   "float64 twin at every step, through the zero learning rate of step 0; final loss %.4g "
                   "(twin %.4g)" % (group["foreach"], max_rel_err, loss_value, ref_loss_value))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_param_rel_err": max_rel_err, "threshold": REL_ERR_THRESHOLD,
                         "first_bad_step": first_bad_step, "first_nonfinite_loss_step": first_nonfinite_loss_step,
                         "lr_step0": lr_step0, "zero_grad_elems_step0": zero_grad_elems_step0,
                         "nonfinite_param_elems_after_step0": nonfinite_after_step0,
                         "nan_embedding_rows_after_step0": nan_rows_after_step0,
                         "final_loss": loss_value, "final_reference_loss": ref_loss_value,
                         "optimizer": {"class": type(optimizer).__name__, "foreach": group["foreach"],
                                       "fused": group["fused"], "capturable_as_constructed": group["capturable"]},
                         "compiled_with": "torch.compile(backend=\"eager\")",
                         "torch": torch.__version__, "device": str(device)}})


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(args, torch.device("cpu"))


if __name__ == "__main__":
    main()
