"""SilentBench reproducer for PT-191612 (CPU analogue): a float32 attn_mask read as fp16 by cuDNN attention.

The bug
    ``F.scaled_dot_product_attention`` accepts an additive ``attn_mask`` of dtype float32 next to
    fp16/bf16 query, key and value, and its cuDNN branch passes a float mask on unchanged (only a bool
    mask is converted). The cuDNN backend (``aten/src/ATen/native/cudnn/MHA.cpp``) gives the whole
    cuDNN graph one I/O data type taken from the query and declares the bias tensor with the sizes and
    strides of the mask (expanded to (B, 1 or H, L, S) in ``attention.cu``) but no data type of its own,
    so cuDNN reads the float32 mask's buffer as fp16 elements: element (b, h, i, j) at byte offset
    2 * (b*stride_b + h*stride_h + i*stride_i + j) instead of 4 * (...). Outputs and gradients are wrong
    with no error or warning. With ``nn.Transformer.generate_square_subsequent_mask`` (always float32)
    and an fp16 ``nn.MultiheadAttention``, 31 of 32 query rows come out NaN (float32 -inf, 0xFF800000,
    is the fp16 pair 0x0000, 0xFF80 in little-endian order: 0.0 and a NaN), the PR's "0.969". Reported
    in PyTorch PR 191612 (closed without a merge); PR 191964 (open) converts the bias to the query's
    dtype. The CPU has no cuDNN: CPU SDPA computes with the float32 mask correctly, so the fault cannot
    be reached here and is rebuilt.

This program
    The same training as ``catalog/PT-191612/cuda``: a one-block causal language model (token and
    position embeddings, a pre-LayerNorm ``nn.MultiheadAttention(64, 4, batch_first=True)``, an MLP,
    an LM head) cast to fp16 with ``.to(torch.float16)`` (no autocast), learning next-token prediction
    from synthetic sequences of 32 tokens (t[i+1] = t[i] + d mod 64), SGD with momentum, batch 8,
    here on the CPU; every step ends with exactly one ``optimizer.step()``. The attention call is the
    real ``attn(h, h, h, attn_mask=mask, need_weights=False)``: PyTorch's own
    ``F.multi_head_attention_forward`` leaves the float32 mask as it is, reshapes it to (1, 1, 32, 32)
    and calls SDPA. Only the SDPA backend is replaced: while the model runs its forward,
    ``rebuilt_cudnn_backend()`` (the stand-in for ``sdpa_kernel([CUDNN_ATTENTION])``) routes that call
    to ``cudnn_attention``, which rebuilds the faulty step: it converts a bool mask as the cuDNN branch
    does, expands the mask to (B, 1, L, S) as ``attention.cu`` does, and then reads the mask's bytes
    as elements of the query's dtype with the mask's own sizes, strides and storage offset
    (``cudnn_reads_bias``: a tensor of the query's dtype set on the mask's untyped storage, so the
    reader sees the first half of the float32 buffer as a contiguous fp16 (32, 32) bias, just as a
    reader with element size 2 instead of 4 does). The attention itself is then PyTorch's CPU SDPA
    with that bias (fp16 q/k/v and an fp16 bias, CPU's own kernel choice; the backward reuses the
    same bias, as cuDNN's backward graph reads the same bias tensor). The ``buggy`` variant passes the
    float32 mask of ``generate_square_subsequent_mask``; the ``fixed`` variant passes the same mask
    cast to fp16, the query's dtype (the workaround), which the same reader reads correctly. Nothing
    else differs. The dtype is fp16 as upstream: read as bf16 the same bytes give 0 and -inf (bf16
    0xFF80 is -inf), a finite but wrong mask, so a bf16 run would show wrong attention without NaN.

Oracle (checked inside the single run)
    Every step a float64 twin of the model (re-synchronised with the fp16 weights before the forward)
    computes, with the real SDPA under ``sdpa_kernel([MATH])`` and the same mask in float64, (a) the
    attention output for the very fp16 input the model's attention received and (b) the gradient of
    the same loss with respect to the attention's ``in_proj_weight``. *Manifested* means that at some
    step the model's attention output or that gradient differs from the reference by more than 5%
    (relative L2), or is not finite (a missing gradient counts as infinite). The fixed variant differs
    from the reference only by fp16 rounding (at most 5.4e-4 for the output and 9.1e-4 for the gradient,
    seeds 0-2, 30 steps); the buggy one has NaN in 96.9% of the attention's query rows (31 of 32, as
    upstream) and a NaN loss from step 0.

Trigger step
    0: the first forward already reads the mask.
"""
import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEFAULT_STEPS = 30
TRIGGER_STEP = 0
VOCAB = 64
SEQ = 32  # the PR's S
EMBED = 64  # the PR's E
HEADS = 4  # the PR's H
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


_REAL_SDPA = F.scaled_dot_product_attention
CUDNN_CALLS = {"count": 0, "bias_dtype_given": None}


def cudnn_reads_bias(bias, io_dtype):
    """What the cuDNN graph reads for ``bias``: its sizes, strides and start, over its bytes, in elements of
    ``io_dtype`` (the graph's one I/O data type; MHA.cpp declares the bias without a data type of its own)."""
    start_byte = bias.storage_offset() * bias.element_size()
    itemsize = torch.empty(0, dtype=io_dtype).element_size()
    reader = torch.empty(0, dtype=io_dtype, device=bias.device)
    return reader.set_(bias.untyped_storage(), start_byte // itemsize, bias.size(), bias.stride())


def cudnn_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """Stand-in for SDPA's cuDNN branch and ``_scaled_dot_product_cudnn_attention`` on the CPU."""
    CUDNN_CALLS["count"] += 1
    bias = attn_mask
    if bias is not None:
        CUDNN_CALLS["bias_dtype_given"] = str(bias.dtype)
        if bias.dtype == torch.bool:  # convert_boolean_attn_mask_cudnn: only a bool mask is converted
            bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill(~bias, -65504.0)
        b, _, s_q, s_kv = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
        if bias.dim() == 4:  # attention.cu expands the bias before the cuDNN call
            bias = bias.expand(b, bias.size(1), s_q, s_kv)
        else:
            bias = bias.expand(b, 1, s_q, s_kv)
        bias = cudnn_reads_bias(bias, query.dtype)  # the fault: the float32 bytes read as 16-bit elements
    return _REAL_SDPA(query, key, value, attn_mask=bias, dropout_p=dropout_p, is_causal=is_causal,
                      scale=scale, enable_gqa=enable_gqa)


@contextlib.contextmanager
def rebuilt_cudnn_backend():
    """Like ``sdpa_kernel([CUDNN_ATTENTION])``: the SDPA call of ``F.multi_head_attention_forward`` goes to
    ``cudnn_attention`` while the context is open."""
    F.scaled_dot_product_attention = cudnn_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _REAL_SDPA


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


def make_batch(gen):
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 4, (BATCH, 1), generator=gen)
    return (start + stride * torch.arange(SEQ)) % VOCAB


def rel_err(value, reference):
    """Relative L2 error in float64; inf when anything is not finite or ``value`` is None (no gradient)."""
    if value is None:
        return math.inf
    value, reference = value.double(), reference.double()
    if not (torch.isfinite(value).all() and torch.isfinite(reference).all()):
        return math.inf
    return (value - reference).norm().item() / max(reference.norm().item(), 1e-30)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared CPU

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = TinyCausalLM().to(DTYPE)
    twin = copy.deepcopy(model).double()  # float64 reference, never trained itself
    params, twin_params = list(model.parameters()), list(twin.parameters())

    mask32 = nn.Transformer.generate_square_subsequent_mask(SEQ)  # float32 0 / -inf, as in the PR
    ref_mask = mask32.double()
    if args.variant == "buggy":
        mask = mask32  # BUG: a float32 additive mask with fp16 q/k/v; the cuDNN backend reads its bytes as fp16
    else:
        mask = mask32.to(DTYPE)  # FIX: the mask in the query's dtype, which is what cuDNN assumes
    # The bias the rebuilt backend reads for this mask, as MHA hands it to SDPA (1, 1, L, S): evidence only.
    read = cudnn_reads_bias(mask.view(1, 1, SEQ, SEQ), DTYPE)[0, 0].double()
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_out_err = max_grad_err = max_nan_frac = 0.0
    first_bad_step = nan_frac_step0 = None
    steps_without_grad = 0
    for step in range(args.steps):
        tokens = make_batch(gen)
        with torch.no_grad():
            for t, p in zip(twin_params, params):
                t.copy_(p)

        optimizer.zero_grad(set_to_none=True)
        with rebuilt_cudnn_backend():  # the model's attention runs on the rebuilt cuDNN backend
            logits = model(tokens, mask)
        loss = lm_loss(logits, tokens)
        loss.backward()

        with sdpa_kernel([SDPBackend.MATH]):  # the real SDPA, outside the rebuilt backend
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
    if manifested:
        summary = ("rebuilt cuDNN backend: attention output / in_proj grad differ from the float64 MATH reference "
                   "from step %d (max rel. err %.3g / %.3g, non-finite or missing counts as inf; NaN in up to "
                   "%.1f%% of query rows; %d step(s) without an in_proj grad)"
                   % (first_bad_step, max_out_err, max_grad_err, 100 * max_nan_frac, steps_without_grad))
    elif args.steps <= TRIGGER_STEP:
        summary = "no step was run, so the mask was never read"
    else:
        summary = ("rebuilt cuDNN backend: attention output and in_proj grad matched the float64 MATH reference "
                   "at every step (max rel. err %.2g / %.2g; NaN in %.1f%% of query rows at most)"
                   % (max_out_err, max_grad_err, 100 * max_nan_frac))
    causal = torch.isneginf(mask32)
    evidence = {"max_attn_out_rel_err": max_out_err, "max_in_proj_grad_rel_err": max_grad_err,
                "max_attn_out_nan_row_frac": max_nan_frac, "threshold": REL_ERR_THRESHOLD,
                "first_bad_step": first_bad_step, "mask_dtype": str(mask.dtype), "qkv_dtype": str(DTYPE),
                "attn_out_nan_row_frac_step0": nan_frac_step0, "steps_without_in_proj_grad": steps_without_grad,
                "bias_as_read_nan_rows": int(torch.isnan(read).any(dim=-1).sum()),
                "bias_as_read_rows_equal_to_mask": int((read == mask32.double()).all(dim=-1).sum()),
                "bias_as_read_finite_rows_seeing_future": int((torch.isfinite(read).all(dim=-1)
                                                               & (causal & (read == 0)).any(dim=-1)).sum()),
                "rebuilt_cudnn_calls": CUDNN_CALLS["count"],
                "bias_dtype_given_to_backend": CUDNN_CALLS["bias_dtype_given"],
                "torch": torch.__version__}
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
