"""SilentBench reproducer for PT-5801 (CPU analogue): a KLDivLoss backward that ignores grad_output.

The bug
    In PyTorch 0.3 the CUDA backward kernel of ``KLDivLoss`` returned d(loss)/d(input) as if
    the incoming gradient were always 1: it never multiplied by ``grad_output``. The loss
    value was right, and so was the gradient whenever the KL term was the whole loss, which
    is all the criterion tests checked. As soon as the loss was scaled or combined (ELF
    OpenGo multiplied it by the number of classes; distillation weights it against a
    cross-entropy), GPU gradients were off by exactly that factor while CPU gradients were
    correct. Fixed by PR 5814, which also made the criterion tests use a non-unit
    ``grad_output``.

This program
    No 0.3 CUDA kernel is available here, so the faulty backward is rebuilt as a custom
    ``torch.autograd.Function`` (``KLDivBatchmean``: forward ``sum(t * (log t - x)) / N``,
    backward ``-t / N``). The ``buggy`` variant returns that gradient as is; the ``fixed``
    variant multiplies it by ``grad_output``. Nothing else differs. It is used for knowledge
    distillation: a student MLP (20-64-10) learns from a fixed random teacher with
    ``loss = 0.5 * CE(student, labels) + 0.5 * T^2 * KL(student_T || teacher_T)``, T = 2,
    so the KL term reaches its backward with ``grad_output = 2``. SGD(lr=0.1, momentum 0.9),
    batches of 64 synthetic samples; every step ends with exactly one ``optimizer.step()``.

Oracle (checked inside the single run)
    A tensor hook records the gradient that actually flows into the student's temperature-
    scaled log-probabilities (they feed only the KL term). Every step compares it with the
    gradient of the same weighted term computed by the built-in ``F.kl_div(...,
    reduction="batchmean")`` on a detached copy: ``rel_err = ||g - g_ref|| / ||g_ref||``.
    *Manifested* means ``rel_err`` exceeded 0.05 at some step (buggy: 0.5, the gradient is
    half what it should be; fixed: 0 up to rounding). As evidence, ``torch.autograd.gradcheck`` of the
    weighted term is run once in float64 at the end: it reports a Jacobian mismatch in the
    buggy variant only. (Even unweighted, today's gradcheck would flag the Function through
    its "backward not multiplied by grad_output" test; the 0.3-era criterion tests used a
    unit grad_output and could not see the bug.)

Trigger step
    0: the first backward through the weighted KL term already uses the wrong gradient.
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
BATCH = 64
IN_FEATURES = 20
CLASSES = 10
ALPHA = 0.5
TEMPERATURE = 2.0
KL_WEIGHT = ALPHA * TEMPERATURE ** 2  # the grad_output the KL backward receives
LR = 0.1
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


class KLDivBatchmean(torch.autograd.Function):
    """KL(target || exp(log_input)) summed and divided by the batch size, with a hand-written backward."""

    @staticmethod
    def forward(ctx, log_input, target, variant):
        ctx.save_for_backward(target)
        ctx.variant = variant
        return (torch.xlogy(target, target) - target * log_input).sum() / log_input.shape[0]

    @staticmethod
    def backward(ctx, grad_output):
        (target,) = ctx.saved_tensors
        grad_input = -target / target.shape[0]
        if ctx.variant == "buggy":
            return grad_input, None, None  # BUG: grad_output is ignored, as if the loss were never scaled
        else:
            return grad_input * grad_output, None, None  # FIX: chain rule: multiply by grad_output


def make_batch(teacher, gen):
    x = torch.randn(BATCH, IN_FEATURES, generator=gen)
    with torch.no_grad():
        t_logits = teacher(x)
    labels = torch.distributions.Categorical(logits=t_logits).sample()  # noisy hard labels
    soft = torch.softmax(t_logits / TEMPERATURE, dim=1)
    return x, labels, soft


def kl_gradcheck(variant):
    """torch.autograd.gradcheck of the weighted KL term in float64: (passes, first line of the failure)."""
    gen = torch.Generator().manual_seed(1234)
    log_input = torch.log_softmax(torch.randn(4, 5, generator=gen, dtype=torch.float64), dim=1).requires_grad_(True)
    target = torch.softmax(torch.randn(4, 5, generator=gen, dtype=torch.float64), dim=1)
    try:
        torch.autograd.gradcheck(lambda li: KL_WEIGHT * KLDivBatchmean.apply(li, target, variant), (log_input,))
    except RuntimeError as error:  # GradcheckError
        return False, str(error).strip().splitlines()[0]
    return True, ""


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared CPU

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    teacher = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.Tanh(), nn.Linear(64, CLASSES))
    for p in teacher.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        teacher[2].weight.mul_(4.0)  # a confident teacher
    student = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(student.parameters(), lr=LR, momentum=0.9)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_err = 0.0
    first_bad_step = None
    for step in range(args.steps):
        x, labels, soft = make_batch(teacher, gen)
        optimizer.zero_grad(set_to_none=True)
        logits = student(x)
        log_p_t = torch.log_softmax(logits / TEMPERATURE, dim=1)
        captured = {}
        log_p_t.register_hook(lambda g: captured.__setitem__("grad", g.detach().clone()))
        ce = F.cross_entropy(logits, labels)
        kl = KLDivBatchmean.apply(log_p_t, soft, args.variant)
        loss = (1 - ALPHA) * ce + KL_WEIGHT * kl
        loss.backward()

        ref_in = log_p_t.detach().clone().requires_grad_(True)
        (ref_grad,) = torch.autograd.grad(KL_WEIGHT * F.kl_div(ref_in, soft, reduction="batchmean"), ref_in)
        rel_err = float((captured["grad"] - ref_grad).norm() / ref_grad.norm().clamp_min(1e-30))
        optimizer.step()

        max_rel_err = max(max_rel_err, rel_err)
        if rel_err > REL_ERR_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        acc = (logits.argmax(dim=1) == labels).float().mean().item()
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"kl_grad_rel_err": rel_err, "ce": ce.item(), "kl": kl.item(), "acc": acc,
                            "kl_grad_norm": float(captured["grad"].norm()),
                            "kl_grad_norm_expected": float(ref_grad.norm())}})

    gradcheck_passes, gradcheck_message = kl_gradcheck(args.variant)
    manifested = first_bad_step is not None
    if manifested:
        summary = ("KL-term gradient off by up to %.3g (relative) from step %d: the loss weight %.1f never "
                   "reaches it; gradcheck passes: %s" % (max_rel_err, first_bad_step, KL_WEIGHT, gradcheck_passes))
    else:
        summary = ("KL-term gradient matched F.kl_div at every step (max rel. error %.2g); gradcheck passes: %s"
                   % (max_rel_err, gradcheck_passes))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_rel_err": max_rel_err, "threshold": REL_ERR_THRESHOLD,
                         "first_bad_step": first_bad_step, "kl_loss_weight": KL_WEIGHT,
                         "gradcheck_passes": gradcheck_passes, "gradcheck_error": gradcheck_message}})


if __name__ == "__main__":
    main()
