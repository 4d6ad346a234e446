"""A learning-rate schedule shifted by ``n`` steps: from the trigger step on, step ``i`` uses the rate the schedule
gave step ``i - n`` (a scheduler stepped late, or restored with the wrong ``last_epoch`` on resume: the catalog's
"wrong schedule state" bugs). The shifted rate is what the scheduler leaves in the optimizer's groups, so the program,
its step records, ``get_last_lr()`` and every detector read it. Only pipelines whose rate follows a
``torch.optim.lr_scheduler`` are mutated. Severity: the shift, 1 to 8 steps."""
NAME = "lr-schedule-shifted"
FAULT_CLASS = "software"
MIRRORS = "wrong state on resume"
SUMMARY = "step i trains with the learning rate scheduled for step i - n"
SEVERITIES = [("shift-1", {"shift": 1}), ("shift-2", {"shift": 2}), ("shift-4", {"shift": 4}),
              ("shift-8", {"shift": 8})]
REQUIRES_ANY = ("schedule",)
PERSISTENCE = ("",)


def inject(fault):
    shift = fault.parameters["shift"]
    scheduled = {}  # step -> the rates the schedule gave it, by group

    def restored(scheduler):  # a chainable schedule goes on from the rate it gave the step that ended, not the shift
        for group, rate in zip(scheduler.optimizer.param_groups, scheduled.get(fault.step - 1, [])):
            group["lr"] = rate

    def shifted(scheduler):
        rates = [group["lr"] for group in scheduler.optimizer.param_groups]
        scheduled[fault.step] = rates
        if fault.started():
            earlier = scheduled.get(max(0, fault.step - shift), rates)
            for group, rate in zip(scheduler.optimizer.param_groups, earlier):
                group["lr"] = rate
            scheduler._last_lr = list(earlier)  # what get_last_lr() tells the program, as the shifted scheduler's

    fault.on_scheduler_step(before=restored, after=shifted)
