"""One bit flipped in an optimizer moment: after the update of the step before the trigger, one element of one state
tensor of the optimizer (Adam's first or second moment, SGD's momentum buffer) on the target rank has one bit
flipped, so the trigger step's update uses it. Sticky: the bit stays stuck at its flipped value after every later
update. The element is drawn uniformly over the state tensors, per mutant and seed. Severity: the bit, from the
lowest mantissa bit to the highest exponent bit."""
NAME = "bitflip-moment"
FAULT_CLASS = "hardware"
MIRRORS = "silent data corruption"
SUMMARY = "one bit of one optimizer moment flipped (transient) or stuck (sticky) from the trigger step"
SEVERITIES = [(bit, {"bit": bit}) for bit in ("man-lo", "man-hi", "exp-lo", "sign", "exp-hi")]
REQUIRES_ANY = ()
PERSISTENCE = ("transient", "sticky")


def moments(optimizer):
    import torch

    return [value for state in optimizer.state.values() for _, value in sorted(state.items())
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 1]


def inject(fault):
    chosen = {}

    def corrupt(optimizer):
        if not fault.on_target_rank() or fault.step < fault.trigger_step - 1:
            return
        if fault.step == fault.trigger_step - 1:
            tensor, index = fault.choose_element(moments(optimizer))
            before, after = fault.flip_bit(tensor, index, fault.bit)
            chosen.update(tensor=tensor, index=index, value=fault.bit_of(tensor, index, fault.bit))
            fault.note("optimizer moment bit flipped", index=index, before=before, after=after)
        elif fault.sticky and chosen:
            fault.set_bit(chosen["tensor"], chosen["index"], fault.bit, chosen["value"])

    fault.after_step(corrupt)
