"""One bit flipped in a gradient: in the trigger step, once its gradients are complete (every micro-batch's backward
done and, in DDP, averaged), one element of one gradient on the target rank has one bit flipped before the program
uses it: before it clips the gradients, if it does, else before the optimizer steps (silent data corruption in a
GEMM or in memory). Sticky: the same bit of the same element is flipped again in every later step. The element is
drawn uniformly over all gradients, per mutant and seed. Severity: the bit, from the lowest mantissa bit to the
highest exponent bit."""
NAME = "bitflip-gradient"
FAULT_CLASS = "hardware"
MIRRORS = "silent data corruption"
SUMMARY = "one bit of one gradient element flipped at the trigger step (transient) or at every step from it (sticky)"
SEVERITIES = [(bit, {"bit": bit}) for bit in ("man-lo", "man-hi", "exp-lo", "sign", "exp-hi")]
REQUIRES_ANY = ()
PERSISTENCE = ("transient", "sticky")


def inject(fault):
    tracked = []  # the parameters, in the order the first step's optimizer held them
    chosen = {}
    flipped_steps = set()

    def remember(optimizer):
        if not tracked:
            tracked.extend(param for group in optimizer.param_groups for param in group["params"])

    def corrupt():
        hit = fault.step == fault.trigger_step or (fault.sticky and fault.started())
        if not hit or fault.step in flipped_steps or not fault.on_target_rank() or not tracked:
            return
        if not chosen:
            param, index = fault.choose_element([param for param in tracked if param.grad is not None])
            chosen.update(param=param, index=index)
        if chosen["param"].grad is None:
            return
        flipped_steps.add(fault.step)  # once a step, whichever comes first: the clipping or the optimizer's step
        before, after = fault.flip_bit(chosen["param"].grad, chosen["index"], fault.bit)
        fault.note("gradient bit flipped", index=chosen["index"], before=before, after=after)

    fault.before_step(remember)
    fault.before_step(lambda optimizer: corrupt())
    fault.before_clipping(corrupt)
