"""Loss spikes, read at ``Tensor.backward()`` on the scalar loss. Two rules, two detectors."""
import math
import statistics
from collections import deque

from .base import DROP_IN, DetectorPlugin, register


def watch_losses(probe, on_loss, finite_only=True):
    """Call ``on_loss(value)`` with every scalar that ``backward()`` starts from (only the finite ones when
    ``finite_only``)."""
    import torch

    original_backward = torch.Tensor.backward

    def observed_backward(tensor, *args, **kwargs):
        if tensor.numel() == 1 and tensor.is_floating_point():
            value = float(tensor.detach())
            if math.isfinite(value) or not finite_only:
                on_loss(value)
        return original_backward(tensor, *args, **kwargs)

    torch.Tensor.backward = observed_backward


@register
class MegatronLossSpike(DetectorPlugin):
    """Megatron-LM's check: a loss at least ``factor`` times the largest of the first ``window`` losses."""

    name = "loss_spike_megatron"
    version = "1"
    integration = DROP_IN
    description = ("Alarms when a loss is >= factor x the maximum of the first `window` losses (Megatron-LM's "
                   "rule; until the window is full, the maximum of the losses seen so far).")
    default_config = {"factor": 10.0, "window": 100}

    def install(self, probe):
        factor, window = float(probe.config["factor"]), int(probe.config["window"])
        reference = []

        def on_loss(value):
            if reference and max(reference) > 0 and value >= factor * max(reference):
                probe.alarm("loss_spike", f"loss {value:.4g} >= {factor:g} x {max(reference):.4g}",
                            {"loss": value, "reference_max": max(reference)})
            if len(reference) < window:
                reference.append(value)

        watch_losses(probe, on_loss)


@register
class ZScoreLossSpike(DetectorPlugin):
    """A rolling z-score: the loss is ``z`` standard deviations above the mean of the last ``window``."""

    name = "loss_spike_zscore"
    version = "1"
    integration = DROP_IN
    description = ("Alarms when (loss - mean) / std over the previous `window` losses exceeds `z`, once at least "
                   "`min_samples` losses were seen.")
    default_config = {"window": 20, "z": 6.0, "min_samples": 8}

    def install(self, probe):
        window, z, min_samples = int(probe.config["window"]), float(probe.config["z"]), int(probe.config["min_samples"])
        recent = deque(maxlen=window)

        def on_loss(value):
            if len(recent) >= min_samples:
                mean, std = statistics.fmean(recent), statistics.pstdev(recent)
                score = (value - mean) / std if std > 0 else (math.inf if value > mean else 0.0)
                if score > z:
                    probe.alarm("loss_zscore", f"loss {value:.4g} is {score:.1f} std above the rolling mean",
                                {"loss": value, "mean": mean, "std": std, "z": score})
            recent.append(value)

        watch_losses(probe, on_loss)
