"""SilentBench reproducer for PT-5801 (CUDA): the CUDA KLDivLoss backward ignores grad_output.

The bug
    In PyTorch 0.3.x the CUDA backward kernel of ``KLDivLoss`` computed d(loss)/d(input)
    without multiplying by ``grad_output``, i.e. as if the KL loss were never scaled; the
    CPU kernel was correct, and the criterion tests only used a unit ``grad_output``. ELF
    OpenGo multiplied its KL loss by the number of classes, so its GPU gradients were off by
    that factor for months, silently (issue 5801; fixed by PR 5814 before 0.4.0).

This program
    A small MLP classifier (20-64-10) is trained on one GPU on synthetic data with
    ``loss = CE(logits, labels) + C * KL(teacher soft targets || softmax(logits))``, C = 10
    classes, the KL term being the element-wise mean as in the issue
    (``nn.KLDivLoss(size_average=True)`` times the number of classes), with SGD(lr=0.1,
    momentum 0.9); every step ends with exactly one ``optimizer.step()``. The ``buggy``
    variant computes the KL term with the built-in ``nn.KLDivLoss``; the ``fixed`` variant
    computes the same value from plain ops (``target * (log target - log_input)``,
    averaged), the workaround used in the issue, which avoids the faulty kernel. Nothing
    else differs. The code only uses APIs present in both 0.3 and current releases
    (``Variable`` wrappers, ``size_average``), so it runs on an affected build; on any
    fixed build both variants report ``manifested: false``.

Oracle (checked inside the single run)
    Every step takes the current log-probabilities and targets, computes the gradient of
    the *scaled* KL term with respect to the log-probabilities once on the GPU and once on
    the CPU (same code, same values), and compares: ``rel_err = ||g_gpu - g_cpu|| /
    ||g_cpu||``. *Manifested* means ``rel_err`` exceeded 0.05 at some step. On an affected
    build the buggy variant's GPU gradient is 1/C of the CPU one (rel_err 0.9).

Trigger step
    0: the first backward through the scaled KL term.

Requirements
    A CUDA GPU, and torch 0.3.x to see the bug. Without CUDA the program exits with status 2
    and a message on stderr. The CPU analogue is ``catalog/PT-5801/cpu``.
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
from torch.autograd import Variable

DEFAULT_STEPS = 20
TRIGGER_STEP = 0
BATCH = 64
IN_FEATURES = 20
CLASSES = 10
KL_SCALE = float(CLASSES)  # the loss weight ELF OpenGo used
TEMPERATURE = 2.0
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


def scalar(value):
    """A one-element loss as a float, on 0.3 (Variable of shape [1]) and on current releases."""
    try:
        return float(value.item())
    except AttributeError:
        return float(value.data[0])


def kl_term(log_input, target, variant, criterion):
    if variant == "buggy":
        return criterion(log_input, target)  # BUG: built-in KLDivLoss, whose CUDA backward ignores grad_output on 0.3.x
    else:
        return (target * (torch.log(target) - log_input)).sum() / (log_input.size(0) * log_input.size(1))  # FIX: same value from plain ops


def kl_input_grad(log_input, target, variant, criterion):
    """Gradient of KL_SCALE * KL w.r.t. the log-probabilities, on the device the tensors live on."""
    x = Variable(log_input.clone(), requires_grad=True)
    t = Variable(target.clone())
    (KL_SCALE * kl_term(x, t, variant, criterion)).backward()
    return x.grad.data


def make_batch(teacher):
    x = torch.randn(BATCH, IN_FEATURES)
    t_logits = teacher(Variable(x)).data
    labels = torch.max(t_logits, 1)[1]
    soft = F.softmax(Variable(t_logits / TEMPERATURE), dim=1).data
    return x, labels, soft


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-5801/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s). Run catalog/PT-5801/cpu for the CPU analogue.\n" % torch.__version__)
        sys.exit(2)

    torch.manual_seed(args.seed)
    torch.cuda.manual_seed(args.seed)
    teacher = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.Tanh(), nn.Linear(64, CLASSES))
    for p in teacher.parameters():
        p.requires_grad = False
    model = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES)).cuda()
    criterion = nn.KLDivLoss(size_average=True)  # element-wise mean, the 0.3 default
    ce_loss = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_rel_err = 0.0
    first_bad_step = None
    last_ratio = None
    for step in range(args.steps):
        x, labels, soft = make_batch(teacher)
        x, labels, soft = Variable(x.cuda()), Variable(labels.cuda()), Variable(soft.cuda())
        optimizer.zero_grad()
        logits = model(x)
        log_p = F.log_softmax(logits, dim=1)
        loss = ce_loss(logits, labels) + KL_SCALE * kl_term(log_p, soft, args.variant, criterion)
        loss.backward()

        g_gpu = kl_input_grad(log_p.data, soft.data, args.variant, criterion).cpu()
        g_cpu = kl_input_grad(log_p.data.cpu(), soft.data.cpu(), args.variant, criterion)
        cpu_norm = float(g_cpu.norm())
        rel_err = float((g_gpu - g_cpu).norm()) / max(cpu_norm, 1e-30)
        last_ratio = cpu_norm / max(float(g_gpu.norm()), 1e-30)
        optimizer.step()

        max_rel_err = max(max_rel_err, rel_err)
        if rel_err > REL_ERR_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": scalar(loss), "time": time.time(),
                "metrics": {"kl_grad_gpu_vs_cpu_rel_err": rel_err, "cpu_over_gpu_grad_norm": last_ratio}})

    try:
        gpu_name = torch.cuda.get_device_name(0)
    except Exception:  # very old builds
        gpu_name = None
    manifested = first_bad_step is not None
    if manifested:
        summary = ("GPU gradient of the scaled KL term differs from the CPU one by up to %.3g (relative) from "
                   "step %d; CPU/GPU norm ratio %.3g with loss weight %.0f" % (max_rel_err, first_bad_step,
                                                                             last_ratio, KL_SCALE))
    else:
        summary = "GPU and CPU gradients of the scaled KL term agree (max rel. error %.2g)" % max_rel_err
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"max_rel_err": max_rel_err, "threshold": REL_ERR_THRESHOLD,
                         "first_bad_step": first_bad_step, "kl_loss_weight": KL_SCALE,
                         "last_cpu_over_gpu_grad_norm": last_ratio, "torch": torch.__version__,
                         "cuda": getattr(torch.version, "cuda", None), "gpu": gpu_name}})


if __name__ == "__main__":
    main()
