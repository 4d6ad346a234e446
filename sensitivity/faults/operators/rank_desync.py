"""One rank's parameters desynchronised by a relative ``epsilon``: in the trigger step, before its update, the target
rank's parameters are multiplied by ``1 + epsilon * N(0, 1)`` element-wise, and DDP never broadcasts them again, so
the replicas train apart (the BLOOM-176B divergence, and the catalog's "replicas out of sync" bugs). Only DDP
pipelines are mutated. Severity: epsilon, 1e-6 to 1e-1."""
NAME = "rank-desync"
FAULT_CLASS = "software"
MIRRORS = "replicas out of sync"
SUMMARY = "one rank's parameters perturbed by a relative epsilon, never re-broadcast"
SEVERITIES = [("eps-1e-6", {"epsilon": 1e-6}), ("eps-1e-4", {"epsilon": 1e-4}), ("eps-1e-2", {"epsilon": 1e-2}),
              ("eps-1e-1", {"epsilon": 1e-1})]
REQUIRES_ANY = ("ddp",)
PERSISTENCE = ("",)


def inject(fault):
    import torch

    epsilon = fault.parameters["epsilon"]

    def desync(optimizer):
        if fault.step != fault.trigger_step or not fault.on_target_rank():
            return
        generator = torch.Generator().manual_seed(fault.random.randrange(2 ** 31))
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
                    param.mul_(1 + epsilon * noise)
        fault.note("parameters desynchronised", epsilon=epsilon)

    fault.before_step(desync)
