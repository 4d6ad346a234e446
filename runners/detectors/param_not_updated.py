from .base import DROP_IN, DetectorPlugin, register


@register
class ParamNotUpdatedDetector(DetectorPlugin):
    """smdebug ``UnchangedTensor`` style: an optimizer step that leaves parameters as they were."""

    name = "param_not_updated"
    version = "1"
    integration = DROP_IN
    description = (
        "Snapshots every parameter an optimizer owns before optimizer.step() and compares after it. "
        "Alarms when the step changed none of them, or left unchanged a parameter whose gradient "
        "is non-zero while its learning rate is non-zero."
    )
    default_config = {"every_n_steps": 1}

    def install(self, probe):
        import torch

        every = max(1, int(probe.config["every_n_steps"]))
        snapshots = {}

        def before(optimizer):
            snapshots.pop(id(optimizer), None)
            if probe.step % every == 0:
                snapshots[id(optimizer)] = [
                    [param.detach().clone() for param in group["params"]] for group in optimizer.param_groups
                ]

        def after(optimizer):
            saved = snapshots.pop(id(optimizer), None)
            if saved is None:
                return
            total = changed = 0
            stuck_with_grad = []
            for group, group_saved in zip(optimizer.param_groups, saved):
                for index, (param, old) in enumerate(zip(group["params"], group_saved)):
                    total += 1
                    if not torch.equal(param.detach(), old):
                        changed += 1
                    elif group.get("lr", 1) != 0 and param.grad is not None and bool(param.grad.any()):
                        stuck_with_grad.append(index)
            if total and not changed:
                probe.alarm("no_parameter_updated",
                            f"optimizer.step() changed none of its {total} parameter(s)",
                            {"parameters": total})
            elif stuck_with_grad:
                probe.alarm("parameter_with_gradient_not_updated",
                            f"{len(stuck_with_grad)} parameter(s) with a non-zero gradient did not change",
                            {"param_indices": stuck_with_grad[:20]})

        probe.on_optimizer_step(before=before, after=after)
