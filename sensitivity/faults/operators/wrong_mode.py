"""Dropout or BatchNorm left in the wrong mode: on every ``period``-th training step from the trigger on, each
BatchNorm, Dropout and multi-head attention layer runs as in evaluation (BatchNorm normalises with its running
statistics and does not update them; Dropout and attention dropout drop nothing), as after a ``model.eval()`` for
validation that ``model.train()`` never undid (the catalog's "wrong mode" bugs). Only pipelines with such layers are
mutated. Severity: how often, from every 8th step to every step."""
NAME = "wrong-mode"
FAULT_CLASS = "software"
MIRRORS = "wrong mode"
SUMMARY = "BatchNorm, Dropout and attention dropout run in evaluation mode during training on every k-th step"
SEVERITIES = [("every-8", {"period": 8}), ("every-4", {"period": 4}), ("every-2", {"period": 2}),
              ("every-step", {"period": 1})]
REQUIRES_ANY = ("batchnorm", "dropout")
PERSISTENCE = ("",)


def inject(fault):
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    SWITCHED = (_BatchNorm, _DropoutNd, torch.nn.MultiheadAttention)  # attention dropout goes by its module's mode
    period = fault.parameters["period"]
    switched = set()

    def before(module, args):
        if (isinstance(module, SWITCHED) and module.training and torch.is_grad_enabled()
                and fault.every(period)):
            module.training = False
            switched.add(id(module))

    def after(module, args, output):
        if id(module) in switched:
            switched.discard(id(module))
            module.training = True

    register_module_forward_pre_hook(before)
    register_module_forward_hook(after)
