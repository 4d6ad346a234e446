"""Routing by need: the queue a run goes to, the queues a worker consumes, why nobody can serve a run,
and the GPUs a run gets on the worker that takes it.

One rule, read in both directions (``queue_for`` and ``queues_for_worker``)::

    cpu            no GPU
    gpu<n>         n GPUs
    gpu<n>-<t>gb   n GPUs with at least t GB each; a declared ``gpu_memory_gb`` is rounded up to a
                   tier t of SILENTBENCH_GPU_MEMORY_TIERS_GB

A worker with GPUs consumes ``gpu<k>`` for k up to its GPU count, ``gpu<k>-<t>gb`` for k up to the
number of its GPUs that hold t GB, and ``cpu`` unless told not to. Cards report less than their
nominal size (an L40S "48 GB" shows 45 GiB), so a GPU counts as t GB from 92% of t on. Where k runs share a GPU
(SILENTBENCH_RUNS_PER_GPU), each counts on 1/k of its memory: an 80 GB GPU shared by 2 holds t = 40, not 48
(``holds``, the one place routing and the lease read a GPU's memory).

A run that asks for a Python environment other than the default one (runners.environments) goes to its
needs' queue with the environment's name after a ``.`` (``cpu.py3.11-torch2.11.0``); a worker that built
that environment consumes each of its queues that way too, and no other worker does.
"""
import fcntl
import math
import os
import re
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from ..failures import Unservable, wrong_worker_reason
from ..models import CampaignPurpose, Run, RunStatus
from .host import gpu_inventory

MEMORY_SLACK = 0.92
QUEUE_PATTERN = re.compile(r"^gpu(?P<gpus>\d*)(?:-(?P<memory>\d+)gb)?$")
# Between a queue and its environment: not in any queue name above, and a character every broker takes in a name
# (the filesystem broker's exchanges take letters, digits, ".", "_" and "-" only).
ENVIRONMENT_SEPARATOR = "."


@dataclass(frozen=True)
class Needs:
    """What one run needs from its worker: GPUs, and GPU memory per GPU (0 when any will do)."""

    gpus: int = 0
    gpu_memory_gb: int = 0

    def __str__(self):
        if not self.gpus:
            return "no GPU"
        plural = "GPU" if self.gpus == 1 else "GPUs"
        memory = f" with {self.gpu_memory_gb} GB each" if self.gpu_memory_gb else ""
        return f"{self.gpus} {plural}{memory}"


def memory_tier(gpu_memory_gb):
    """The smallest tier that holds ``gpu_memory_gb``; past the largest tier, the need itself (whole GB),
    which only a worker configured with such a tier consumes."""
    if not gpu_memory_gb:
        return 0
    return next((tier for tier in sorted(settings.SILENTBENCH_GPU_MEMORY_TIERS_GB) if tier >= gpu_memory_gb),
                math.ceil(gpu_memory_gb))


def needs_of(version):
    """A reproducer version's declared needs (``needs:`` in its reproducer.yaml). CUDA means one GPU at least."""
    declared = (version.manifest or {}).get("needs") or {}
    gpus = int(declared.get("gpus") or 0)
    if declared.get("cuda") or version.reproducer.needs_cuda:
        gpus = max(gpus, 1)
    memory = float(declared.get("gpu_memory_gb") or 0) if gpus else 0
    return Needs(gpus, memory_tier(memory))


def queue_name(needs, environment=None):
    """The queue of ``needs``, in ``environment`` (a PythonEnvironment; None or the default one: the plain name)."""
    name = "cpu"
    if needs.gpus:
        name = f"gpu{needs.gpus}" + (f"-{needs.gpu_memory_gb}gb" if needs.gpu_memory_gb else "")
    return in_environment(name, environment.name if environment and not environment.is_default else "")


def in_environment(queue, environment_name):
    return f"{queue}{ENVIRONMENT_SEPARATOR}{environment_name}" if environment_name else queue


def queue_for(version, environment=None):
    return queue_name(needs_of(version), environment)


def environment_of_queue(queue):
    """The name of the environment a queue is for; '' for the default one."""
    return queue.partition(ENVIRONMENT_SEPARATOR)[2]


def needs_of_queue(queue):
    """The needs a queue name stands for (``gpu`` is the one-GPU queue of earlier releases)."""
    match = QUEUE_PATTERN.match(queue.partition(ENVIRONMENT_SEPARATOR)[0])
    if not match:
        return Needs()
    return Needs(int(match["gpus"] or 1), int(match["memory"] or 0))


def runs_per_gpu(runs=None):
    """How many runs may hold one GPU at once: ``runs``, else this worker's SILENTBENCH_RUNS_PER_GPU."""
    return runs or settings.SILENTBENCH_RUNS_PER_GPU


def holds(gpu, gpu_memory_gb, runs=None):
    """Whether one run on ``gpu`` may count on ``gpu_memory_gb``: of all its memory, or of its 1/k share where k runs
    share a GPU (``runs``, else SILENTBENCH_RUNS_PER_GPU). The worker's queues and its leases both judge by this."""
    share_mb = gpu["memory_mb"] / runs_per_gpu(runs)
    return not gpu_memory_gb or share_mb >= MEMORY_SLACK * gpu_memory_gb * 1024


def queues_for_worker(capabilities, cpu=True):
    """Every queue a worker with these capabilities can serve, small needs first."""
    gpus = capabilities.get("gpus") or []
    queues = ["cpu"] if cpu else []
    queues += [f"gpu{count}" for count in range(1, len(gpus) + 1)]
    for tier in sorted(settings.SILENTBENCH_GPU_MEMORY_TIERS_GB):
        able = sum(1 for gpu in gpus if holds(gpu, tier))
        queues += [f"gpu{count}-{tier}gb" for count in range(1, able + 1)]
    return queues


def queues_in_environments(queues, environment_names):
    """``queues`` (a worker's, in the default environment), then each of them in each environment it built."""
    plain = [queue for queue in queues if queue == "cpu" or QUEUE_PATTERN.match(queue)]
    return list(dict.fromkeys([*queues, *(in_environment(queue, name) for name in environment_names
                                          for queue in plain)]))


def describe_worker(worker):
    """``b (2× NVIDIA A100-SXM4-40GB, 40 GB)`` or ``a (cpu)``: what a worker offers, for a person, with the
    runs that share each GPU where more than one may (``b (1× NVIDIA H200 140 GB, 4 runs per GPU)``) and the
    environments it serves besides the default one (``a (cpu; environments py3.11-torch2.11.0)``)."""
    gpus = worker.capabilities.get("gpus") or []
    environments = sorted({environment_of_queue(queue) for queue in worker.queues} - {""})
    served = f"; environments {', '.join(environments)}" if environments else ""
    if not gpus:
        return f"{worker.hostname} (cpu{served})"
    models = {}
    for gpu in gpus:
        models.setdefault((gpu["name"], round(gpu["memory_mb"] / 1024)), []).append(gpu)
    offered = ", ".join(f"{len(same)}× {name} {memory} GB" for (name, memory), same in models.items())
    shared = worker.capabilities.get("runs_per_gpu") or 1
    if shared > 1:
        offered += f", {shared} runs per GPU"
    return f"{worker.hostname} ({offered}{served})"


class NotEnoughDevices(Unservable):
    """This worker does not have the GPUs a run needs at all: the run was routed to the wrong worker."""


class DevicesBusy(Exception):
    """The GPUs exist but other runs held them for longer than the lease wait."""


def _flock(path, operation):
    """``path`` opened and locked with ``operation`` (LOCK_EX or LOCK_SH) if that needs no wait, else None."""
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _try_lock(indices, count, lock_dir, runs=1):
    """One slot on each of ``count`` distinct GPUs of ``indices``, all at once or none: [(index, [file, ...])], sorted,
    the run's own file last (it takes the holder's pid), or None.

    One run per GPU (``runs`` 1): the GPU's file ``gpu<i>.lock``, exclusively. k runs per GPU: ``gpu<i>.lock`` shared,
    so that a run of a worker with one run per GPU on the same lock directory is never beside them, and one of
    ``gpu<i>.slot0.lock`` … ``gpu<i>.slot<k-1>.lock`` exclusively. Slots are tried slot by slot across the GPUs, so
    that runs spread over the GPUs before they double up."""
    held, shared, refused = {}, {}, set()
    for slot in range(runs):
        for index in indices:
            if index in held or index in refused:
                continue
            if runs == 1:
                own = _flock(lock_dir / f"gpu{index}.lock", fcntl.LOCK_EX)
            else:
                if index not in shared:
                    gpu_file = _flock(lock_dir / f"gpu{index}.lock", fcntl.LOCK_SH)
                    if gpu_file is None:  # a run of a worker with one run per GPU has it to itself
                        refused.add(index)
                        continue
                    shared[index] = gpu_file
                own = _flock(lock_dir / f"gpu{index}.slot{slot}.lock", fcntl.LOCK_EX)
            if own is None:
                continue
            held[index] = [shared.pop(index), own] if runs > 1 else [own]
            if len(held) == count:
                for handle in shared.values():
                    handle.close()
                return sorted(held.items())
    for handle in [*shared.values(), *(handle for files in held.values() for handle in files)]:
        handle.close()  # closing a file releases its lock
    return None


@contextmanager
def device_lease(needs, gpus, lock_dir=None, wait_seconds=None, poll_seconds=0.5, runs=None):
    """Hold ``needs.gpus`` distinct GPUs of this host's ``gpus``; yields their indices, sorted.

    Each GPU has as many lease slots as runs may share it (``runs``, else SILENTBENCH_RUNS_PER_GPU; one: the run
    has it to itself), and a run holds one slot on each of its GPUs (``_try_lock``), with a GPU's memory counting
    1/k for each of k runs (``holds``). Lock files under ``lock_dir``, taken with flock by whichever worker process
    runs the run; the kernel drops the lock when the process ends, even by kill -9, so a lease never outlives its
    run. Locks are taken all or none, so two runs that each need two GPUs never deadlock.
    """
    if not needs.gpus:
        yield ()
        return
    runs = runs_per_gpu(runs)
    eligible = sorted(gpu["index"] for gpu in gpus if holds(gpu, needs.gpu_memory_gb, runs))
    if len(eligible) < needs.gpus:
        raise NotEnoughDevices(wrong_worker_reason(needs, gpus, runs if needs.gpu_memory_gb else 1))
    lock_dir = Path(lock_dir or settings.SILENTBENCH_GPU_LOCK_DIR)
    lock_dir.mkdir(parents=True, exist_ok=True)
    wait_seconds = settings.SILENTBENCH_GPU_LEASE_WAIT_SECONDS if wait_seconds is None else wait_seconds
    deadline = time.monotonic() + wait_seconds
    while (held := _try_lock(eligible, needs.gpus, lock_dir, runs)) is None:
        if time.monotonic() >= deadline:
            raise DevicesBusy(f"{needs} not free on this host within {wait_seconds:g} s")
        time.sleep(poll_seconds)
    with ExitStack() as stack:
        for _, files in held:
            for handle in files:
                stack.callback(handle.close)
            own = files[-1]
            own.seek(0)
            own.truncate()
            own.write(f"{os.getpid()}\n")
            own.flush()
        yield tuple(index for index, _ in held)


@contextmanager
def devices_for_run(run_id):
    """The lease of a queued run on this worker's GPUs, by what its queue stands for; nothing for a run
    that is not queued any more (it will not be claimed). A timed run (an overhead pair's: evaluation.overhead) has
    its GPUs to itself, whatever SILENTBENCH_RUNS_PER_GPU says: a run beside it would be timed too."""
    queue, purpose = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).values_list(
        "queue", "campaign__purpose").first() or ("cpu", None)
    alone = 1 if purpose == CampaignPurpose.OVERHEAD else None
    with device_lease(needs_of_queue(queue or "cpu"), gpu_inventory(), runs=alone) as devices:
        yield devices


def visible_devices(devices):
    """The value of CUDA_VISIBLE_DEVICES for a run holding ``devices``: "" hides every GPU from a CPU run."""
    return ",".join(str(index) for index in devices)


GPU_SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                    "/dev/nvidia-caps")  # the last, a folder: MIG instances' capabilities


def device_nodes(devices):
    """The device files a sealed run holding GPUs ``devices`` may open: theirs and the driver's shared ones."""
    if not devices:
        return []
    nodes = [f"/dev/nvidia{index}" for index in devices] + list(GPU_SHARED_NODES)
    return [node for node in nodes if os.path.exists(node)]
