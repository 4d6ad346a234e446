"""SilentBench reproducer for PT-126514 (CUDA): capturable AdamW turns parameters into NaN at a zero learning rate.

The bug
    With ``capturable=True`` (the setting CUDA-graph capture needs, and the one
    ``torch.compile`` forces on a compiled optimizer step) and the for-loop implementation
    (``foreach=False``), ``torch.optim.Adam``/``AdamW`` (``_single_tensor_adam``) cannot pass
    the tensor step size to ``addcdiv_``, so it folds it into the denominator:
    ``denom = sqrt(v) / (sqrt(bc2) * step_size_neg) + eps / step_size_neg`` with
    ``step_size_neg = -lr / (1 - beta1**t)``. When ``lr`` is 0 (the first step of every
    linear warmup that starts at zero, as Hugging Face's ``get_linear_schedule_with_warmup``
    does), ``step_size_neg`` is ``-0.0``; wherever the second moment ``v`` is exactly 0
    (the padding row of an embedding, rows of tokens not yet seen, dead units: any element
    whose gradient has been exactly 0 so far) the denominator is ``0 / -0.0 = NaN`` and
    ``param.addcdiv_`` writes NaN into the parameter. The intended update is exactly zero.
    No error or warning; the NaN reaches the loss as soon as a NaN row is used. Reported in
    issue 126514 (weights become NaN with a compiled optimizer and lr=0.0, H100; open); PR
    186444 names this code path and proposes a fix that torch 2.13 still does not have. The
    foreach implementation adds eps before it divides by the step size, and the fused
    kernel uses the step size as a multiplier, so neither makes a NaN.

This program
    A bag-of-embeddings text classifier (``nn.Embedding(128, 32, padding_idx=0)``, masked
    mean over the non-padding tokens, 32-64-4 MLP head) is trained on one GPU with
    ``torch.optim.AdamW(lr=5e-2, weight_decay=0.01, capturable=True)`` and a LambdaLR
    schedule with linear warmup from 0 over 5 steps and linear decay after (the shape of
    Hugging Face's ``get_linear_schedule_with_warmup``), cross-entropy on synthetic token
    sequences of varying length (batch 32, up to 16 tokens, padded with 0), one
    ``optimizer.step()`` per step. The ``buggy`` variant passes ``foreach=False`` (the
    for-loop implementation, as a user short of memory may choose); the ``fixed`` variant
    passes ``foreach=True``, the default on CUDA, which computes the same capturable
    update with eps added before the step size is divided out. Nothing else differs.

Oracle (checked inside the single run)
    A float64 twin of the model, made before training, is trained in lockstep on the same
    batches with AdamW written out by hand (its own two moments, decoupled weight decay,
    the same learning rate at every step). *Manifested* means that after some step the
    model's parameters differ from the twin's by more than 5% (relative L2 over all
    parameters) or are not finite. The fixed variant differs from the twin only by float32
    rounding: at most 2.3e-6 over 40 steps, seeds 0-2, when this training function runs on
    the CPU with torch's device check for ``capturable`` lifted (a test harness; a GPU's
    float32 kernels round alike, so 5% leaves a margin of four orders of magnitude). The
    buggy one has NaN in 320-352 parameter elements after step 0 (the padding row and the
    rows of tokens missing from the first batch); the masked mean multiplies the padding
    row by 0, which keeps a NaN, so every padded example's logits and the loss are NaN from
    step 1, while the twin's loss falls from 1.38 to about 0.8.

Trigger step
    0: the schedule's learning rate is 0 at the first step, the step that writes the NaN.

Requirements
    A CUDA GPU (capturable optimizers keep their step on the GPU; torch refuses
    ``capturable=True`` for CPU parameters outside ``torch.compile``). Without one the
    program exits with status 2 and a message on stderr. The CPU analogue in
    ``catalog/PT-126514/cpu`` reaches the same code through a compiled optimizer step.
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


def train(args, device, extra_evidence):
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU, then moved
    token_score = torch.randn(VOCAB, CLASSES, generator=gen)
    model = BagOfEmbeddings().to(device)
    twin = copy.deepcopy(model).double()  # float64 reference, trained by hand in lockstep
    params, twin_params = list(model.parameters()), list(twin.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in twin_params]

    if args.variant == "buggy":
        optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                      capturable=True, foreach=False)  # BUG: for-loop capturable path
    else:
        optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                      capturable=True, foreach=True)  # FIX: foreach capturable path
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(args.steps))

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
        optimizer.step()
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
        summary = ("AdamW(capturable=True, foreach=%s): parameters differ from the float64 twin from step %d "
                   "(max rel. err %.3g, non-finite counts as inf); lr %.3g at step 0 left %s non-finite "
                   "parameter elements (%s NaN embedding rows); first non-finite loss at step %s"
                   % (group["foreach"], first_bad_step, max_rel_err, lr_step0 or 0.0, nonfinite_after_step0,
                      nan_rows_after_step0, first_nonfinite_loss_step))
    elif args.steps <= TRIGGER_STEP:
        summary = "no step was run, so the zero learning rate of step 0 was never applied"
    else:
        summary = ("AdamW(capturable=True, foreach=%s): parameters stayed finite and within %.2g (rel. L2) of the "
                   "float64 twin at every step, through the zero learning rate of step 0; final loss %.4g "
                   "(twin %.4g)" % (group["foreach"], max_rel_err, loss_value, ref_loss_value))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP, "summary": summary,
            "evidence": {"max_param_rel_err": max_rel_err, "threshold": REL_ERR_THRESHOLD,
                         "first_bad_step": first_bad_step, "first_nonfinite_loss_step": first_nonfinite_loss_step,
                         "lr_step0": lr_step0, "zero_grad_elems_step0": zero_grad_elems_step0,
                         "nonfinite_param_elems_after_step0": nonfinite_after_step0,
                         "nan_embedding_rows_after_step0": nan_rows_after_step0,
                         "final_loss": loss_value, "final_reference_loss": ref_loss_value,
                         "optimizer": {"class": type(optimizer).__name__, "capturable": group["capturable"],
                                       "foreach": group["foreach"], "fused": group["fused"]},
                         "torch": torch.__version__, "device": str(device), **extra_evidence}})


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-126514/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s). Run catalog/PT-126514/cpu for the CPU analogue.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("highest")  # no TF32: the model is compared with a float64 twin
    train(args, device, {"cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(device),
                         "capability": "%d.%d" % torch.cuda.get_device_capability(device)})


if __name__ == "__main__":
    main()
