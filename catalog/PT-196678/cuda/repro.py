"""SilentBench reproducer for PT-196678 (CUDA): cuDNN attention backward returns NaN grad_q for seq_len % 128 == 64.

The bug
    On H100/H200 (sm90), ``F.scaled_dot_product_attention`` with the cuDNN backend returns NaN in
    ``grad_q`` (forward, ``grad_k`` and ``grad_v`` are fine) when (1) an explicit ``attn_mask`` is
    passed (bool or float; an all-True mask too), (2) the key length is 64 modulo 128 (64, 192,
    ..., 704, ...) and (3) some query row's logsumexp is below -ln(FLT_MAX) = -88.7. The sm90
    backward kernel walks the keys in 128-wide tiles but decides the out-of-bounds mask at 64-row
    granularity, so the zero-filled half of the last tile is scored 0 instead of -inf:
    ``exp(0 - lse)`` overflows to inf and ``inf * 0`` (zero-filled K) turns the row of dQ into NaN.
    EFFICIENT and MATH are clean on the same inputs, and so is cuDNN with ``is_causal=True`` and no
    mask tensor. Reported with torch 2.13.0, CUDA 13.0, cuDNN 9.20.0.48 ("regression since 2.11",
    where cuDNN became the default SDPA backend on sm90); fixed in cuDNN 9.26, which PyTorch PR
    196861 adopts together with guards for cuDNN <= 9.25.1. In TRL's DPO training (Qwen2.5-0.5B,
    layer 8 head 3, a "massive activation" head) ``grad_norm`` turned NaN while the loss looked normal.

This program
    A 2-layer pre-LN causal language model (d_model 256, 4 heads of 64, Qwen-style q/k/v projections
    with biases) is trained on one GPU under bf16 autocast with Adam(lr=1e-3) and gradient clipping
    at 1.0, on batches of 8 synthetic Markov-chain sequences of 96..192 tokens right-padded to 192
    (192 % 128 == 64). As Hugging Face's SDPA path does for a padded batch, the attention gets an
    explicit 4-D bool mask (causal AND key-not-padding, shape [8, 1, 192, 192]) and
    ``is_causal=False``. Head 0 of layer 0 starts with a large bias on one query and one key channel
    (32.5 and -32), like the massive q/k biases of Qwen2-family heads: every logit of that head is
    shifted by about -130, so its rows' logsumexp sit near -125. Softmax ignores a uniform shift, so
    the forward pass and the loss are unchanged and training never removes it (its gradient is about
    zero); only the faulty backward sees it. (A single down-weighted key does not lower a row's
    logsumexp; every key of the row must be far below zero, which a shift like this gives.) When
    the clipped gradient norm is not finite, the loop drops the gradients before
    ``optimizer.step()`` (the skip-on-non-finite guard of Megatron-style trainers), so the loss stays
    finite and normal-looking while the model silently stops learning.
    The ``buggy`` variant runs attention under ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``, the
    backend PyTorch picks by default for these inputs on H100/H200; the ``fixed`` variant runs the
    same call under ``sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)``, which is what
    ``torch.backends.cuda.enable_cudnn_sdp(False)`` leaves for a masked call (the workaround of the
    reports). Nothing else differs, except what each does when its backend is refused. Before
    training, one forward (under the same autocast) and backward of the model itself, on a padded
    batch of this run's shapes, strides and mask kind, probes the forced backend; if it raises (a
    build without cuDNN attention, or one with PR 196861's guards), the error's first line ("No
    available kernel...") and the UserWarnings that carry the dispatcher's reasons are recorded in
    the oracle's evidence, and the run falls back: the ``buggy`` variant to PyTorch's default
    dispatch, the ``fixed`` variant to ``sdpa_kernel([EFFICIENT_ATTENTION, MATH])``, never to
    cuDNN (on an H200 the default dispatch is cuDNN, which would put the bug into the fixed run).

Oracle (checked inside the single run)
    Every step, for each layer, the gradient that reached the attention's query (``grad_q``) is
    compared with a reference computed another way: the MATH backend in float32 on the same bf16
    q, k, v (upcast), the same mask and the same upstream gradient, outside autocast. *Manifested*
    means that at some step a ``grad_q`` entry is not finite where the reference is finite, or the
    relative L2 deviation over the finite entries exceeds 0.25. The threshold: a correct bf16 kernel
    deviates from the float32 reference through bf16 rounding of its saved output and of the
    probabilities (unit roundoff 2**-8 = 0.4%), amplified for head 0 by the large constant key
    channel (|k| / |k - mean k| ~ 7), which bounds it at a few percent; 0.25 is far above that and
    far below the infinite deviation of the fault. A ``grad_q`` (or upstream gradient) that is
    missing counts as all its entries non-finite: under a detector such as ``detect_anomaly`` the
    faulty backward raises at ``ScaledDotProductCudnnAttentionBackward0``, and if that error is
    swallowed, the gradient never reaches the query. The grad norm, the skipped steps and each step's
    largest row logsumexp of the shifted head are evidence, as is, at the end, the issue's own
    12-line repro (every logit about -120, lower-triangular mask) run with the variant's backend at
    key lengths 128, 192, 256 and 704: it tells an unaffected build from a missed trigger.

Trigger step
    0: the shifted head is there from the first step, and the first backward is already wrong.

Requirements
    An H100/H200-class GPU (sm90) with a cuDNN before 9.26 and a torch whose dispatcher accepts
    cuDNN attention for these inputs; on any other GPU or build both variants report
    ``manifested: false``. Without CUDA the program exits with status 2 and a message on stderr.
    There is no CPU analogue: the fault lives in cuDNN's sm90 backward kernel and has no CPU
    counterpart. Not yet run on a GPU when written: the uncertain points (whether a [B, 1, L, L]
    padding-and-causal mask reaches the same kernel as the issue's [1, 1, L, L] one, the cuDNN
    version the node's torch loads, the measured deviation of the fixed variant) are recorded in
    the oracle's evidence.
"""
import argparse
import contextlib
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
BATCH = 8
SEQ_LEN = 192  # 192 % 128 == 64: the key lengths the faulty kernel mishandles
MIN_LEN = 96
VOCAB = 64
PAD_ID = 0
D_MODEL = 256
HEADS = 4
HEAD_DIM = D_MODEL // HEADS
LAYERS = 2
LR = 1e-3
MAX_GRAD_NORM = 1.0
SHIFT_Q, SHIFT_K = 32.5, -32.0  # head 0, channel 0 of layer 0: logits shifted by 32.5 * -32 / 8 = -130
LSE_OVERFLOW = -math.log(torch.finfo(torch.float32).max)  # -88.72: exp(0 - lse) overflows float32 below it
REL_DEV_THRESHOLD = 0.25
BACKENDS = {"buggy": SDPBackend.CUDNN_ATTENTION, "fixed": SDPBackend.EFFICIENT_ATTENTION}
# when the forced backend is refused: the buggy variant takes the default dispatch (None), the fixed one never cuDNN
FALLBACKS = {"buggy": None, "fixed": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]}
SWEEP_LENGTHS = [128, 192, 256, 704]
DEVICE_TYPE = "cuda"


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


def backend_context(backend):
    """``sdpa_kernel(backend)`` (one backend or a list), or PyTorch's default dispatch when ``backend`` is None."""
    return sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()


def backend_name(backend):
    if backend is None:
        return "default dispatch"
    return "+".join(b.name for b in backend) if isinstance(backend, (list, tuple)) else backend.name


class Attention(nn.Module):
    """Qwen-style self-attention: q/k/v projections with biases, SDPA with an explicit bool mask."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(D_MODEL, D_MODEL)
        self.k_proj = nn.Linear(D_MODEL, D_MODEL)
        self.v_proj = nn.Linear(D_MODEL, D_MODEL)
        self.o_proj = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.backend = None
        self.saved = None

    def forward(self, x, mask):
        b, length, _ = x.shape
        q, k, v = (proj(x).view(b, length, HEADS, HEAD_DIM).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        with backend_context(self.backend):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # BUG (buggy): cuDNN's sm90 backward
        if torch.is_grad_enabled():  # kept for the oracle: grad_q and the upstream gradient
            q.retain_grad()
            out.retain_grad()
            self.saved = (q, k, v, out)
        return self.o_proj(out.transpose(1, 2).reshape(b, length, D_MODEL))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 2 * D_MODEL), nn.GELU(), nn.Linear(2 * D_MODEL, D_MODEL))

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ_LEN, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        with torch.no_grad():  # the shifted ("massive bias") head: one query and one key channel of head 0
            self.blocks[0].attn.q_proj.bias[0] = SHIFT_Q
            self.blocks[0].attn.k_proj.bias[0] = SHIFT_K

    def forward(self, ids, mask):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def attention_mask(lengths, device):
    """Hugging Face's SDPA mask for a right-padded batch: causal AND key-not-padding, [B, 1, L, L] bool."""
    causal = torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool, device=device).tril()
    valid = torch.arange(SEQ_LEN, device=device)[None, :] < lengths.to(device)[:, None]
    return causal[None, None] & valid[:, None, None, :]


def make_batch(transition, gen, device):
    lengths = torch.randint(MIN_LEN, SEQ_LEN + 1, (BATCH,), generator=gen)
    tokens = torch.empty(BATCH, SEQ_LEN + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(1, VOCAB, (BATCH,), generator=gen)
    for t in range(SEQ_LEN):
        tokens[:, t + 1] = torch.multinomial(transition[tokens[:, t]], 1, generator=gen).squeeze(1)
    position = torch.arange(SEQ_LEN)[None, :]
    ids = torch.where(position < lengths[:, None], tokens[:, :-1], PAD_ID)
    targets = torch.where(position < lengths[:, None], tokens[:, 1:], -100)
    return ids.to(device), targets.to(device), attention_mask(lengths, device)


def reference_grad_q(saved, mask):
    """grad_q and its float32 MATH reference (same bf16 inputs, mask and upstream gradient), and row logsumexps.

    grad_q and the reference are None when q.grad or out.grad is missing (a backward that raised, e.g. under
    ``detect_anomaly``, and whose error was swallowed); the caller counts that as every entry non-finite.
    """
    q, k, v, out = saved
    q32 = q.detach().float().requires_grad_(True)
    k32, v32 = k.detach().float(), v.detach().float()
    with torch.no_grad():
        scores = (q32 @ k32.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
        lse = scores.masked_fill(~mask, float("-inf")).logsumexp(dim=-1)  # [B, H, L]
    if q.grad is None or out.grad is None:
        return None, None, lse
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        o32 = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask)
        (ref,) = torch.autograd.grad(o32, q32, out.grad.float())
    return q.grad.detach().float(), ref, lse


def compare(got, ref):
    """(entries non-finite where the reference is finite, relative L2 deviation over the entries finite in both)."""
    got_ok, ref_ok = torch.isfinite(got), torch.isfinite(ref)
    nonfinite = int((~got_ok & ref_ok).sum().item())
    both = got_ok & ref_ok
    ref_norm = ref[both].double().norm().item()
    rel = (got[both] - ref[both]).double().norm().item() / max(ref_norm, 1e-30)
    return nonfinite, rel


def probe_backend(model, backend, device):
    """One forward (bf16 autocast) and backward of the model itself under ``backend`` alone, on a padded batch.

    Returns (None if it ran, else the error's first line; the UserWarnings raised meanwhile, which carry the
    dispatcher's reasons for refusing a backend). Leaves the model's gradients cleared and its backend unset.
    """
    ids = torch.ones(BATCH, SEQ_LEN, dtype=torch.long, device=device)
    mask = attention_mask(torch.full((BATCH,), MIN_LEN), device)  # the [B, 1, L, L] padding-and-causal kind
    for block in model.blocks:
        block.attn.backend = backend
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
                logits = model(ids, mask)
            logits.float().sum().backward()
            torch.cuda.synchronize(device)
        except RuntimeError as exc:
            error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        finally:
            model.zero_grad(set_to_none=True)
            for block in model.blocks:
                block.attn.backend = block.attn.saved = None
    reasons = []
    for caught_warning in caught:
        text = str(caught_warning.message).strip()[:300]
        if issubclass(caught_warning.category, UserWarning) and text not in reasons:
            reasons.append(text)
    return error, reasons[:12]


def issue_repro(backend, length, device):
    """The issue's 12-line repro at one key length: non-finite grad_q entries (None if the backend refuses it)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = (torch.randn(1, 1, length, HEAD_DIM, generator=gen) * 0.1).to(device, torch.bfloat16)
    k = (torch.randn(1, 1, length, HEAD_DIM, generator=gen) * 0.1).to(device, torch.bfloat16)
    v = torch.randn(1, 1, length, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(HEAD_DIM)  # every logit ~ -120: every row's lse < -88.7
    for tensor in (q, k, v):
        tensor.requires_grad_(True)
    mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
    grad_out = torch.randn(1, 1, length, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
    try:
        with backend_context(backend):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask).backward(grad_out)
    except RuntimeError:
        return None
    if q.grad is None:  # a backward that raised and whose error was swallowed: count every entry
        return q.numel()
    return int((~torch.isfinite(q.grad)).sum().item())


def default_backend(saved, mask):
    """The backend PyTorch's dispatcher picks for layer 0's inputs with no sdpa_kernel context."""
    try:
        q, k, v, _ = saved
        choice = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False))
        names = {int(member.value): name for name, member in SDPBackend.__members__.items()}
        return names.get(choice, str(choice))
    except Exception as exc:  # a private helper: record rather than fail
        return "unknown (%s)" % type(exc).__name__


def environment(device):
    props = torch.cuda.get_device_properties(device)
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(device), "capability": "%d.%d" % (props.major, props.minor),
            "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled()}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-196678/cuda needs a CUDA GPU (H100/H200 for the bug), but torch.cuda.is_available() is "
                         "False (torch %s); the bug has no CPU analogue.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device(DEVICE_TYPE, 0)
    torch.backends.cuda.matmul.allow_tf32 = False  # a float32 reference that is float32

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU, then moved
    transition = torch.softmax(2.0 * torch.randn(VOCAB, VOCAB, generator=gen), dim=1)
    transition[:, PAD_ID] = 0.0  # the pad id never occurs as a token
    model = TinyLM().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    backend = BACKENDS[args.variant]
    refusal, probe_warnings = probe_backend(model, backend, device)
    if refusal is not None:  # the forced backend refuses these inputs: buggy -> default dispatch, fixed -> no cuDNN
        backend = FALLBACKS[args.variant]
    for block in model.blocks:
        block.attn.backend = backend

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    first_bad_step = None
    max_rel_dev = 0.0
    nonfinite_total = 0
    skipped_steps = 0
    missing_grads = 0
    max_row_lse = -math.inf
    dispatch_default = None
    for step in range(args.steps):
        ids, targets, mask = make_batch(transition, gen, device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
            logits = model(ids, mask)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
        loss.backward()

        nonfinite, rel_dev = 0, 0.0
        for index, block in enumerate(model.blocks):
            got, ref, lse = reference_grad_q(block.attn.saved, mask)
            if got is None:  # q.grad or out.grad missing: the backward raised (error swallowed); all non-finite
                missing_grads += 1
                layer_nonfinite, layer_rel = block.attn.saved[0].numel(), 0.0
            else:
                layer_nonfinite, layer_rel = compare(got, ref)
            nonfinite += layer_nonfinite
            rel_dev = max(rel_dev, layer_rel)
            if index == 0:
                step_lse = lse[:, 0].max().item()  # the shifted head's largest row logsumexp
        if dispatch_default is None:
            dispatch_default = default_backend(model.blocks[0].attn.saved, mask)
        for block in model.blocks:
            block.attn.saved = None

        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM).item()
        skipped = not math.isfinite(grad_norm)
        if skipped:  # the usual guard: a step whose gradient is not finite is skipped
            optimizer.zero_grad(set_to_none=True)
        optimizer.step()

        skipped_steps += int(skipped)
        nonfinite_total += nonfinite
        max_rel_dev = max(max_rel_dev, rel_dev)
        max_row_lse = max(max_row_lse, step_lse)
        if (nonfinite > 0 or rel_dev > REL_DEV_THRESHOLD) and first_bad_step is None:
            first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"grad_norm": grad_norm, "grad_q_nonfinite": float(nonfinite),
                            "grad_q_rel_dev": rel_dev, "shifted_head_max_row_lse": step_lse,
                            "skipped_step": float(skipped)}})

    sweep = {str(length): issue_repro(backend, length, device) for length in SWEEP_LENGTHS}
    manifested = first_bad_step is not None
    used = backend_name(backend)
    if refusal is not None:
        used += " (%s refused: %s)" % (BACKENDS[args.variant].name, refusal)
    if manifested:
        summary = ("grad_q from %s has %d non-finite entries where the float32 MATH reference is finite (max rel. "
                   "dev. %.3g; %d layer-steps with no grad_q at all, counted as non-finite) from step %d; %d/%d "
                   "optimizer steps skipped for a NaN grad norm while the loss stayed finite"
                   % (used, nonfinite_total, max_rel_dev, missing_grads, first_bad_step, skipped_steps, args.steps))
    else:
        summary = ("grad_q from %s matched the float32 MATH reference at every step (max rel. dev. %.2g, threshold "
                   "%.2g); issue repro non-finite grad_q by key length: %s" % (used, max_rel_dev, REL_DEV_THRESHOLD,
                                                                               sweep))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"backend": used, "forced_backend_refusal": refusal,
                         "forced_backend_probe_warnings": probe_warnings, "default_backend": dispatch_default,
                         "grad_q_nonfinite_total": nonfinite_total, "grad_q_missing_layer_steps": missing_grads,
                         "max_grad_q_rel_dev": max_rel_dev,
                         "threshold": REL_DEV_THRESHOLD, "first_bad_step": first_bad_step,
                         "skipped_steps": skipped_steps, "shifted_head_max_row_lse": max_row_lse,
                         "lse_overflow_bound": LSE_OVERFLOW, "seq_len": SEQ_LEN, "head_dim": HEAD_DIM,
                         "issue_repro_grad_q_nonfinite": sweep, **environment(device)}})


if __name__ == "__main__":
    main()
