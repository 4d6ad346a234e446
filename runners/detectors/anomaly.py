from .base import DROP_IN, DetectorPlugin, register


@register
class AutogradAnomaly(DetectorPlugin):
    """``torch.autograd.detect_anomaly``, with its error turned into an alarm at the current step."""

    name = "detect_anomaly"
    only_observes = False  # a backward that raises on a NaN returns instead: the program goes on without its gradients
    version = "1"
    integration = DROP_IN
    description = (
        "Turns on torch.autograd.set_detect_anomaly(True) for the whole run. When backward() raises because a "
        "backward function returned NaN, the error becomes an alarm at the current step and the step carries on "
        "without that backward pass (as a training loop that skips bad batches would)."
    )
    default_config = {"check_nan": True}

    def install(self, probe):
        import torch

        torch.autograd.set_detect_anomaly(True, check_nan=bool(probe.config["check_nan"]))
        original_backward = torch.Tensor.backward

        def anomaly_backward(tensor, *args, **kwargs):
            try:
                return original_backward(tensor, *args, **kwargs)
            except RuntimeError as error:
                if "nan values" not in str(error).lower():
                    raise
                probe.alarm("autograd_anomaly", str(error).splitlines()[0][:500])
                return None

        torch.Tensor.backward = anomaly_backward
