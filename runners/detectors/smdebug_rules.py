"""Amazon SageMaker Debugger's built-in rules for deep-learning frameworks, re-implemented from their public
documentation ("List of Debugger built-in rules", docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html),
one detector per rule, with the documented defaults. The service is closed to new customers and the rules' source
was never published, so where the page leaves a formula open, the choice made here is said in the description.

What differs from the service, for every rule:
* a rule is evaluated at every step, in the training process; the service reads tensors that smdebug's hook saved
  (every 500 steps by default) and runs the rule in a separate job. The reproducers train for tens of steps.
* the collections are what smdebug's PyTorch hook names so: ``gradients`` and ``weights`` are the parameters an
  optimizer owns, around ``optimizer.step()``; ``losses`` is the scalar that ``backward()`` starts from;
  ``relu_input``/``relu_output``, ``tanh_input``, ``sigmoid_input`` are the inputs and outputs of ``nn.ReLU``,
  ``nn.Tanh`` and ``nn.Sigmoid`` modules (functional calls are not modules, and smdebug does not see them either).

``grad_health``, older, folds three of these rules into one detector with thresholds of its own; these follow the
documentation rule by rule.
"""
from .base import DROP_IN, DetectorPlugin, owned_parameters, register
from .loss_spike import watch_losses
from .shadow import Torch

SOURCE = "SageMaker Debugger built-in rule"


def gradients(optimizer):
    """(index, gradient) of the parameters an optimizer owns; a sparse gradient (an embedding's) as its values."""
    found = []
    for index, param in enumerate(owned_parameters(optimizer)):
        if param.grad is not None:
            grad = param.grad.detach()
            found.append((index, grad.coalesce().values() if grad.is_sparse else grad))
    return found


def watch_modules(kinds, on_call):
    """Call ``on_call(module, input, output)`` for every call of a module of one of ``kinds`` (tensors detached)."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook

    is_compiling = Torch().is_compiling

    def hook(module, args, output):
        if (isinstance(module, kinds) and not is_compiling() and args and isinstance(args[0], torch.Tensor)
                and isinstance(output, torch.Tensor) and output.numel()):
            on_call(module, args[0].detach(), output.detach())

    register_module_forward_hook(hook)


def inactive_percent(tensor, active, inactivity):
    """The % of a layer's units (every position but the batch's first dimension) for which ``active`` holds on less
    than ``inactivity`` % of the batch."""
    batch = tensor.reshape(tensor.shape[0], -1) if tensor.dim() > 1 else tensor.reshape(1, -1)
    shares = active(batch).double().mean(dim=0)
    return (shares * 100 < inactivity).double().mean().item() * 100


class LayerAlarms:
    """The layers of a rule numbered in the order first seen, and at most one alarm a layer a step."""

    def __init__(self, probe):
        self.probe, self.numbers, self.raised = probe, {}, set()

    def alarm(self, module, rule, message, evidence):
        """``message`` and ``evidence`` are functions of the layer's number."""
        number = self.numbers.setdefault(id(module), len(self.numbers))
        if (number, self.probe.step) not in self.raised:
            self.raised.add((number, self.probe.step))
            self.probe.alarm(rule, message(number), {"layer": number, **evidence})


class SageMakerRule(DetectorPlugin):
    """What the seven rules share: drop-in, first versions, left out of the quickstart (docs/performance.md)."""

    version = "1"
    integration = DROP_IN
    in_quickstart = False


@register
class VanishingGradient(SageMakerRule):
    name = "smdebug_vanishing_gradient"
    description = (f"{SOURCE} VanishingGradient: alarm `vanishing_gradient` at a step where the mean of the absolute "
                   "values of any gradient tensor is below `threshold` (default 1e-7).")
    default_config = {"threshold": 1e-7}

    def install(self, probe):
        threshold = float(probe.config["threshold"])

        def before(optimizer):
            small = [(index, grad.abs().mean().item()) for index, grad in gradients(optimizer) if grad.numel()]
            small = [(index, mean) for index, mean in small if mean < threshold]
            if small:
                probe.alarm("vanishing_gradient", f"{len(small)} gradient tensor(s) with mean |g| < {threshold:g}",
                            {"tensors": [{"param": index, "mean_abs": mean} for index, mean in small[:20]]})

        probe.on_optimizer_step(before=before)


@register
class ExplodingTensor(SageMakerRule):
    name = "smdebug_exploding_tensor"
    description = (f"{SOURCE} ExplodingTensor: alarm `exploding_tensor` when a saved tensor (the loss, every "
                   "gradient before the step, every weight after it) holds a NaN or an infinity (only NaN when "
                   "`only_nan`; default false).")
    default_config = {"only_nan": False}

    def install(self, probe):
        import math

        import torch

        only_nan = bool(probe.config["only_nan"])

        def bad(tensor):
            return bool(torch.isnan(tensor).any()) if only_nan else not bool(torch.isfinite(tensor).all())

        def on_loss_value(value):
            if math.isnan(value) or (not only_nan and math.isinf(value)):
                probe.alarm("exploding_tensor", f"the loss is {value}", {"collection": "losses"})

        def before(optimizer):
            found = [index for index, grad in gradients(optimizer) if grad.is_floating_point() and bad(grad)]
            if found:
                probe.alarm("exploding_tensor", f"{len(found)} gradient tensor(s) not finite",
                            {"collection": "gradients", "params": found[:20]})

        def after(optimizer):
            found = [index for index, weight in enumerate(owned_parameters(optimizer)) if bad(weight.detach())]
            if found:
                probe.alarm("exploding_tensor", f"{len(found)} weight tensor(s) not finite",
                            {"collection": "weights", "params": found[:20]})

        watch_losses(probe, on_loss_value, finite_only=False)
        probe.on_optimizer_step(before=before, after=after)


@register
class LossNotDecreasing(SageMakerRule):
    name = "smdebug_loss_not_decreasing"
    description = (f"{SOURCE} LossNotDecreasing: every `num_steps` steps (default 10), the step's loss is compared "
                   "with the loss `num_steps` steps earlier; alarm `loss_not_decreasing` when it has not fallen by "
                   "at least `diff_percent` % of the earlier one (default 0.1). The documented "
                   "`increase_threshold_percent` has no formula on the page and is not implemented.")
    default_config = {"num_steps": 10, "diff_percent": 0.1}

    def install(self, probe):
        every, percent = max(1, int(probe.config["num_steps"])), float(probe.config["diff_percent"])
        losses = {}  # step: the first loss backward() started from in it

        def on_loss(value):
            step = probe.step
            if step in losses:
                return
            losses[step] = value
            earlier = losses.get(step - every)
            if step and step % every == 0 and earlier is not None and value > earlier - abs(earlier) * percent / 100:
                probe.alarm("loss_not_decreasing", f"loss {value:.4g} at step {step} has not fallen {percent:g} % "
                            f"below {earlier:.4g} at step {step - every}", {"loss": value, "earlier": earlier})

        watch_losses(probe, on_loss)


@register
class DeadRelu(SageMakerRule):
    name = "smdebug_dead_relu"
    description = (f"{SOURCE} DeadRelu: a unit of an nn.ReLU's output is dead when it is active (> 0) for less "
                   "than `threshold_inactivity` % of the batch (default 1.0); alarm `dead_relu` when more than "
                   "`threshold_layer` % of a layer's units are dead (default 50). Judged on each call, the batch "
                   "standing for the documented 'of the time'.")
    default_config = {"threshold_inactivity": 1.0, "threshold_layer": 50.0}

    def install(self, probe):
        import torch

        inactivity, layer_share = float(probe.config["threshold_inactivity"]), float(probe.config["threshold_layer"])
        layers = LayerAlarms(probe)

        def on_call(module, _input, output):
            dead = inactive_percent(output, lambda batch: batch > 0, inactivity)
            if dead > layer_share:
                layers.alarm(module, "dead_relu",
                             lambda number: f"ReLU #{number}: {dead:.0f} % of its units are dead (> {layer_share:g} %)",
                             {"dead_percent": dead})

        watch_modules((torch.nn.ReLU,), on_call)


@register
class WeightUpdateRatio(SageMakerRule):
    name = "smdebug_weight_update_ratio"
    description = (f"{SOURCE} WeightUpdateRatio: for each weight tensor, |w_new - w_old| / (|w_old| + `epsilon`) "
                   "across one optimizer step (Euclidean norms: the page names the ratio, not the norm); alarm "
                   "`weight_update_ratio` when it is above `large_threshold` (default 10) or below "
                   "`small_threshold` (default 1e-8); epsilon 1e-9.")
    default_config = {"large_threshold": 10.0, "small_threshold": 1e-8, "epsilon": 1e-9}

    def install(self, probe):
        config = probe.config
        large, small, epsilon = (float(config["large_threshold"]), float(config["small_threshold"]),
                                 float(config["epsilon"]))
        before_step = {}

        def before(optimizer):
            before_step[id(optimizer)] = [(param, param.detach().clone()) for param in owned_parameters(optimizer)
                                          if param.grad is not None]

        def after(optimizer):
            outside = []
            for index, (param, old) in enumerate(before_step.pop(id(optimizer), [])):
                ratio = (param.detach() - old).norm().item() / (old.norm().item() + epsilon)
                if ratio > large or ratio < small:
                    outside.append({"param": index, "ratio": ratio})
            if outside:
                probe.alarm("weight_update_ratio", f"{len(outside)} weight tensor(s) with an update ratio outside "
                            f"[{small:g}, {large:g}]", {"tensors": outside[:20]})

        probe.on_optimizer_step(before=before, after=after)


@register
class PoorWeightInitialization(SageMakerRule):
    name = "smdebug_poor_weight_initialization"
    description = (f"{SOURCE} PoorWeightInitialization, over the first `steps` steps (default 10): alarm "
                   "`activation_variance_ratio` when the largest variance of an nn.ReLU's input is more than "
                   "`threshold` times the smallest one's over the layers of a step (default 10); "
                   "`narrow_gradients` when the 5th-95th percentile spread of all gradients is below "
                   "`distribution_range` (default 0.001); `loss_not_decreasing_early` when the loss has not fallen "
                   "below its first value within `patience` steps (default 5).")
    default_config = {"threshold": 10.0, "distribution_range": 0.001, "patience": 5, "steps": 10}

    def install(self, probe):
        import torch

        config = probe.config
        ratio_limit, spread_limit = float(config["threshold"]), float(config["distribution_range"])
        patience, steps = int(config["patience"]), int(config["steps"])
        variances, losses, said = {}, [], set()

        def once(rule, message, evidence):
            if rule not in said:
                said.add(rule)
                probe.alarm(rule, message, evidence)

        def on_call(module, relu_input, _output):
            if probe.step < steps:
                variances.setdefault(probe.step, {}).setdefault(id(module), relu_input.double().var().item())

        def before(optimizer):
            if probe.step >= steps:
                return
            layers = variances.get(probe.step, {})
            if len(layers) > 1 and min(layers.values()) > 0:
                ratio = max(layers.values()) / min(layers.values())
                if ratio > ratio_limit:
                    once("activation_variance_ratio", f"ReLU input variances differ {ratio:.3g}x across layers",
                         {"ratio": ratio})
            grads = [grad.flatten().double().cpu() for _, grad in gradients(optimizer)]
            if grads:
                values = torch.cat(grads)
                spread = (torch.quantile(values, 0.95) - torch.quantile(values, 0.05)).item() if values.numel() <= (
                    1 << 24) else None
                if spread is not None and spread < spread_limit:
                    once("narrow_gradients", f"gradients' 5th-95th percentile spread {spread:.3g} < {spread_limit:g}",
                         {"spread": spread})

        def on_loss(value):
            if probe.step >= steps:
                return
            if not losses or losses[-1][0] != probe.step:
                losses.append((probe.step, value))
            first_step, first = losses[0]
            if probe.step - first_step >= patience and min((loss for _, loss in losses[1:]), default=first) >= first:
                once("loss_not_decreasing_early", f"the loss has not fallen below {first:.4g} in {patience} steps",
                     {"first_loss": first})

        watch_modules((torch.nn.ReLU,), on_call)
        watch_losses(probe, on_loss)
        probe.on_optimizer_step(before=before)


@register
class SaturatedActivation(SageMakerRule):
    name = "smdebug_saturated_activation"
    description = (f"{SOURCE} SaturatedActivation: a unit of an nn.Tanh's (nn.Sigmoid's) input is saturated when "
                   "it lies inside (`threshold_tanh_min`, `threshold_tanh_max`) = (-9.4999, 9.4999) "
                   "((`threshold_sigmoid_min`, `threshold_sigmoid_max`) = (-23, 16.99999)) for less than "
                   "`threshold_inactivity` % of the batch (default 1.0); alarm `saturated_activation` when more "
                   "than `threshold_layer` % of a layer's units are saturated (default 50).")
    default_config = {"threshold_tanh_min": -9.4999, "threshold_tanh_max": 9.4999, "threshold_sigmoid_min": -23.0,
                      "threshold_sigmoid_max": 16.99999, "threshold_inactivity": 1.0, "threshold_layer": 50.0}

    def install(self, probe):
        import torch

        config = probe.config
        inactivity, layer_share = float(config["threshold_inactivity"]), float(config["threshold_layer"])
        layers = LayerAlarms(probe)

        def on_call(module, activation_input, _output):
            kind = "tanh" if isinstance(module, torch.nn.Tanh) else "sigmoid"
            low, high = float(config[f"threshold_{kind}_min"]), float(config[f"threshold_{kind}_max"])
            saturated = inactive_percent(activation_input, lambda batch: (batch > low) & (batch < high), inactivity)
            if saturated > layer_share:
                layers.alarm(module, "saturated_activation",
                             lambda number: f"{kind} #{number}: {saturated:.0f} % of its units saturated",
                             {"activation": kind, "saturated_percent": saturated})

        watch_modules((torch.nn.Tanh, torch.nn.Sigmoid), on_call)
