"""SilentBench reproducer for PT-23729 (CUDA): a batch made on a side stream is freed while the GPU still reads it.

The bug
    PyTorch's CUDA caching allocator knows only the stream a block was allocated on. A tensor
    created on a side stream and consumed on another stream is, once its last reference is
    dropped, handed back to the side stream's pool at once, even though kernels queued on the
    consuming stream have not read it yet; the next allocation on the side stream gets the same
    memory and the side stream (which does not wait for the consumer) writes into it. The
    consumer's pending kernels then read the new contents. Nothing fails or warns. In issue
    23729 a maintainer (colesbury) laid out this timeline ("there is no synchronization
    preventing the deletion of to_copy from happening before the use", deletions always
    "occur" in the allocation stream) and gave the fix, ``Tensor.record_stream``, which was
    then documented (PR 24078; note added in PR 112526). Issue 49915 reported the same silent
    wrong values as a bug. The behaviour is by design and unchanged in every release: the
    ``record_stream`` docstring of current torch says that if a tensor is used on a stream
    other than its stream of origin "the allocator might reuse the memory unexpectedly", and
    that without ``record_stream`` the user "must manually ensure that any non-creation stream
    uses of a tensor are synced back to the creation stream before you deallocate the tensor".
    TorchRec met the same hazard in 2026 as NaNs in activation stashing (torchrec PR 4231), and
    CUDA Stream Sanitizer does not see allocator reuse before PR 179863 (open, 2026).

This program
    A hand-written GPU batch producer (the pattern of apex's ``data_prefetcher``) generates
    each batch of a synthetic classification task on a side stream: Gaussian inputs (2048 x
    512) drawn with a per-step CUDA generator, labelled by a fixed random linear teacher. Each
    step the training loop takes the batch (the default stream waits for the side stream),
    trains an MLP (512-8192-8192-16, fp32, SGD with momentum) on it on the default stream,
    drops its references to the batch after ``loss.backward()`` has returned (``del x, y``),
    asks the producer for the next batch, so that its generation overlaps the optimizer step,
    and then calls ``optimizer.step()`` once. ``backward()`` returns when its kernels are
    queued, not run: the first layer's weight gradient, the last kernel of the backward and one
    that reads the inputs, is still behind the whole forward and backward (about 0.8 TFLOP of
    fp32 GEMMs, some 15 ms on an H100/H200 by this program's estimate, not yet measured), and
    the loss's backward, which reads the labels, is queued behind the forward. The next batch's
    allocations on the side stream get the freed blocks, and the side stream fills them at
    once. The ``buggy`` variant hands the batch over with ``wait_stream`` only; the ``fixed``
    variant also calls ``x.record_stream(consumer)`` and ``y.record_stream(consumer)`` on the
    tensors it hands over (what apex's prefetcher does, and the docstring's advice), so that
    their blocks are not reused until the work queued on the consumer at the time of the free
    has run. Nothing else differs.

Oracle (checked inside the single run)
    Every step a twin of the model, given the model's parameters before the step, computes on
    the default stream, after the step has finished, the gradient of the same loss on the
    batch the producer meant for that step (regenerated from the step's generator seed, so
    identical to the batch the producer made). *Manifested* means that at some step the
    gradient the optimizer applied differs from the twin's by more than 5% (relative L2 over
    all parameters), or is not finite. Without the race both are the same kernels on the same
    numbers, so the error is zero or at the level of float32 rounding; with it, the loss's
    backward sees the next batch's labels and the first layer's weight gradient the next
    batch's inputs (a relative error of order one). As evidence: the error of the first
    layer's weight gradient, the loss the model reported against the twin's, whether the GPU
    was still running the step's backward when the next batch was queued, whether the next
    batch's inputs landed on the very block that was freed, and the accuracy at the end on a
    held-out batch.

Trigger step
    0: a warm-up forward and backward (no optimizer step) before the loop initialises cuBLAS,
    so that the first step's backward is already queued well ahead of the GPU when step 0's
    batch is freed and the batch of step 1 is written into it.

Requirements
    A CUDA GPU. Without one the program exits with status 2 and a message on stderr. There is
    no CPU analogue: CPU tensors have no streams, and an operation on them has finished when it
    returns, so nothing can read a freed block later.
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

DEFAULT_STEPS = 30
TRIGGER_STEP = 0
BATCH = 2048
IN_FEATURES = 512
HIDDEN = 8192  # large enough that a step's forward and backward take the GPU well over a millisecond
CLASSES = 16
LR = 0.05
MOMENTUM = 0.9
REL_ERR_THRESHOLD = 0.05
DEVICE_TYPE = "cuda"
HELD_OUT_STEP = 1_000_000  # the generator seed offset of the held-out batch (never a training step)


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


def make_model():
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def make_batch(step, seed, teacher, device):
    """The batch of ``step``: Gaussian inputs from a CUDA generator seeded by (seed, step), labelled by a fixed
    linear teacher. Runs on the current stream; the same (seed, step) always gives the same batch."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + step + 1)
    x = torch.randn(BATCH, IN_FEATURES, generator=gen, device=device)  # allocated first: reuses a freed batch
    y = (x @ teacher).argmax(dim=1)
    return x, y


class SideStreamBatches:
    """Makes batch i+1 on a side stream while the model trains on batch i (the pattern of apex's data_prefetcher)."""

    def __init__(self, seed, teacher, device, variant):
        self.seed, self.teacher, self.device, self.variant = seed, teacher, device, variant
        self.stream = torch.cuda.Stream(device)
        self.pending = None
        self.taken_ptrs = (None, None)
        self.x_block_reused = 0  # prefetches whose inputs landed on the inputs' block just freed
        self.y_block_reused = 0

    def prefetch(self, step):
        with torch.cuda.stream(self.stream):
            self.pending = make_batch(step, self.seed, self.teacher, self.device)
        x_ptr, y_ptr = self.taken_ptrs
        self.x_block_reused += int(self.pending[0].data_ptr() == x_ptr)
        self.y_block_reused += int(self.pending[1].data_ptr() == y_ptr)

    def take(self):
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_stream(self.stream)  # the consumer's kernels run after the batch is written
        x, y = self.pending
        self.pending = None
        if self.variant == "buggy":
            pass  # BUG: the allocator still thinks the batch is used only on the side stream that made it
        else:
            x.record_stream(consumer)  # FIX: the blocks wait for the consumer's queued work before reuse
            y.record_stream(consumer)
        self.taken_ptrs = (x.data_ptr(), y.data_ptr())
        return x, y


def rel_err(values, references):
    """Relative L2 error over lists of tensors, in float64; inf if anything is missing or not finite."""
    num = den = 0.0
    for v, r in zip(values, references):
        if v is None or r is None:
            return math.inf
        v, r = v.double(), r.double()
        if not (torch.isfinite(v).all() and torch.isfinite(r).all()):
            return math.inf
        num += float((v - r).pow(2).sum())
        den += float(r.pow(2).sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


def gpu_evidence(device):
    major, minor = torch.cuda.get_device_capability(device)
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(device),
            "capability": "%d.%d" % (major, minor),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "no_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-23729/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s); there is no CPU analogue of this bug.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device(DEVICE_TYPE, 0)
    torch.cuda.set_device(device)

    torch.manual_seed(args.seed)
    model = make_model().to(device)
    twin = copy.deepcopy(model)  # the reference: never trained itself, given the model's weights each step
    params, twin_params = list(model.parameters()), list(twin.parameters())
    teacher = torch.randn(IN_FEATURES, CLASSES, generator=torch.Generator().manual_seed(args.seed)).to(device)
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    loader = SideStreamBatches(args.seed, teacher, device, args.variant)

    torch.cuda.synchronize(device)  # the teacher and the weights are on the GPU before the side stream reads them

    # Warm-up (no optimizer step, no .grad): cuBLAS handles and workspaces, the side stream's pool, the kernels.
    with torch.cuda.stream(loader.stream):
        wx, wy = make_batch(-1, args.seed, teacher, device)
    torch.cuda.synchronize(device)
    for net in (model, twin):
        torch.autograd.grad(F.cross_entropy(net(wx), wy), list(net.parameters()))
    torch.cuda.synchronize(device)
    del wx, wy
    loader.prefetch(0)
    torch.cuda.synchronize(device)

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    max_err = max_w1_err = max_loss_gap = 0.0
    first_bad_step = None
    bad_steps = busy_steps = 0
    per_step_err = []
    for step in range(args.steps):
        with torch.no_grad():  # the twin starts from the weights this step starts from (same stream, in order)
            for t, p in zip(twin_params, params):
                t.copy_(p)

        x, y = loader.take()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # returns once the backward is queued; the GPU is still running it
        queued = torch.cuda.Event()
        queued.record()
        del x, y  # the loop is done with the batch (autograd released its saved copies in backward)
        loader.prefetch(step + 1)  # make the next batch while the optimizer step runs
        busy = not queued.query()  # the step's backward had not finished when the next batch was queued
        optimizer.step()
        loss_value = loss.item()  # waits for the step

        ref_x, ref_y = make_batch(step, args.seed, teacher, device)  # the batch meant for this step
        ref_loss = F.cross_entropy(twin(ref_x), ref_y)
        ref_grads = torch.autograd.grad(ref_loss, twin_params)  # no .grad, no Tensor.backward: not a second step
        err = rel_err([p.grad for p in params], ref_grads)
        w1_err = rel_err([params[0].grad], ref_grads[:1])
        loss_gap = abs(loss_value - ref_loss.item())
        del ref_x, ref_y, ref_grads

        busy_steps += int(busy)
        per_step_err.append(err)
        max_err, max_w1_err, max_loss_gap = max(max_err, err), max(max_w1_err, w1_err), max(max_loss_gap, loss_gap)
        if not err <= REL_ERR_THRESHOLD:  # also catches NaN
            bad_steps += 1
            if first_bad_step is None:
                first_bad_step = step
        report({"event": "step", "step": step, "rank": 0, "loss": loss_value, "time": time.time(),
                "metrics": {"grad_rel_err": err, "first_layer_weight_grad_rel_err": w1_err,
                            "reference_loss": ref_loss.item(), "gpu_busy_at_prefetch": float(busy)}})

    with torch.no_grad():  # what a user's evaluation would measure
        hx, hy = make_batch(HELD_OUT_STEP, args.seed, teacher, device)
        accuracy = float((model(hx).argmax(dim=1) == hy).float().mean())
    loader.pending = None
    torch.cuda.synchronize(device)

    manifested = first_bad_step is not None
    if manifested:
        summary = ("the gradient the optimizer applied differs from the gradient on the intended batch at %d/%d "
                   "steps from step %d (max rel. err %.3g overall, %.3g for the first layer's weight; reported loss "
                   "off by up to %.3g), as when the side stream writes the next batch into the freed batch's memory "
                   "before the step has read it (GPU busy at %d/%d prefetches, inputs' block reused %d times); "
                   "held-out accuracy %.2f"
                   % (bad_steps, args.steps, first_bad_step, max_err, max_w1_err, max_loss_gap, busy_steps,
                      args.steps, loader.x_block_reused, accuracy))
    elif args.steps <= TRIGGER_STEP:
        summary = "no step was run, so no batch was freed while in use"
    else:
        summary = ("the gradient the optimizer applied matched the gradient on the intended batch at every step "
                   "(max rel. err %.2g; GPU busy at %d/%d prefetches, inputs' block reused %d times); held-out "
                   "accuracy %.2f" % (max_err, busy_steps, args.steps, loader.x_block_reused, accuracy))
    evidence = {"max_grad_rel_err": max_err, "max_first_layer_weight_grad_rel_err": max_w1_err,
                "threshold": REL_ERR_THRESHOLD, "first_bad_step": first_bad_step, "bad_steps": bad_steps,
                "grad_rel_err_per_step": per_step_err[:64], "max_reported_loss_gap": max_loss_gap,
                "prefetches_with_gpu_busy": busy_steps, "x_block_reused": loader.x_block_reused,
                "y_block_reused": loader.y_block_reused, "held_out_accuracy": accuracy,
                "record_stream": args.variant == "fixed"}
    evidence.update(gpu_evidence(device))
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary, "evidence": evidence})


if __name__ == "__main__":
    main()
