"""A missing ``zero_grad``: from the trigger step on, every ``period``-th call to ``optimizer.zero_grad()`` does
nothing, so that step's gradient is added to the last one's (the catalog's "missing call" bugs, such as a
``zero_grad`` inside the wrong branch). Severity: how often it is missed, from every 8th step to every step."""
NAME = "zero-grad-skipped"
FAULT_CLASS = "software"
MIRRORS = "missing call"
SUMMARY = "optimizer.zero_grad() skipped every k-th step, so gradients accumulate across steps"
SEVERITIES = [("every-8", {"period": 8}), ("every-4", {"period": 4}), ("every-2", {"period": 2}),
              ("every-step", {"period": 1})]
REQUIRES_ANY = ()
PERSISTENCE = ("",)


def inject(fault):
    period = fault.parameters["period"]

    def skipped():
        if fault.every(period):
            fault.note("zero_grad skipped")
            return True
        return False

    fault.skip_zero_grad(skipped)
