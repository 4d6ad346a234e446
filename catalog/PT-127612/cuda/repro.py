"""SilentBench reproducer for PT-127612 (CUDA): a pinned staging buffer refilled before its non_blocking copy ran.

The bug
    ``gpu = pinned_cpu.to("cuda", non_blocking=True)`` (or ``gpu.copy_(pinned_cpu,
    non_blocking=True)``) only *queues* the copy on the current CUDA stream and returns at
    once: the DMA reads the page-locked source when the stream reaches it, after all the
    work queued before it. If the program writes into that pinned buffer in the meantime,
    the GPU receives the new contents. In issue 127612 a maintainer showed it with
    ``b.copy_(a, non_blocking=True); a[-1].fill_(-1)``, which "pretty reliably" gives
    ``b[-1] == -1``, and closed the issue as expected behaviour, unchanged since PyTorch's
    inception. (Issue 130785 feared the same for a pinned tensor that is *freed*: there
    the caching host allocator keeps the block until the copy has run, so freeing is safe;
    overwriting a buffer the program keeps, as here, is not.) PyTorch's tutorial "A guide
    on good usage of non_blocking and pin_memory()" warns that mutating a pinned tensor
    after starting a host-to-device copy may corrupt the data received on the GPU; the
    remedy is to synchronise (an event recorded after the copy) before touching it.

This program
    A hand-written prefetching loader feeds the GPU from an in-memory dataset of 8 synthetic
    batches (one epoch; step k is meant to train on batch k % 8). The inputs, 4 MB a batch,
    go through ONE preallocated pinned staging buffer; the labels, small, are pinned afresh
    for each batch (``pin_memory()``, which is safe: the caching host allocator keeps a
    block until the copies that read it have run). Before training it stages batch 0,
    copies it and waits for it, then stages batch 1. Every step queues the forward,
    backward and ``optimizer.step()`` of an MLP classifier (512-8192-8192-8192-16, fp32,
    Adam, batch 2048: about ten milliseconds for the forward alone, against about a
    millisecond to refill 4 MB of staging). Right after queueing its forward, while the
    GPU is still busy with it and before any detector's hook around the backward or the
    optimizer step can make the host wait, each step asks the loader for the next batch:
    the loader queues ``.to("cuda", non_blocking=True)`` for inputs and labels, records a
    CUDA event and stages the batch after. The ``buggy`` variant refills the inputs'
    staging buffer at once, so the inputs' copy, queued behind the forward, reads the
    next batch's inputs while the labels' copy reads this batch's labels: the model trains
    on inputs paired with another batch's labels, and learns nothing that holds. The
    ``fixed`` variant first calls ``event.synchronize()``, the documented fix. Nothing
    else differs. Then the program waits for the GPU and reports the step.

Oracle (checked inside the single run)
    Every step, once the GPU has finished it, the inputs and labels the model actually
    trained on are copied back to the CPU and compared element by element with the batch
    the loader meant for that step (the dataset's unpinned copy). *Manifested* means that
    at some step any element differs. As evidence: the fraction of elements that differ,
    which dataset batch the inputs and labels actually came from (the next one, or a mix),
    whether the copies were still pending when the refill finished, and the model's
    accuracy at the end on the pairs the loader meant (near chance when it trained on
    mismatched pairs).

Trigger step
    1: step 0 trains on the batch that was copied and waited for before training; the
    copy of batch 1 is the first one queued behind GPU work (step 0's), so step 1 is the
    first step that trains on the wrong data.

Requirements
    A CUDA GPU. Without one the program exits with status 2 and a message on stderr. There
    is no CPU analogue: a copy from page-locked memory is asynchronous to the host only
    with CUDA; on the CPU every copy has finished when it returns, so nothing can race.
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
TRIGGER_STEP = 1
BATCH = 2048
IN_FEATURES = 512
HIDDEN = 8192
CLASSES = 16
DATASET_BATCHES = 8  # one epoch; batch k of training is dataset batch k % 8
LR = 1e-4
MAX_LISTED_STEPS = 64  # per-step lists in the evidence are cut here


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


def make_dataset(gen):
    """DATASET_BATCHES batches of a Gaussian-cluster classification task (pageable CPU memory)."""
    centers = 2.0 * torch.randn(CLASSES, IN_FEATURES, generator=gen)
    labels = torch.randint(0, CLASSES, (DATASET_BATCHES, BATCH), generator=gen)
    inputs = centers[labels] + torch.randn(DATASET_BATCHES, BATCH, IN_FEATURES, generator=gen)
    return inputs.contiguous(), labels.contiguous()


def make_model():
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


class PinnedPrefetcher:
    """Feeds the GPU through ONE pinned staging buffer for the inputs (labels pinned afresh per batch),
    overlapping the copies with compute."""

    def __init__(self, inputs, labels, device, variant):
        self.inputs, self.labels, self.device, self.variant = inputs, labels, device, variant
        self.stage_x = torch.empty(inputs.shape[1:], dtype=inputs.dtype, pin_memory=True)
        self.stage_y = None
        self.staged = 0  # index of the batch in the staging buffers
        self.pending_after_refill = 0  # fetches whose copies had not run when the refill ended
        self.refill_seconds = 0.0
        self._refill(0)

    def _refill(self, index):
        t0 = time.perf_counter()
        self.stage_x.copy_(self.inputs[index % len(self.inputs)])
        self.stage_y = self.labels[index % len(self.labels)].pin_memory()  # a new block: never overwritten
        self.refill_seconds += time.perf_counter() - t0
        self.staged = index

    def start(self):
        """The first batch: nothing to overlap with yet, so copy it and wait before staging the next."""
        x = self.stage_x.to(self.device, non_blocking=True)
        y = self.stage_y.to(self.device, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        self._refill(self.staged + 1)
        return x, y

    def fetch(self):
        """Queue the copy of the staged batch to the GPU, then stage the batch after it."""
        x = self.stage_x.to(self.device, non_blocking=True)
        y = self.stage_y.to(self.device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        if self.variant == "buggy":
            pass  # BUG: refill at once, while the inputs' copy queued behind the GPU's work has not read the buffer yet
        else:
            copied.synchronize()  # FIX: the host waits until the copies have read the staging buffer
        self._refill(self.staged + 1)
        self.pending_after_refill += int(not copied.query())
        return x, y


def source_batch(trained, dataset):
    """Index of the dataset batch equal to ``trained``, or -1 (a mix, or nothing)."""
    for j in range(len(dataset)):
        if torch.equal(trained, dataset[j]):
            return j
    return -1


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--variant", choices=["buggy", "fixed"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.stderr.write("PT-127612/cuda needs a CUDA GPU, but torch.cuda.is_available() is False "
                         "(torch %s); there is no CPU analogue of this bug.\n" % torch.__version__)
        sys.exit(2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)  # data drawn on the CPU
    data_x, data_y = make_dataset(gen)
    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    meant_x, meant_y = data_x.to(device), data_y.to(device)  # the intended pairs, for the accuracy at the end

    loader = PinnedPrefetcher(data_x, data_y, device, args.variant)
    x, y = loader.start()

    report({"event": "start", "time": time.time(), "variant": args.variant,
            "seed": args.seed, "steps": args.steps, "world_size": 1})

    bad_steps = 0
    first_bad_step = None
    diff_elems = 0
    total_elems = 0
    max_frac = 0.0
    pair_split_steps = 0  # inputs and labels from different dataset batches (or a mix)
    x_offsets, y_offsets = [], []
    step_ms = 0.0
    for step in range(args.steps):
        begun, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begun.record()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        next_x, next_y = loader.fetch()  # the GPU is still busy with this step's forward
        loss.backward()
        optimizer.step()
        ended.record()
        torch.cuda.synchronize(device)

        k = step % DATASET_BATCHES

        trained_x, trained_y = x.cpu(), y.cpu()
        dx = int((trained_x != data_x[k]).sum())
        dy = int((trained_y != data_y[k]).sum())
        frac = (dx + dy) / (trained_x.numel() + trained_y.numel())
        diff_elems += dx + dy
        total_elems += trained_x.numel() + trained_y.numel()
        max_frac = max(max_frac, frac)
        if dx + dy > 0:
            bad_steps += 1
            if first_bad_step is None:
                first_bad_step = step
        jx, jy = source_batch(trained_x, data_x), source_batch(trained_y, data_y)
        pair_split_steps += int(jx != jy or jx < 0)
        if step < MAX_LISTED_STEPS:
            x_offsets.append((jx - k) % DATASET_BATCHES if jx >= 0 else None)
            y_offsets.append((jy - k) % DATASET_BATCHES if jy >= 0 else None)
        step_ms += begun.elapsed_time(ended)
        report({"event": "step", "step": step, "rank": 0, "loss": loss.item(), "time": time.time(),
                "metrics": {"batch_mismatch_frac": frac, "input_mismatch_frac": dx / trained_x.numel(),
                            "label_mismatch_frac": dy / trained_y.numel()}})
        x, y = next_x, next_y

    with torch.no_grad():  # on the pairs the loader meant: what a user's evaluation would measure
        accuracy = float(sum((model(meant_x[j]).argmax(1) == meant_y[j]).float().mean()
                             for j in range(DATASET_BATCHES)) / DATASET_BATCHES)
    manifested = first_bad_step is not None
    if manifested:
        summary = ("the GPU trained on data other than the intended batch at %d/%d steps from step %d "
                   "(%.1f%% of elements differ; inputs came from dataset batch k+offset, offsets %s); "
                   "accuracy %.2f on the intended pairs at the end"
                   % (bad_steps, args.steps, first_bad_step, 100.0 * diff_elems / max(total_elems, 1),
                      sorted(set(o for o in x_offsets if o is not None)), accuracy))
    else:
        summary = ("every step trained on exactly the intended batch; accuracy %.2f on the intended pairs at the end"
                   % accuracy)
    report({"event": "oracle", "manifested": manifested, "trigger_step": TRIGGER_STEP,
            "summary": summary,
            "evidence": {"steps_wrong_batch": bad_steps, "first_bad_step": first_bad_step,
                         "mismatch_frac_all_steps": diff_elems / max(total_elems, 1),
                         "max_step_mismatch_frac": max_frac,
                         "steps_inputs_labels_from_different_batches": pair_split_steps,
                         "input_source_offsets": x_offsets, "label_source_offsets": y_offsets,
                         "fetches_copy_pending_after_refill": loader.pending_after_refill,
                         "mean_refill_ms": 1000.0 * loader.refill_seconds / (args.steps + 2),
                         "mean_step_gpu_ms": step_ms / max(args.steps, 1),
                         "accuracy": accuracy,
                         "torch": torch.__version__, "cuda": torch.version.cuda,
                         "gpu": torch.cuda.get_device_name(device)}})


if __name__ == "__main__":
    main()
