"""One bit flipped in an all-reduce payload: at the trigger step, one element of the target rank's gradient buckets
(drawn uniformly over all of them) has one bit flipped on its way into DDP's all-reduce, so every rank receives the
same corrupted mean (silent corruption in a NIC, a switch or a reduction kernel, which cross-rank checks cannot see).
Sticky: the same bit is flipped at every step from the trigger on. Only DDP pipelines are mutated. Severity: the bit,
from the lowest mantissa bit to the highest exponent bit."""
NAME = "bitflip-allreduce"
FAULT_CLASS = "hardware"
MIRRORS = "silent data corruption"
SUMMARY = "one bit of one rank's all-reduce payload flipped at the trigger step (transient) or every step (sticky)"
SEVERITIES = [(bit, {"bit": bit}) for bit in ("man-lo", "man-hi", "exp-lo", "sign", "exp-hi")]
REQUIRES_ANY = ("ddp",)
PERSISTENCE = ("transient", "sticky")


def inject(fault):
    # step -> {bucket index: its elements}; the draw goes by the step before the trigger's, whose buckets were all
    # reduced (DDP may rebuild its buckets after the first step, so the earliest layout can be stale)
    layouts = {}
    chosen = {}
    flipped_steps = set()

    def corrupt(buffer, bucket):
        layouts.setdefault(fault.step, {})[bucket] = buffer.numel()
        hit = fault.step == fault.trigger_step or (fault.sticky and fault.started())
        if not hit or fault.step in flipped_steps or not fault.on_target_rank():
            return
        if not chosen:
            layout = layouts.get(fault.step - 1) or layouts[fault.step]
            chosen.update(layout=layout, element=fault.random.randrange(sum(layout.values())))
        index = chosen["element"] - sum(size for other, size in chosen["layout"].items() if other < bucket)
        if not 0 <= index < buffer.numel():
            return  # the element is in another bucket
        flipped_steps.add(fault.step)
        before, after = fault.flip_bit(buffer, index, fault.bit)
        fault.note("all-reduce payload bit flipped", bucket=bucket, index=index, before=before, after=after)

    fault.on_allreduce(before=corrupt)
