"""A stale gradient after a skipped backward: on every ``period``-th step from the trigger on, neither
``zero_grad()`` nor ``backward()`` runs, so the optimizer steps again with the previous step's gradient (the catalog's
"skipped or misplaced backward" bugs, such as an early ``continue`` after ``optimizer.step()`` was already reached).
Severity: how often, from every 8th step to every step (then training follows one frozen gradient)."""
NAME = "stale-gradient"
FAULT_CLASS = "software"
MIRRORS = "missing call"
SUMMARY = "backward() and zero_grad() skipped on every k-th step, so the previous gradient is applied again"
SEVERITIES = [("every-8", {"period": 8}), ("every-4", {"period": 4}), ("every-2", {"period": 2}),
              ("every-step", {"period": 1})]
REQUIRES_ANY = ()
PERSISTENCE = ("",)


def inject(fault):
    period = fault.parameters["period"]

    def skipped():
        return fault.step > 0 and fault.every(period)  # step 0 has no earlier gradient to reuse

    fault.skip_zero_grad(skipped)

    def backward(program_backward, tensor, *args, **kwargs):
        if skipped():
            fault.note("backward skipped: the previous gradient is applied again")
            return None
        return program_backward(tensor, *args, **kwargs)

    fault.wrap_backward(backward)
