"""SilentBench reproducer for PT-104157 (CUDA): bf16 bilinear-upsampling gradients summed in bf16 atomics.

The bug
    The CUDA backward of ``F.interpolate`` in the modes that blend neighbours (``upsample_bilinear2d``
    here; linear, bicubic, trilinear and area too) launches one thread per *output* element and
    scatters its share of the gradient into ``grad_input`` with ``fastAtomicAdd`` on the tensor's own
    dtype (``aten/src/ATen/native/cuda/UpSampleBilinear2d.cu``; for bf16 a native ``__nv_bfloat162``
    atomic add on SM 8.0+). With fp16/bf16 tensors every one of those additions is rounded to 16 bits,
    so an input element that receives many contributions stops growing once they fall below half a
    unit in the last place of the running sum: the sum of 16,384 ones comes out as 2048 in fp16, and
    in bf16 (8 significant bits) a sum already stalls around 256 times its addends. Only the weights
    and coordinates use the accumulate type. No error, no warning: the gradient is silently too
    small and noisy. Reported for bicubic fp16 in PyTorch issue 104157 (June 2023, open); the
    maintainers answered with a note in the ``F.interpolate`` docstring ("the gradients for the dtype
    float16 on CUDA may be inaccurate ... linear, bilinear, bicubic, trilinear, area", still in torch
    2.13) rather than a kernel change; issue 121072 made ``torch.autocast`` run these ops in float32
    (PR 121324; they are in the CUDA autocast float32 list of torch 2.13), but a model that is itself in
    bf16/fp16 still runs the 16-bit kernel, and the CUDA path is still the atomic one (PR 197714, open
    in Sep 2026, adds a gather kernel only for deterministic mode).

This program
    A small DeepLabV3-style segmentation net (a 3x3 conv stem at 64x64, an ASPP with a 1x1 branch,
    a dilated 3x3 branch and the image-pooling branch ``AdaptiveAvgPool2d(1) -> 1x1 conv -> ReLU ->
    bilinear upsample back to 64x64``, a 1x1 projection and a 1x1 classifier) is cast to bf16 with
    ``.to(torch.bfloat16)`` (pure-bf16 training: no autocast, so the upsample runs in bf16 as the
    model's tensors are) and trained with AdamW on synthetic scenes: blobs whose class (1 or 2)
    depends on a tint of the whole image, so the global branch matters. The image-pooling branch's
    upsample is the worst case of the bug: each of its 1x1 input elements receives the gradient of
    all 4,096 output pixels. Every step ends with exactly one ``optimizer.step()``. The ``buggy``
    variant upsamples the bf16 branch output as it is; the ``fixed`` variant upsamples it in float32
    and casts the result back (``F.interpolate(p.float(), ...).to(p.dtype)``), the workaround the
    issue thread and the docstring note point to. Nothing else differs.

Oracle (checked inside the single run)
    Every step the program keeps the gradient that reached the upsample's output (``retain_grad``)
    and recomputes, in float64, what the image-pooling branch's 1x1 conv should receive from it:
    the adjoint of the bilinear upsample as an explicit interpolation matrix (built once from the
    float64 forward, so the suspect backward kernel is not involved), the ReLU mask of the model's own
    pre-activation, and the conv's weight and bias gradients from the model's own pooled features.
    *Manifested* means that at some step the conv's ``.grad`` (weight and bias together) differs
    from that reference by more than 5% (relative L2), or is not finite. In the fixed variant the only
    differences are bf16 roundings of a float32 sum and of a K = 8 GEMM (unit roundoff 2^-9, about
    0.2%; 0.15% to 0.25% with the CPU kernels, seeds 0-1); the bug's stalled accumulation over the
    9,216 non-zero addends of each branch element gives errors of 80% to 190% from step 0, the
    gradient's norm at about 15% of the reference in the first steps, in ``catalog/PT-104157/cpu``'s
    rebuild of the kernel's additions (seeds 0-2). The gradient reaching the branch's 1x1 output
    (``p.grad``) against the same reference, and the norm ratio, go into the evidence.

Trigger step
    0: the first backward already sums the branch's gradient in bf16.

Requirements
    A CUDA GPU (the bf16 atomics need SM 8.0+; older GPUs emulate them with a CAS loop that rounds
    the same way). Without CUDA the program exits with status 2 and a message on stderr.
    ``catalog/PT-104157/cpu`` rebuilds the kernel's rounded additions on the CPU, where the real
    bf16 upsample backward accumulates in float32 and is correct.
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

DEFAULT_STEPS = 30
TRIGGER_STEP = 0
BATCH = 8
IMAGE = 64  # features stay at 64x64: the pooled branch is upsampled from 1x1 to 4,096 pixels
WIDTH = 32
CLASSES = 3
DTYPE = torch.bfloat16
LR = 1e-3
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


class TinyDeepLab(nn.Module):
    """Stem + ASPP (1x1, dilated 3x3, image pooling) + projection + classifier, all at 64x64."""

    def __init__(self, fp32_upsample):
        super().__init__()
        self.fp32_upsample = fp32_upsample
        self.stem = nn.Sequential(nn.Conv2d(3, WIDTH, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(WIDTH, WIDTH, 3, padding=1), nn.ReLU())
        self.branch1 = nn.Conv2d(WIDTH, WIDTH, 1)
        self.branch2 = nn.Conv2d(WIDTH, WIDTH, 3, padding=2, dilation=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.pool_conv = nn.Conv2d(WIDTH, WIDTH, 1)
        self.project = nn.Conv2d(3 * WIDTH, WIDTH, 1)
        self.classifier = nn.Conv2d(WIDTH, CLASSES, 1)
        self.saved = {}

    def forward(self, x):
        f = self.stem(x)
        a = F.relu(self.branch1(f))
        b = F.relu(self.branch2(f))
        pooled = self.pool(f)
        z = self.pool_conv(pooled)
        p = F.relu(z)
        size = f.shape[-2:]
        if self.fp32_upsample:
            raw = F.interpolate(p.float(), size=size, mode="bilinear", align_corners=False)  # FIX: in float32
            u = raw.to(p.dtype)
        else:
            raw = u = F.interpolate(p, size=size, mode="bilinear", align_corners=False)  # BUG: bf16 atomics
        if torch.is_grad_enabled():
            p.retain_grad()
            raw.retain_grad()
        self.saved = {"pooled": pooled.detach(), "z": z.detach(), "p": p, "raw": raw}
        y = F.relu(self.project(torch.cat([a, b, u], dim=1)))
        return self.classifier(y)


def make_batch(gen, device):
    """Noisy images; blobs (a red cue) are class 1 or 2 depending on a blue tint of the whole image."""
    scene = torch.randint(0, 2, (BATCH,), generator=gen)
    images = 0.5 * torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen)
    images[:, 2] += (scene.float() * 2 - 1).view(BATCH, 1, 1) * 0.5
    labels = torch.zeros(BATCH, IMAGE, IMAGE, dtype=torch.long)
    for i in range(BATCH):
        for _ in range(3):
            h, w = torch.randint(8, 21, (2,), generator=gen).tolist()
            top = int(torch.randint(0, IMAGE - h + 1, (1,), generator=gen))
            left = int(torch.randint(0, IMAGE - w + 1, (1,), generator=gen))
            images[i, 0, top:top + h, left:left + w] += 1.5
            labels[i, top:top + h, left:left + w] = 1 + int(scene[i])
    return images.to(device=device, dtype=DTYPE), labels.to(device)


def interpolation_matrix(in_size, out_size, device):
    """M[o, i]: weight of input pixel i in output pixel o, from the float64 bilinear *forward*."""
    n_in = in_size[0] * in_size[1]
    basis = torch.eye(n_in, dtype=torch.float64, device=device).view(n_in, 1, *in_size)
    out = F.interpolate(basis, size=out_size, mode="bilinear", align_corners=False)
    return out.reshape(n_in, -1).t().contiguous()


def rel_err(value, reference):
    """Relative L2 error in float64; inf when anything is not finite or ``value`` is None."""
    if value is None:
        return math.inf
    value, reference = value.double(), reference.double()
    if not (torch.isfinite(value).all() and torch.isfinite(reference).all()):
        return math.inf
    return (value - reference).norm().item() / max(reference.norm().item(), 1e-30)


def reference_grads(model, matrix):
    """Float64 gradients of the pooling branch's conv, from the gradient that reached the upsample."""
    saved = model.saved
    grad_out = saved["raw"].grad.double()  # [B, C, H2, W2]
    n, c = grad_out.shape[:2]
    pooled = saved["pooled"].double()  # [B, C, 1, 1]
    in_size = pooled.shape[-2:]
    grad_p = (grad_out.reshape(n, c, -1) @ matrix).reshape(n, c, *in_size)
    grad_z = grad_p * (saved["z"] > 0)
    grad_w = torch.einsum("bohw,bihw->oi", grad_z, pooled).view_as(model.pool_conv.weight)
    grad_b = grad_z.sum(dim=(0, 2, 3))
    return grad_p, grad_w, grad_b


def evidence_of_setup(device):
    major, minor = torch.cuda.get_device_capability(device)
    probe = torch.zeros(1, 1, 1, 1, device=device, dtype=DTYPE)
    with torch.autocast("cuda", dtype=DTYPE):
        autocast_dtype = F.interpolate(probe, size=(2, 2), mode="bilinear", align_corners=False).dtype
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(device),
            "capability": "%d.%d" % (major, minor),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "upsample_dtype_under_autocast": str(autocast_dtype)}


def run(args, device):
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU, then moved
    model = TinyDeepLab(fp32_upsample=args.variant == "fixed").to(device=device, dtype=DTYPE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    matrix = interpolation_matrix((1, 1), (IMAGE, IMAGE), device)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_err = max_grad_p_err = 0.0
    min_norm_ratio = math.inf
    first_bad_step = None
    skipped = 0
    for step in range(args.steps):
        images, labels = make_batch(gen, device)
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()

        with torch.no_grad():
            grad_p_ref, grad_w_ref, grad_b_ref = reference_grads(model, matrix)
            weight, bias = model.pool_conv.weight, model.pool_conv.bias
            if weight.grad is None or bias.grad is None:
                got = None
            else:
                got = torch.cat([weight.grad.reshape(-1), bias.grad.reshape(-1)])
            want = torch.cat([grad_w_ref.reshape(-1), grad_b_ref.reshape(-1)])
            if want.norm().item() == 0.0:  # every unit of the branch inactive: nothing to compare
                err, grad_p_err, norm_ratio = 0.0, 0.0, 1.0
                skipped += 1
            else:
                err = rel_err(got, want)
                grad_p_err = rel_err(model.saved["p"].grad, grad_p_ref)
                norm_ratio = got.double().norm().item() / want.norm().item() if got is not None else 0.0
            pixel_acc = (logits.argmax(dim=1) == labels).float().mean().item()

        optimizer.step()

        max_err, max_grad_p_err = max(max_err, err), max(max_grad_p_err, grad_p_err)
        if math.isfinite(norm_ratio):
            min_norm_ratio = min(min_norm_ratio, norm_ratio)
        if (not math.isfinite(err) or err > REL_ERR_THRESHOLD) and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"pool_conv_grad_rel_err": err, "pool_out_grad_rel_err": grad_p_err,
                            "pool_conv_grad_norm_ratio": norm_ratio, "pixel_accuracy": pixel_acc}})

    manifested = first_bad_step is not None
    if manifested:
        summary = ("bf16 bilinear upsample of the image-pooling branch: its conv's .grad differs from the float64 "
                   "reference from step %d (max rel. err %.3g, threshold %.2g; gradient norm down to %.2f of the "
                   "reference; branch-output grad max rel. err %.3g)"
                   % (first_bad_step, max_err, REL_ERR_THRESHOLD, min_norm_ratio, max_grad_p_err))
    elif args.steps <= TRIGGER_STEP:
        summary = "no step was run, so no gradient was computed"
    else:
        summary = ("the image-pooling branch's conv .grad matched the float64 reference at every step "
                   "(max rel. err %.2g, threshold %.2g; branch-output grad max rel. err %.2g)"
                   % (max_err, REL_ERR_THRESHOLD, max_grad_p_err))
    evidence = {"max_pool_conv_grad_rel_err": max_err, "max_pool_out_grad_rel_err": max_grad_p_err,
                "min_pool_conv_grad_norm_ratio": min_norm_ratio if math.isfinite(min_norm_ratio) else None,
                "threshold": REL_ERR_THRESHOLD, "first_bad_step": first_bad_step,
                "steps_without_active_branch_unit": skipped,
                "upsample": "bilinear 1x1 -> %dx%d, align_corners=False, %s"
                            % (IMAGE, IMAGE, "float32" if args.variant == "fixed" else str(DTYPE))}
    if device.type == "cuda":
        evidence.update(evidence_of_setup(device))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-104157/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s). Run catalog/PT-104157/cpu for the CPU analogue.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    run(args, device)


if __name__ == "__main__":
    main()
