"""SilentBench reproducer for PT-191612 (CUDA): cuDNN attention reads a float32 attn_mask as fp16.

The bug
    ``F.scaled_dot_product_attention`` accepts an additive ``attn_mask`` of dtype float32 next to
    fp16/bf16 query, key and value (``validate_sdpa_input`` allows bool, float32 or the query's
    dtype), and its cuDNN branch passes a float mask on unchanged (only a bool mask is converted).
    The cuDNN backend (``aten/src/ATen/native/cudnn/MHA.cpp``) gives the whole cuDNN graph one I/O
    data type taken from the query and declares the bias tensor with sizes and strides but no data
    type of its own: cuDNN reads the float32 mask's bytes as fp16 elements. Outputs and gradients
    are wrong with no error or warning. With ``nn.Transformer.generate_square_subsequent_mask``
    (always float32) and an fp16 ``nn.MultiheadAttention``, 31 of 32 query rows come out NaN
    (float32 -inf is the fp16 pair 0x0000, 0xFF80, and 0xFF80 is a NaN), the PR's "0.969". cuDNN
    attention is the default SDPA backend on SM 9.0 / 10.x once the runtime cuDNN is newer than
    9.15 (torch 2.11's wheels bundle one), so a plain H100/H200 run hits it. Reported in PyTorch
    PR 191612 (30 Jul 2026, closed without a merge); PR 191964 (open, Aug 2026) converts the bias
    to the query's dtype; the test that fails is ``test_cudnn_attention_attn_mask_dtype``.

This program
    A one-block causal language model (token and position embeddings, a pre-LayerNorm
    ``nn.MultiheadAttention(64, 4, batch_first=True)`` as in the PR's example, an MLP, an LM head)
    is cast to fp16 with ``.to(dtype)`` as the PR's example does (no autocast, so the mask reaches
    SDPA as given) and learns next-token prediction on one GPU from synthetic sequences of 32
    tokens (t[i+1] = t[i] + d mod 64, d drawn per sequence), SGD with momentum, batch 8; every step
    ends with exactly one ``optimizer.step()``. The attention call is ``attn(h, h, h,
    attn_mask=mask, need_weights=False)`` without ``is_causal``: with ``is_causal=True`` and no
    padding mask ``F.multi_head_attention_forward`` drops the mask, and with ``need_weights=True``
    it does not call SDPA; as written, ``_canonical_mask`` leaves a float mask as it is and SDPA
    gets it in float32. The ``buggy`` variant passes the float32 mask of
    ``generate_square_subsequent_mask``; the ``fixed`` variant passes the same mask cast to fp16,
    the query's dtype (a bool mask would come to the same, since ``nn.MultiheadAttention`` turns it
    into a float mask of the query's dtype). Nothing else differs. The fixed mask keeps the -inf
    entries of ``generate_square_subsequent_mask`` (now fp16 -inf, 0xFC00). PyTorch has filled masks
    with finite values for cuDNN before (``convert_boolean_attn_mask_cudnn`` fills a bool mask's
    masked-out entries with -65504 as a workaround for an "-inf issue with cuDNN"), but no row here is
    fully masked (each query sees at least itself). A GPU run still shows whether -inf misbehaves: the
    evidence has each variant's fraction of attention-output rows with a NaN.

    Which backend runs: model forwards run under ``sdpa_kernel([CUDNN_ATTENTION])`` (unless the
    probes below find it refused), so that the run does not depend on the default priority order
    (``check_prefer_cudnn_attention``, the cuDNN version, ``TORCH_CUDNN_SDPA_DEPRIORITIZED``).
    Before training, the model on a zero batch probes that backend, with the fp16 mask and with the
    variant's mask, twice: a forward without autograd (all the PR showed, in eval) and, separately,
    a forward and backward (anomaly detection switched off inside the probe, so that a NaN gradient
    is not taken for a refusal). A probe that fails records the error and the UserWarnings in which
    SDPA gives its reasons for refusing a backend. If every probe runs, training uses
    ``sdpa_kernel([CUDNN_ATTENTION])``. If the forwards run but cuDNN refuses a backward (not
    expected at head dim 16, a multiple of 8, but not checked without a GPU), the training forward
    and backward run on whatever SDPA picks (no ``sdpa_kernel`` context) and every step adds a
    forward without autograd under ``sdpa_kernel([CUDNN_ATTENTION])``, whose attention output is the
    one the oracle checks: the symptom is in the forward output, so it still shows, and the evidence
    says which backend ran what. Only if a forward probe fails (no cuDNN attention on this GPU or
    build, or a build that rejects the float32 mask) do both this run's forwards use
    ``sdpa_kernel([MATH])``, and the bug cannot show (``manifested: false``, the evidence says why).
    The evidence records the backends enabled, the backend the default order would pick for this
    call (``torch._fused_sdp_choice``), and the attention node of step 0's autograd graph
    (``ScaledDotProductCudnnAttentionBackward0`` when cuDNN ran the backward). That the backend is
    forced, and the probes' fallbacks, are this program's own choices, made because the default
    order could not be checked without a GPU.

Oracle (checked inside the single run)
    Every step a float64 twin of the model (re-synchronised with the fp16 weights before the
    forward) computes, under ``sdpa_kernel([MATH])`` with the same mask in float64, (a) the
    attention output for the very fp16 input the model's attention received and (b) the gradient
    of the same loss with respect to the attention's ``in_proj_weight``. *Manifested* means that
    at some step the model's attention output or that gradient differs from the reference by more
    than 5% (relative L2), or is not finite; a step that leaves ``in_proj_weight.grad`` unset (a
    detector that swallows a backward aborted by the buggy variant's NaN loss) counts as an infinite
    gradient error. The fixed variant differs from the float64 reference only by fp16 rounding
    (unit roundoff 4.9e-4) of a few matmuls and a softmax: on the CPU (math
    backend, which computes attention in float32 between fp16 projections) at most 5.2e-4 for the
    output and 9.1e-4 for the gradient (seeds 0-2, 30 steps). A fused fp16 kernel adds rounding of the
    probabilities of the same order, so 5% leaves a margin of more than ten times (to be confirmed
    on a GPU), while the bug gives NaN from step 0.

Trigger step
    0: the first forward already reads the mask.

Requirements
    A CUDA GPU; to see the bug, one where cuDNN attention runs (SM 8.0+, cuDNN 9) and a torch
    build without a fix (torch 2.11 on an H100/H200 is the setting described). Without CUDA the
    program exits with status 2 and a message on stderr. ``catalog/PT-191612/cpu`` rebuilds
    cuDNN's read of the bias on the CPU, where SDPA computes with the float32 mask correctly.
"""
import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEFAULT_STEPS = 30
TRIGGER_STEP = 0
VOCAB = 64
SEQ = 32  # the PR's S; also keeps clear of the cuDNN backward bug at S % 128 == 64 (issue 196678)
EMBED = 64  # the PR's E
HEADS = 4  # the PR's H: head dim 16, a multiple of 8 as cuDNN requires
BATCH = 8
DTYPE = torch.float16  # the PR's dtype
LR = 0.05
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


class TinyCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, EMBED)
        self.pos = nn.Embedding(SEQ, EMBED)
        self.ln1 = nn.LayerNorm(EMBED)
        self.attn = nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(EMBED)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 4 * EMBED), nn.GELU(), nn.Linear(4 * EMBED, EMBED))
        self.head = nn.Linear(EMBED, VOCAB)
        self.attn_in = self.attn_out = None

    def forward(self, tokens, mask):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)  # SDPA path; no is_causal
        self.attn_in, self.attn_out = h.detach(), a.detach()
        x = x + a
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


def lm_loss(logits, tokens):
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def make_batch(gen, device):
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 4, (BATCH, 1), generator=gen)
    return ((start + stride * torch.arange(SEQ)) % VOCAB).to(device)


def rel_err(value, reference):
    """Relative L2 error in float64; inf when anything is not finite or ``value`` is None (no gradient)."""
    if value is None:
        return math.inf
    value, reference = value.double(), reference.double()
    if not (torch.isfinite(value).all() and torch.isfinite(reference).all()):
        return math.inf
    return (value - reference).norm().item() / max(reference.norm().item(), 1e-30)


def probe(model, mask, backend, device):
    """The model under ``backend`` only, on a zero batch: {"forward": ..., "backward": ...}, each None if
    it ran, else the error and the warnings (SDPA's reasons for refusing a backend) it raised."""
    tokens = torch.zeros(BATCH, SEQ, dtype=torch.long, device=device)
    result = {}
    for stage in ("forward", "backward"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                # anomaly detection off: a NaN gradient (the bug itself) is not a refusal of the backend
                with sdpa_kernel([backend]), torch.autograd.set_detect_anomaly(False):
                    if stage == "forward":
                        with torch.no_grad():
                            model(tokens, mask)
                    else:
                        model(tokens, mask).float().sum().backward()
                torch.cuda.synchronize()
                result[stage] = None
            except Exception as exc:
                reasons = list(dict.fromkeys(str(w.message).strip()[:500] for w in caught))
                result[stage] = {"error": ("%s: %s" % (type(exc).__name__, str(exc).strip()))[:1000],
                                 "warnings": reasons[:20]}
            finally:
                model.zero_grad(set_to_none=True)
    return result


def attention_nodes(loss):
    """Names of the autograd nodes of an attention kernel reachable from ``loss``."""
    names, seen, todo = set(), set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "Attention" in fn.name() or "SafeSoftmax" in fn.name():
            names.add(fn.name())
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return sorted(names)


def default_choice(mask, device):
    """The backend the default priority order picks for the model's SDPA call (outside any context)."""
    names = {int(v): k for k, v in SDPBackend.__members__.items()}
    q = torch.zeros(BATCH, HEADS, SEQ, EMBED // HEADS, dtype=DTYPE, device=device, requires_grad=True)
    try:
        return names.get(torch._fused_sdp_choice(q, q, q, mask.view(1, 1, SEQ, SEQ)), "unknown")
    except Exception as exc:  # private API: evidence only
        return "unavailable (%s)" % type(exc).__name__


def gpu_evidence(device):
    major, minor = torch.cuda.get_device_capability(device)
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(device), "capability": "%d.%d" % (major, minor),
            "sdp_enabled": {"cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                            "flash": torch.backends.cuda.flash_sdp_enabled(),
                            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                            "math": torch.backends.cuda.math_sdp_enabled()},
            "env": {k: os.environ.get(k) for k in ("TORCH_CUDNN_SDPA_DEPRIORITIZED", "TORCH_CUDNN_SDPA_PREFERRED")}}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-191612/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s). Run catalog/PT-191612/cpu for the CPU analogue.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU, then moved
    model = TinyCausalLM().to(device=device, dtype=DTYPE)
    twin = copy.deepcopy(model).double()  # float64 reference, never trained itself
    params, twin_params = list(model.parameters()), list(twin.parameters())

    mask32 = nn.Transformer.generate_square_subsequent_mask(SEQ, device=device)  # float32 0 / -inf, as in the PR
    ref_mask = mask32.double()
    if args.variant == "buggy":
        mask = mask32  # BUG: a float32 additive mask with fp16 q/k/v; cuDNN reads its bytes as fp16
    else:
        mask = mask32.to(DTYPE)  # FIX: the mask in the query's dtype, which is what cuDNN assumes

    probes = {"query_dtype_mask": probe(model, mask32.to(DTYPE), SDPBackend.CUDNN_ATTENTION, device),
              "variant_mask": probe(model, mask, SDPBackend.CUDNN_ATTENTION, device)}
    forward_ok = all(p["forward"] is None for p in probes.values())
    cudnn_ok = forward_ok and all(p["backward"] is None for p in probes.values())
    # cudnn_ok: train on cuDNN; forward_ok only: train on SDPA's own pick, check a separate cuDNN forward
    backend = SDPBackend.CUDNN_ATTENTION if forward_ok else SDPBackend.MATH
    train_ctx = (lambda: sdpa_kernel([backend])) if cudnn_ok or not forward_ok else contextlib.nullcontext
    separate_forward = forward_ok and not cudnn_ok
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_out_err = max_grad_err = max_nan_frac = 0.0
    first_bad_step = nan_frac_step0 = None
    steps_without_grad = 0
    nodes = []
    for step in range(args.steps):
        tokens = make_batch(gen, device)
        with torch.no_grad():
            for t, p in zip(twin_params, params):
                t.copy_(p)

        optimizer.zero_grad(set_to_none=True)
        with train_ctx():
            loss = lm_loss(model(tokens, mask), tokens)
        loss.backward()
        if step == 0:
            nodes = attention_nodes(loss)
        if separate_forward:  # cuDNN refused the backward: its forward output, the symptom, is checked
            with torch.no_grad(), sdpa_kernel([backend]):
                model(tokens, mask)  # same weights and batch; sets model.attn_in / attn_out

        with sdpa_kernel([SDPBackend.MATH]):
            h = model.attn_in.double()
            ref_out, _ = twin.attn(h, h, h, attn_mask=ref_mask, need_weights=False)
            ref_loss = lm_loss(twin(tokens, ref_mask), tokens)
            (ref_grad,) = torch.autograd.grad(ref_loss, [twin.attn.in_proj_weight])
        out_err = rel_err(model.attn_out, ref_out)
        grad_err = rel_err(model.attn.in_proj_weight.grad, ref_grad)  # inf if the backward left no grad
        steps_without_grad += model.attn.in_proj_weight.grad is None
        nan_frac = torch.isnan(model.attn_out).any(dim=-1).float().mean().item()
        if step == 0:
            nan_frac_step0 = nan_frac

        optimizer.step()

        max_out_err, max_grad_err = max(max_out_err, out_err), max(max_grad_err, grad_err)
        max_nan_frac = max(max_nan_frac, nan_frac)
        if max(out_err, grad_err) > REL_ERR_THRESHOLD and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"attn_out_rel_err": out_err, "in_proj_grad_rel_err": grad_err,
                            "attn_out_nan_row_frac": nan_frac, "reference_loss": ref_loss.item()}})

    manifested = first_bad_step is not None
    failed = [(name, stage, p[stage]["error"]) for name, p in probes.items() for stage in ("forward", "backward")
              if p[stage]]
    if separate_forward:
        ran = ("SDPA backend %s for the attention output (a separate forward without autograd; cuDNN refused "
               "the backward: %s: %s), SDPA's own pick for training (step-0 node %s)"
               % (backend.name, failed[0][0], failed[0][2][:200], nodes or "none"))
    else:
        ran = "SDPA backend %s" % backend.name
    if manifested:
        summary = ("%s: attention output / in_proj grad differ from the float64 MATH reference from step %d "
                   "(max rel. err %.3g / %.3g, non-finite or missing counts as inf; NaN in up to %.1f%% of "
                   "query rows; %d step(s) without an in_proj grad)"
                   % (ran, first_bad_step, max_out_err, max_grad_err, 100 * max_nan_frac, steps_without_grad))
    elif not forward_ok:
        summary = ("cuDNN attention could not run a forward here (%s %s: %s), so the run used the MATH backend "
                   "and the bug could not show; max rel. err %.2g / %.2g"
                   % (failed[0][0], failed[0][1], failed[0][2][:200], max_out_err, max_grad_err))
    elif args.steps <= TRIGGER_STEP:
        summary = "no step was run, so the mask was never read"
    else:
        summary = ("%s: attention output and in_proj grad matched the float64 MATH reference at every step "
                   "(max rel. err %.2g / %.2g; NaN in %.1f%% of query rows at most)"
                   % (ran, max_out_err, max_grad_err, 100 * max_nan_frac))
    evidence = {"max_attn_out_rel_err": max_out_err, "max_in_proj_grad_rel_err": max_grad_err,
                "max_attn_out_nan_row_frac": max_nan_frac, "threshold": REL_ERR_THRESHOLD,
                "first_bad_step": first_bad_step, "mask_dtype": str(mask.dtype), "qkv_dtype": str(DTYPE),
                "attn_out_nan_row_frac_step0": nan_frac_step0, "steps_without_in_proj_grad": steps_without_grad,
                "mask_has_neg_inf": bool(torch.isneginf(mask).any()),
                "fully_masked_rows": int(torch.isneginf(mask).all(dim=-1).sum()),
                "sdpa_backend_forced": backend.name if not separate_forward else "none (SDPA's own pick)",
                "attn_out_backend": backend.name + (" (separate forward without autograd)" if separate_forward
                                                    else ""),
                "cudnn_probes": probes,
                "step0_attention_autograd_nodes": nodes, "default_sdp_choice": default_choice(mask, device)}
    evidence.update(gpu_evidence(device))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
