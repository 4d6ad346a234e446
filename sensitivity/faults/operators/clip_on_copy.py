"""Gradient clipping applied to a copy: on every ``period``-th step from the trigger on,
``torch.nn.utils.clip_grad_norm_`` clips a copy of the gradients and returns the right norm, while the gradients the
optimizer uses stay unclipped (the catalog's "operation on a copy" bugs, such as clipping ``[p.grad.clone() ...]``
or a gradient re-materialised after the clip). Only pipelines that clip are mutated. Severity: how often, from every
8th step to every step."""
NAME = "clip-on-copy"
FAULT_CLASS = "software"
MIRRORS = "operation on a copy"
SUMMARY = "clip_grad_norm_ clips a copy of the gradients on every k-th step"
SEVERITIES = [("every-8", {"period": 8}), ("every-4", {"period": 4}), ("every-2", {"period": 2}),
              ("every-step", {"period": 1})]
REQUIRES_ANY = ("clipping",)
PERSISTENCE = ("",)


def inject(fault):
    import torch
    import torch.nn.utils.clip_grad as clip_grad

    period = fault.parameters["period"]
    program = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        if not fault.every(period):
            return program(parameters, max_norm, *args, **kwargs)
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        copies = [torch.nn.Parameter(param.detach().clone()) for param in parameters if param.grad is not None]
        for copy, param in zip(copies, [param for param in parameters if param.grad is not None]):
            copy.grad = param.grad.detach().clone()
        fault.note("gradients clipped on a copy")
        return program(copies, max_norm, *args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
    clip_grad.clip_grad_norm_ = clip_grad_norm_
