"""One bit flipped in a weight: after the update of the step before the trigger, one element of one parameter on
the target rank has one bit flipped, so the trigger step computes with it (silent data corruption in memory, as
reported at scale by Meta, Google and Alibaba). Sticky: the bit stays stuck at its flipped value after every later
update (a stuck-at cell), not only once. The element is drawn uniformly over all parameters, per mutant and seed.
Severity: the bit, from the lowest mantissa bit to the highest exponent bit."""
NAME = "bitflip-weight"
FAULT_CLASS = "hardware"
MIRRORS = "silent data corruption"
SUMMARY = "one bit of one weight flipped (transient) or stuck (sticky) from the trigger step"
SEVERITIES = [(bit, {"bit": bit}) for bit in ("man-lo", "man-hi", "exp-lo", "sign", "exp-hi")]
REQUIRES_ANY = ()
PERSISTENCE = ("transient", "sticky")


def inject(fault):
    chosen = {}

    def corrupt(optimizer):
        if not fault.on_target_rank() or fault.step < fault.trigger_step - 1:
            return
        if fault.step == fault.trigger_step - 1:
            params = [param for group in optimizer.param_groups for param in group["params"]]
            tensor, index = fault.choose_element(params)
            before, after = fault.flip_bit(tensor, index, fault.bit)
            chosen.update(tensor=tensor, index=index, value=fault.bit_of(tensor, index, fault.bit))
            fault.note("weight bit flipped", index=index, before=before, after=after)
        elif fault.sticky and chosen:
            fault.set_bit(chosen["tensor"], chosen["index"], fault.bit, chosen["value"])

    fault.after_step(corrupt)
