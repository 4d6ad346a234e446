"""SilentBench clean reference pipeline: a 340M-parameter GPT-style LM trained on one GPU under bf16 autocast.

What it trains
    A decoder-only transformer language model of its own ``nn.Module`` code: token and learned
    position embeddings, 8 pre-LayerNorm blocks (d_model 1792, 14 heads of 128, causal
    self-attention through ``F.scaled_dot_product_attention(is_causal=True)``, a GELU MLP of
    7168), a final LayerNorm and an untied linear head over an 8192-token vocabulary; GPT-2's
    initialisation (normal 0.02, residual projections scaled by 1/sqrt(2 * layers)), no dropout.
    It learns next-token prediction with cross-entropy and ``torch.optim.AdamW(lr=3e-4,
    betas=(0.9, 0.95), weight_decay=0.1, fused=True)``, weight decay on the matrices only
    (biases, LayerNorms and embeddings in a group without it), gradients clipped to a global
    norm of 1.0. The learning rate follows ``torch.optim.lr_scheduler.LambdaLR``: linear warmup
    over the first 10% of the steps (starting at 1/warmup of the peak, never 0), then cosine
    decay to 10% of the peak at the last step. Parameters, gradients and optimizer state are
    float32; the forward pass and the loss run under ``torch.autocast("cuda", torch.bfloat16)``
    (no gradient scaler), ``backward()`` outside it: the usual mixed precision on Hopper.
    No ``torch.compile`` and no activation checkpointing. The data are generated on the GPU
    from the seed, never downloaded: each sequence is a run of token pairs, the first of a
    pair drawn from a Zipf(1.0) distribution over the vocabulary (its ranks shuffled by the
    seed), the second a fixed function of the first (a permutation drawn from the seed), so
    that half the tokens are predictable from the previous one. A fresh batch of 32 sequences
    of 1024 tokens (32,768 tokens) is drawn every step; 8 held-out sequences are drawn first.

Size and cost (what it is for)
    It is the benchmark's GPU workload of realistic size, on which a GPU evaluation measures
    each detector's overhead (evaluation/overhead.py times the steady step from the step records
    after 5 warm-up steps; on the tiny CPU pipelines a step takes milliseconds, so their
    overhead says little about a real training job). Parameters: 8 blocks x (12 x 1792^2 + 13 x
    1792) = 308.5M, embeddings 8192 x 1792 + 1024 x 1792 = 16.5M, head 14.7M: 339.7M in all,
    323.0M of them in matrix products. Per step, forward and backward: 6 x 323.0M x 32,768
    tokens = 63.5 TFLOP in the linear layers, plus 12 x 8 layers x 1024 x 1792 x 32,768 = 5.8
    TFLOP of attention scores and values (half of it skipped by a causal kernel): 66-69 TFLOP.
    At 400 TFLOP/s, about 40% of an H100's or H200's 989 dense bf16 TFLOP/s and about what eager
    PyTorch sustains, a step takes ~170 ms; even at 55% (544 TFLOP/s, more than eager code
    reaches) it takes ~125 ms, and the peak itself would take 67 ms. An H200 and an H100 have
    the same tensor cores; the H100's slower memory (3.35 vs 4.8 TB/s) adds ~5-10 ms for
    LayerNorm, GELU, casts, the loss over 268M logits and the fused AdamW: ~125-175 ms a step on
    an H200, ~130-185 ms on an H100, so the default 20 steps (5 warm-up, 14 timed intervals)
    take 3-4 s besides start-up. GPU memory: float32 parameters 1.36 GB, AdamW's two moments
    2.72 GB, the gradients 1.36 GB (freed by ``zero_grad`` before each forward, so not at the
    peak), the bf16 weight copies autocast saves for backward 0.65 GB; activations 36-38 x
    d_model bytes per token and layer (the float32 residual stream at both LayerNorms, bf16
    inputs of the four linear layers, q/k/v and the attention output, GELU's input and output;
    36 counted on the CPU at this width): 38 x 1792 x 32,768 x 8 = 17.9 GB at most, plus 0.7 GB
    around the embeddings and the head; the loss keeps float32 log-probabilities (1.1 GB) and
    its backward adds two more float32 copies of the logits and one bf16: ~3.8 GB. Peak: ~27 GB
    allocated, ~30 GB reserved with the allocator's slack, on any GPU of 40 GB or more. The step
    records carry the step's end time (after ``torch.cuda.synchronize()``), and the oracle's
    evidence the measured median step, its TFLOP/s, the parameter count and the peak memory, so
    that an evaluation reports what it measured, not this estimate.

Clean reference
    This program contains no fault. ``--variant`` changes nothing: ``buggy`` runs the same clean
    program. Each step calls ``optimizer.zero_grad()``, runs forward and backward, clips, ends
    with exactly one ``optimizer.step()`` and then advances the scheduler. The data and the
    initial weights follow from ``--seed``; the GPU's kernels (attention and matrix-product
    backward passes) may round differently from run to run, so losses agree across runs of a
    seed to bf16 rounding, not bit for bit.

Oracle
    *manifested* is true only if training visibly failed: a non-finite loss appeared, or (with
    at least 4 steps) the mean loss of the last quarter of the steps is not below the mean of
    the first quarter. It is meant to be false on every seed (not yet run on a GPU: the same
    code at 7M parameters on the CPU falls from 9.0 to 7.3 in 20 steps, from the uniform loss
    toward the Zipf entropy). There is no fault, so the trigger step is null. The evidence holds
    the same outcomes as the other pipelines' (the quarter means, the held-out next-token
    accuracy), the data's entropy rate (the best achievable loss) and the timing and size
    figures above.

Requirements
    A CUDA GPU with bfloat16 (SM 8.0 or later) and about 30 GB of free memory. Without CUDA the
    program exits with status 2 and one line on stderr before it reports anything: it is a GPU
    workload and has no CPU analogue (the other pipelines are the small CPU ones). Campaigns on
    the CPU never pick it; a campaign names it only with the CUDA option (runners.plans).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_STEPS = 20
TRIGGER_STEP = None  # clean pipeline: no fault is ever active
VOCAB = 8192
SEQ_LEN = 1024
D_MODEL = 1792
N_HEADS = 14
N_LAYERS = 8
D_FF = 4 * D_MODEL
BATCH = 32
EVAL_BATCH = 8
INIT_STD = 0.02
LR = 3e-4
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
MAX_NORM = 1.0
WARMUP_FRACTION = 0.1
MIN_LR_FACTOR = 0.1
ZIPF_EXPONENT = 1.0
AUTOCAST_DTYPE = torch.bfloat16
WARM_UP_STEPS = 5  # steps left out of the median step time, as evaluation/overhead.py does


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


def training_failed(losses):
    """(failed, evidence): a non-finite loss, or no decrease from the first to the last quarter."""
    nonfinite = [i for i, value in enumerate(losses) if not math.isfinite(value)]
    quarter = max(1, len(losses) // 4)
    first = sum(losses[:quarter]) / quarter if losses else float("nan")
    last = sum(losses[-quarter:]) / quarter if losses else float("nan")
    trend_judged = len(losses) >= 4  # fewer steps: only a non-finite loss counts as a failure
    no_decrease = trend_judged and not (last < first)
    evidence = {"first_quarter_mean_loss": first, "last_quarter_mean_loss": last,
                "quarter_len": quarter, "trend_judged": trend_judged, "nonfinite_steps": nonfinite[:20],
                "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
    return bool(nonfinite) or no_decrease, evidence


def verdict(manifested, evidence):
    if manifested:
        return "failed"
    return "progressed" if evidence["trend_judged"] else "too short to judge"


def make_task(gen, device):
    """The data's law, drawn from the seed: which token has which Zipf rank, and each token's successor."""
    ranks = torch.arange(1, VOCAB + 1, device=device, dtype=torch.float64)
    probs = ranks.pow(-ZIPF_EXPONENT)
    probs /= probs.sum()
    entropy = float(-(probs * probs.log()).sum())
    cdf = probs.cumsum(0)
    by_rank = torch.randperm(VOCAB, generator=gen, device=device)
    successor = torch.randperm(VOCAB, generator=gen, device=device)
    # every other target is the successor of the token before it (no uncertainty), the others a fresh Zipf draw
    return {"cdf": cdf, "by_rank": by_rank, "successor": successor, "entropy_rate": entropy / 2}


def make_batch(task, gen, batch):
    """(inputs, targets), each (batch, SEQ_LEN): token pairs (a Zipf draw, then its successor), shifted by one."""
    pairs = SEQ_LEN // 2 + 1
    u = torch.rand(batch, pairs, generator=gen, device=task["cdf"].device, dtype=torch.float64)
    first = task["by_rank"][torch.searchsorted(task["cdf"], u).clamp_(max=VOCAB - 1)]
    tokens = torch.stack((first, task["successor"][first]), dim=2).reshape(batch, 2 * pairs)
    return tokens[:, :SEQ_LEN], tokens[:, 1:SEQ_LEN + 1]


def lr_factor(step, total_steps):
    """Linear warmup, then cosine decay to MIN_LR_FACTOR; always strictly positive."""
    warmup = max(1, round(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return MIN_LR_FACTOR + (1.0 - MIN_LR_FACTOR) * 0.5 * (1.0 + math.cos(math.pi * progress))


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, N_HEADS, D_MODEL // N_HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, heads, seq, head_dim)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, D_MODEL))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_MODEL, D_FF)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(D_FF, D_MODEL)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos_embed = nn.Embedding(SEQ_LEN, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: the projections into the residual stream, scaled by its depth
            for projection in (block.attn.proj, block.mlp.fc2):
                nn.init.normal_(projection.weight, mean=0.0, std=INIT_STD / math.sqrt(2 * N_LAYERS))

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embed(tokens) + self.pos_embed(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def param_groups(model):
    """AdamW's groups: weight decay on the matrices of the linear layers, none on biases, LayerNorms, embeddings."""
    decay = [module.weight for module in model.modules() if isinstance(module, nn.Linear)]
    chosen = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in chosen]
    return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]


def matmul_params(model):
    """The parameters that take part in matrix products (all but the embeddings, LayerNorms and biases)."""
    return sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))


def step_flops(model, tokens):
    """Forward and backward: 6 x matmul parameters x tokens, plus 12 x layers x seq x d_model x tokens for the
    attention scores and values (counted in full; a causal kernel skips about half)."""
    return 6 * matmul_params(model) * tokens + 12 * N_LAYERS * SEQ_LEN * D_MODEL * tokens


def forward_loss(model, inputs, targets, device_type):
    """The loss under bf16 autocast, and the next-token accuracy (a tensor; the logits are not kept)."""
    with torch.autocast(device_type=device_type, dtype=AUTOCAST_DTYPE):
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    with torch.no_grad():
        acc = (logits.argmax(dim=-1) == targets).float().mean()
    return loss, acc


def build(device, steps):
    """The model (made on ``device``, seeded by the caller), its optimizer and its LR schedule."""
    with torch.device(device):
        model = GPT()
    optimizer = torch.optim.AdamW(param_groups(model), lr=LR, betas=BETAS, fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, steps))
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler, inputs, targets):
    """One training step: the loss, the accuracy and the gradient norm before clipping (tensors), and the LR it used."""
    optimizer.zero_grad(set_to_none=True)
    loss, acc = forward_loss(model, inputs, targets, inputs.device.type)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    lr = optimizer.param_groups[0]["lr"]  # the LR this step uses
    optimizer.step()
    scheduler.step()
    return loss, acc, norm, lr


def steady_step_ms(times, warm_up=WARM_UP_STEPS):
    """The median time between the ends of consecutive steps after ``warm_up`` steps, in ms (evaluation/overhead.py's
    steady step); None with too few steps."""
    gaps = [later - earlier for earlier, later in zip(times[warm_up:], times[warm_up + 1:])]
    return 1000 * statistics.median(gaps) if gaps else None


def gpu_facts(device):
    if device.type != "cuda":
        return {"gpu": str(device), "capability": None, "torch": torch.__version__, "cuda": torch.version.cuda}
    major, minor = torch.cuda.get_device_capability(device)
    return {"gpu": torch.cuda.get_device_name(device), "capability": "%d.%d" % (major, minor),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def train(args, device):
    """The training run and its report records (main checks the GPU first; on the CPU this runs for a check of the
    code at a smaller size only)."""
    on_gpu = device.type == "cuda"
    torch.manual_seed(args.seed)  # the initial weights, made on the device
    gen = torch.Generator(device=device).manual_seed(args.seed)  # the data, drawn on the device
    task = make_task(gen, device)
    eval_inputs, eval_targets = make_batch(task, gen, EVAL_BATCH)
    model, optimizer, scheduler = build(device, args.steps)
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = BATCH * SEQ_LEN
    flops = step_flops(model, tokens_per_step)
    model.train()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    losses, lrs, times = [], [], []
    clipped_steps = 0
    for step in range(args.steps):
        inputs, targets = make_batch(task, gen, BATCH)
        loss, acc, norm, lr = train_step(model, optimizer, scheduler, inputs, targets)
        losses.append(loss.item())
        norm, acc = norm.item(), acc.item()
        if on_gpu:
            torch.cuda.synchronize(device)  # the step's kernels have all finished before its end time is taken
        times.append(time.time())
        lrs.append(lr)
        clipped_steps += int(norm > MAX_NORM)
        report({"event": "step", "step": step, "rank": 0, "loss": losses[-1], "time": times[-1],
                "metrics": {"grad_norm": norm, "lr": lr, "acc": acc}})

    model.eval()
    with torch.no_grad():
        _, eval_acc = forward_loss(model, eval_inputs, eval_targets, device.type)
    eval_acc = eval_acc.item()
    step_ms = steady_step_ms(times)
    manifested, evidence = training_failed(losses)
    evidence.update({
        "heldout_acc": eval_acc, "entropy_rate": task["entropy_rate"], "uniform_loss": math.log(VOCAB),
        "min_lr": min(lrs) if lrs else None, "max_lr": max(lrs) if lrs else None, "clipped_steps": clipped_steps,
        "median_step_ms": step_ms, "timed_steps": max(0, len(times) - WARM_UP_STEPS - 1),
        "warm_up_steps": WARM_UP_STEPS, "param_count": n_params, "matmul_param_count": matmul_params(model),
        "tokens_per_step": tokens_per_step, "tflop_per_step": flops / 1e12,
        "achieved_tflops": flops / 1e12 / (step_ms / 1000) if step_ms else None,
        "peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30 if on_gpu else None,
        "peak_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30 if on_gpu else None,
        "autocast_dtype": str(AUTOCAST_DTYPE), **gpu_facts(device),
    })
    timing = "median step %.1f ms (%.0f TFLOP/s)" % (step_ms, evidence["achieved_tflops"]) if step_ms else (
        "too few steps to time a steady one")
    summary = ("training %s: mean loss %.4f over the first quarter, %.4f over the last (entropy rate %.4f); "
               "%s, %.1fM parameters, %d tokens a step, on %s"
               % (verdict(manifested, evidence), evidence["first_quarter_mean_loss"],
                  evidence["last_quarter_mean_loss"], task["entropy_rate"], timing, n_params / 1e6,
                  tokens_per_step, evidence["gpu"]))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)  # the same either way
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("pipelines/gpu-transformer needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s); it is the GPU workload for measuring overhead and has no CPU analogue.\n"
                         % torch.__version__)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    if torch.cuda.get_device_capability(device)[0] < 8:
        sys.stderr.write("pipelines/gpu-transformer needs a GPU with bfloat16 (SM 8.0 or later), not %s (SM %d.%d).\n"
                         % ((torch.cuda.get_device_name(device),) + torch.cuda.get_device_capability(device)))
        sys.exit(2)

    train(args, device)


if __name__ == "__main__":
    main()
