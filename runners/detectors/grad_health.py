from .base import DROP_IN, DetectorPlugin, register


@register
class GradientHealth(DetectorPlugin):
    """smdebug's gradient rules: vanishing, exploding, and the weight update ratio."""

    name = "grad_health"
    version = "1"
    integration = DROP_IN
    description = (
        "Around every optimizer step: vanishing gradient when the mean |g| over all gradients < `vanishing` "
        "(smdebug VanishingGradient); exploding gradient when the global grad norm exceeds `exploding_factor` x "
        "the median of the previous norms (after `warmup` steps) or `exploding_norm`; update ratio "
        "|w_new - w| / |w| of a parameter tensor outside [`ratio_min`, `ratio_max`] (smdebug WeightUpdateRatio)."
    )
    default_config = {"vanishing": 1e-7, "exploding_factor": 10.0, "exploding_norm": 1e6, "warmup": 5,
                      "ratio_min": 1e-8, "ratio_max": 10.0}

    def install(self, probe):
        import torch

        config = probe.config
        norms = []
        snapshots = {}

        def before(optimizer):
            grads = [p.grad.detach() for group in optimizer.param_groups for p in group["params"]
                     if p.grad is not None]
            if grads:
                total = sum(g.abs().sum().item() for g in grads)
                count = sum(g.numel() for g in grads)
                if total / count < config["vanishing"]:
                    probe.alarm("vanishing_gradient", f"mean |g| = {total / count:.3g} < {config['vanishing']:g}",
                                {"mean_abs_grad": total / count})
                norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
                baseline = sorted(norms)[len(norms) // 2] if len(norms) >= config["warmup"] else None
                if norm > config["exploding_norm"] or (baseline and norm > config["exploding_factor"] * baseline):
                    probe.alarm("exploding_gradient", f"grad norm {norm:.4g} (median so far {baseline})",
                                {"grad_norm": norm, "median_norm": baseline})
                norms.append(norm)
            snapshots[id(optimizer)] = [(p, p.detach().clone()) for group in optimizer.param_groups
                                        for p in group["params"] if p.grad is not None]

        def after(optimizer):
            outside = []
            for index, (param, old) in enumerate(snapshots.pop(id(optimizer), [])):
                weight = old.norm().item()
                if weight == 0:
                    continue
                ratio = (param.detach() - old).norm().item() / weight
                if not config["ratio_min"] <= ratio <= config["ratio_max"]:
                    outside.append((index, ratio))
            if outside:
                probe.alarm("update_ratio", f"{len(outside)} parameter tensor(s) with |dw|/|w| outside "
                            f"[{config['ratio_min']:g}, {config['ratio_max']:g}]",
                            {"ratios": [{"param": i, "ratio": r} for i, r in outside[:20]]})

        probe.on_optimizer_step(before=before, after=after)
