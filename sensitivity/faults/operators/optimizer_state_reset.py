"""Optimizer state reset on resume: before the trigger step's update, and every ``period`` steps after it, the
optimizer's state (Adam's moments and step count, SGD's momentum) is emptied, as when a checkpoint is resumed without
the optimizer's ``state_dict`` (the catalog's "wrong state on resume" bugs). Severity: how often it resumes, from
every 16th step to every 2nd."""
NAME = "optimizer-state-reset"
FAULT_CLASS = "software"
MIRRORS = "wrong state on resume"
SUMMARY = "the optimizer's state emptied every k steps from the trigger on, as by a resume without it"
SEVERITIES = [("every-16", {"period": 16}), ("every-8", {"period": 8}), ("every-4", {"period": 4}),
              ("every-2", {"period": 2})]
REQUIRES_ANY = ()
PERSISTENCE = ("",)


def inject(fault):
    period = fault.parameters["period"]

    def reset(optimizer):
        if fault.every(period):
            optimizer.state.clear()
            fault.note("optimizer state reset")

    fault.before_step(reset)
