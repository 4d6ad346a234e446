"""The fault harness: what a mutant adds to a clean pipeline to inject one fault (shipped into the mutant as
``silentbench_fault.py``; it imports only the standard library and torch, as a reproducer must).

A mutant is the clean pipeline's own file with two lines changed (sensitivity.mutants): its first line imports this
module and calls ``install()``, and its ``TRIGGER_STEP`` names the step at which the fault begins. ``install()`` reads
``mutant.json`` beside it and, in the ``buggy`` variant only, hands a ``Fault`` to the operator's ``inject``
(``fault_operator.py``, one module of sensitivity/faults/operators). The ``fixed`` variant installs nothing: it is the
clean pipeline, step for step (the clean twin).

Steps are counted as the reproducer protocol counts them: step ``i`` is the ``i``-th training iteration, ending with
the ``i``-th optimizer step (0-based). ``Fault.step`` is the step in progress, and the trigger step is the first step
the fault changes: an operator acts in that step, before its update. The harness observes the program through global
hooks only (optimizer step hooks, module forward hooks, ``Tensor.backward``, DDP's communication hook, the learning
rate scheduler's ``step``), which it installs after a detector's probe. What it changes before an optimizer step it
changes ahead of every detector's own pre-step check, as the faulty program itself would: a detector sees the program
as a faulty program would run, never the harness's own bookkeeping.
"""
import json
import os
import random
import struct
import sys
from pathlib import Path

CONFIG_FILE = "mutant.json"
ARMED_ENV = "SILENTBENCH_FAULT_ARMED"  # "1" in the buggy variant: spawned ranks read it before they parse argv
FLOAT32_BITS = {"man-lo": 0, "man-hi": 22, "exp-lo": 23, "sign": 31, "exp-hi": 30}  # from least to most harm
_installed = None


def _armed():
    """Whether this process runs the buggy variant: from argv (``--variant buggy``), else from the parent's word."""
    argv = sys.argv[1:]
    for index, word in enumerate(argv):
        if word == "--variant" and index + 1 < len(argv):
            return argv[index + 1] == "buggy"
        if word.startswith("--variant="):
            return word.partition("=")[2] == "buggy"
    return os.environ.get(ARMED_ENV) == "1"


def _seed():
    argv = sys.argv[1:]
    for index, word in enumerate(argv):
        if word == "--seed" and index + 1 < len(argv):
            return int(argv[index + 1])
        if word.startswith("--seed="):
            return int(word.partition("=")[2])
    return 0


def flip_bit(tensor, index, bit):
    """Flip bit ``bit`` (0 = least significant) of element ``index`` of the flattened float32 ``tensor``, in place;
    returns (value before, value after)."""
    import torch

    flat = tensor.detach().view(-1)
    before = float(flat[index])
    (word,) = struct.unpack("<I", struct.pack("<f", before))
    (after,) = struct.unpack("<f", struct.pack("<I", word ^ (1 << bit)))
    with torch.no_grad():
        flat[index] = after
    return before, float(flat[index])


def set_bit(tensor, index, bit, value):
    """Force bit ``bit`` of element ``index`` of the flattened float32 ``tensor`` to ``value`` (a stuck-at bit)."""
    import torch

    flat = tensor.detach().view(-1)
    (word,) = struct.unpack("<I", struct.pack("<f", float(flat[index])))
    word = word | (1 << bit) if value else word & ~(1 << bit)
    (forced,) = struct.unpack("<f", struct.pack("<I", word))
    with torch.no_grad():
        flat[index] = forced


def bit_of(tensor, index, bit):
    (word,) = struct.unpack("<I", struct.pack("<f", float(tensor.detach().view(-1)[index])))
    return (word >> bit) & 1


class Fault:
    """What an operator's ``inject`` is given: the mutant's parameters, the step in progress, and the hooks."""

    def __init__(self, config, seed):
        self.config = config
        self.operator = config["operator"]
        self.severity = config["severity"]
        self.parameters = config.get("parameters", {})
        self.trigger_step = int(config["trigger_step"])
        self.target_rank = int(config.get("rank", 0))
        self.persistence = config.get("persistence", "")
        self.seed = seed
        self.random = random.Random(f"{config['mutant_id']}:{seed}")  # the same choices on every rank
        self.step = 0
        self._step_counts = {}
        self._before_step, self._after_step, self._after_backward = [], [], []
        self._wrap_backward, self._before_scheduler_step, self._after_scheduler_step = [], [], []
        self._allreduce_before, self._allreduce_after = [], []
        self.allreduce_op = None  # a torch.distributed.ReduceOp to reduce with instead of a mean (None: the mean)
        self.allreduce_skipped = False  # True: each rank keeps its own gradient, nothing is reduced
        self._hooks = set()

    # --- where the program is ---------------------------------------------------------------------------------
    @property
    def rank(self):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return int(os.environ.get("RANK", "0"))

    def on_target_rank(self):
        return self.rank == self.target_rank

    def started(self):
        """Whether the fault's first step has begun."""
        return self.step >= self.trigger_step

    def every(self, period):
        """Whether the step in progress is one of the fault's: the trigger step and every ``period``-th after it."""
        return self.started() and (self.step - self.trigger_step) % period == 0

    # --- hooks ------------------------------------------------------------------------------------------------
    def before_step(self, callback):
        """``callback(optimizer)`` before every optimizer step, ahead of any detector's own pre-step check."""
        self._optimizer_hooks()
        self._before_step.append(callback)

    def after_step(self, callback):
        """``callback(optimizer)`` after every optimizer step, before the step count moves on."""
        self._optimizer_hooks()
        self._after_step.append(callback)

    def wrap_backward(self, wrapper):
        """``wrapper(backward, tensor, *args, **kwargs)`` runs instead of ``Tensor.backward``; it calls ``backward``
        (the program's own, with any detector's check inside it) as it pleases."""
        self._backward_hook()
        self._wrap_backward.append(wrapper)

    def after_backward(self, callback):
        """``callback()`` after every ``Tensor.backward`` (gradients are complete, and in DDP already averaged)."""
        self._backward_hook()
        self._after_backward.append(callback)

    def skip_zero_grad(self, skipped):
        """``zero_grad()`` of every optimizer and module does nothing while ``skipped()`` is true; the program's own
        (with any detector's wrapper inside it) runs otherwise."""
        import torch

        for owner in (torch.optim.Optimizer, torch.nn.Module):
            program = owner.zero_grad

            def zero_grad(instance, *args, _program=program, **kwargs):
                return None if skipped() else _program(instance, *args, **kwargs)

            owner.zero_grad = zero_grad

    def before_clipping(self, callback):
        """``callback()`` before every ``torch.nn.utils.clip_grad_norm_`` or ``clip_grad_value_`` the program calls
        (the program's own runs after it, with any detector's wrapper inside it)."""
        import torch
        import torch.nn.utils.clip_grad as clip_grad

        for name in ("clip_grad_norm_", "clip_grad_value_"):
            program = getattr(torch.nn.utils, name)

            def clip(*args, _program=program, **kwargs):
                callback()
                return _program(*args, **kwargs)

            setattr(torch.nn.utils, name, clip)
            setattr(clip_grad, name, clip)

    def on_scheduler_step(self, before=None, after=None):
        """Around every ``step()`` of a learning-rate scheduler that inherits ``LRScheduler.step`` (the one its
        constructor makes included; not ``ReduceLROnPlateau``, ``CosineAnnealingWarmRestarts`` nor the chaining
        schedulers, which have their own): ``before(scheduler)`` ahead of it, ``after(scheduler)`` once the rates it
        set are in its optimizer's groups. The program steps its scheduler after its optimizer, so ``fault.step`` is
        then the step those rates are for, and ``fault.step - 1`` the one that just ended."""
        if "scheduler" not in self._hooks:
            from torch.optim.lr_scheduler import LRScheduler

            program_step = LRScheduler.step
            fault = self

            def step(scheduler, *args, **kwargs):
                for callback in fault._before_scheduler_step:
                    callback(scheduler)
                result = program_step(scheduler, *args, **kwargs)
                for callback in fault._after_scheduler_step:
                    callback(scheduler)
                return result

            LRScheduler.step = step
            self._hooks.add("scheduler")
        if before:
            self._before_scheduler_step.append(before)
        if after:
            self._after_scheduler_step.append(after)

    def on_allreduce(self, before=None, after=None):
        """DDP's gradient buckets: ``before(buffer, index)`` may change a rank's payload of bucket ``index`` (0 to
        the number of buckets - 1) before it is reduced, ``after(buffer)`` the reduced result (in place)."""
        self._ddp_hook()
        if before:
            self._allreduce_before.append(before)
        if after:
            self._allreduce_after.append(after)

    def _optimizer_hooks(self):
        if "optimizer" in self._hooks:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def before(optimizer, args, kwargs):
            for callback in self._before_step:
                callback(optimizer)

        def after(optimizer, args, kwargs):
            for callback in self._after_step:
                callback(optimizer)
            count = self._step_counts.get(id(optimizer), 0) + 1
            self._step_counts[id(optimizer)] = count
            self.step = max(self.step, count)

        # the program's fault happens before it calls step(): ahead of the probe's global pre-step hooks, which torch
        # keeps in registration order
        from torch.optim.optimizer import _global_optimizer_pre_hooks

        handle = register_optimizer_step_pre_hook(before)
        _global_optimizer_pre_hooks.move_to_end(handle.id, last=False)
        register_optimizer_step_post_hook(after)
        self._hooks.add("optimizer")

    def _backward_hook(self):
        if "backward" in self._hooks:
            return
        import torch

        program_backward = torch.Tensor.backward
        fault = self

        def backward(tensor, *args, **kwargs):
            call = program_backward
            for wrapper in fault._wrap_backward:
                call = _bind(wrapper, call)
            result = call(tensor, *args, **kwargs)
            for callback in fault._after_backward:
                callback()
            return result

        torch.Tensor.backward = backward
        self._hooks.add("backward")

    def _ddp_hook(self):
        if "ddp" in self._hooks:
            return
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        program_init = DistributedDataParallel.__init__
        fault = self

        def communicate(state, bucket):
            import torch

            buffer = bucket.buffer()
            for before in fault._allreduce_before:
                before(buffer, bucket.index())
            if fault.allreduce_skipped:
                work = torch.futures.Future()
                work.set_result(buffer)
            else:
                if fault.allreduce_op is None:  # DDP's own: the mean of the ranks' gradients
                    buffer.div_(dist.get_world_size())
                op = dist.ReduceOp.SUM if fault.allreduce_op is None else fault.allreduce_op
                work = dist.all_reduce(buffer, op=op, async_op=True).get_future()

            def finish(result):
                value = result.value()
                reduced = value[0] if isinstance(value, list) else value
                for after in fault._allreduce_after:
                    after(reduced)
                return reduced

            return work.then(finish)

        def init(module, *args, **kwargs):
            program_init(module, *args, **kwargs)
            module.register_comm_hook(None, communicate)

        DistributedDataParallel.__init__ = init
        self._hooks.add("ddp")

    # --- what an operator may use -----------------------------------------------------------------------------
    def note(self, what, **details):
        """Say what the fault did, on stderr (the run's output keeps it; the report protocol has no record for it)."""
        print(json.dumps({"silentbench_fault": what, "step": self.step, "rank": self.rank, **details}),
              file=sys.stderr, flush=True)

    flip_bit = staticmethod(flip_bit)
    set_bit = staticmethod(set_bit)
    bit_of = staticmethod(bit_of)

    @property
    def bit(self):
        """The bit a bit-flip operator's severity names (float32)."""
        return FLOAT32_BITS[self.parameters["bit"]]

    @property
    def sticky(self):
        return self.persistence == "sticky"

    def choose_element(self, tensors):
        """(tensor, flat index), uniformly over every element of ``tensors`` (the same choice on every rank)."""
        sizes = [tensor.numel() for tensor in tensors]
        pick = self.random.randrange(sum(sizes))
        for tensor, size in zip(tensors, sizes):
            if pick < size:
                return tensor, pick
            pick -= size
        raise ValueError("no element to choose from")


def _bind(wrapper, inner):
    def call(tensor, *args, **kwargs):
        return wrapper(inner, tensor, *args, **kwargs)

    return call


def owned_parameters(optimizer):
    return [param for group in optimizer.param_groups for param in group["params"]]


def install():
    """Arm the mutant's fault in this process, once; the fixed variant (the clean twin) arms nothing."""
    global _installed
    if _installed is not None:
        return _installed
    armed = _armed()
    os.putenv(ARMED_ENV, "1" if armed else "0")  # for the ranks it spawns; os.environ does not show it
    _installed = False
    if not armed:
        return _installed
    here = Path(__file__).resolve().parent
    config = json.loads((here / CONFIG_FILE).read_text(encoding="utf-8"))
    sys.path.insert(0, str(here))
    import fault_operator

    _installed = Fault(config, _seed())
    _installed._optimizer_hooks()  # the step count, which every operator's timing goes by
    fault_operator.inject(_installed)
    return _installed
