import math

from .base import DROP_IN, DetectorPlugin, register


@register
class NanInfDetector(DetectorPlugin):
    """Megatron-style check: a non-finite loss at ``backward()``, or a non-finite gradient before a step."""

    name = "nan_inf"
    version = "1"
    integration = DROP_IN
    description = (
        "Alarms when the tensor that backward() starts from (the loss) is NaN or Inf, and when any "
        "gradient owned by an optimizer holds a NaN or Inf just before optimizer.step()."
    )
    default_config = {"check_loss": True, "check_grads": True}

    def install(self, probe):
        import torch

        if probe.config["check_loss"]:
            original_backward = torch.Tensor.backward

            def checked_backward(tensor, *args, **kwargs):
                if tensor.numel() == 1 and tensor.is_floating_point():
                    value = float(tensor.detach())
                    if not math.isfinite(value):
                        probe.alarm("loss_nonfinite", f"backward() called on a non-finite loss ({value})",
                                    {"loss": value})  # stored as "NaN" / "Infinity" (runners.report.json_safe)
                return original_backward(tensor, *args, **kwargs)

            torch.Tensor.backward = checked_backward

        if probe.config["check_grads"]:
            def check_grads(optimizer):
                bad = []
                for group in optimizer.param_groups:
                    for index, param in enumerate(group["params"]):
                        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
                            bad.append(index)
                if bad:
                    probe.alarm("grad_nonfinite", f"{len(bad)} gradient(s) hold NaN/Inf before optimizer.step()",
                                {"param_indices": bad[:20]})

            probe.on_optimizer_step(before=check_grads)
