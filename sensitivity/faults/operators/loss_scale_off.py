"""A loss scale off by a factor: from the trigger step on, the loss that ``backward()`` starts from is multiplied by
``factor`` and the gradients are never unscaled (a mixed-precision scaler applied twice, or a loss divided by the
accumulation steps once too often: the catalog's "wrong scaling" bugs). Adam's update hardly changes with the scale
of the gradient, SGD's is proportional to it: the same fault is benign for one pipeline and not for another.
Severity: the factor, 2 to 1024."""
NAME = "loss-scale-off"
FAULT_CLASS = "software"
MIRRORS = "wrong scaling"
SUMMARY = "the loss is multiplied by a factor before backward() and never unscaled"
SEVERITIES = [("x2", {"factor": 2.0}), ("x8", {"factor": 8.0}), ("x64", {"factor": 64.0}),
              ("x1024", {"factor": 1024.0})]
REQUIRES_ANY = ()
PERSISTENCE = ("",)


def inject(fault):
    factor = fault.parameters["factor"]

    def scaled(program_backward, tensor, *args, **kwargs):
        if fault.started() and tensor.numel() == 1:
            return program_backward(tensor * factor, *args, **kwargs)
        return program_backward(tensor, *args, **kwargs)

    fault.wrap_backward(scaled)
