from .base import DROP_IN, DetectorPlugin, register


@register
class CrossRankConsistency(DetectorPlugin):
    """Parameters that start identical on every rank must stay identical (what BLOOM-176B needed)."""

    name = "cross_rank_consistency"
    version = "2"
    integration = DROP_IN
    description = (
        "In a torch.distributed run, all-gathers a checksum of every parameter an optimizer owns. Parameters "
        "whose checksums agree on all ranks before the first step are replicas (data-parallel copies, "
        "tensor-parallel LayerNorms...); after every step, a replica whose checksum differs between ranks "
        "raises an alarm. Sharded parameters, which differ from the start, are left alone. Unlike Megatron's "
        "data-parallel-only check it needs no annotation of which parameters are replicated. Only the first "
        "optimizer that steps in each process (the training optimizer) is followed, so that a rank-local extra "
        "optimizer (a single-device reference on rank 0) cannot unbalance the collectives. Single-process runs "
        "are not checked."
    )
    default_config = {"every_n_steps": 1}

    def install(self, probe):
        import torch
        import torch.distributed as dist

        every = max(1, int(probe.config["every_n_steps"]))
        replicas = {}

        def checksums(optimizer):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            local = torch.tensor([[p.detach().double().sum().item(), (p.detach().double() ** 2).sum().item()]
                                  for p in params], dtype=torch.float64)
            gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, local)
            return torch.stack(gathered)  # ranks x params x 2

        def agreeing(table):
            return (table == table[0]).all(dim=2).all(dim=0)

        followed = []  # the training optimizer: the first to step in this process, the same on every rank

        def before(optimizer):
            if not followed and dist.is_available() and dist.is_initialized():
                followed.append(id(optimizer))
                replicas[id(optimizer)] = agreeing(checksums(optimizer))

        def after(optimizer):
            replicated = replicas.get(id(optimizer))
            if replicated is None or probe.step % every:
                return
            diverged = (replicated & ~agreeing(checksums(optimizer))).nonzero().flatten().tolist()
            if diverged:
                probe.alarm("replicas_diverged",
                            f"{len(diverged)} replicated parameter tensor(s) differ across ranks",
                            {"param_indices": diverged[:20], "world_size": dist.get_world_size()})

        probe.on_optimizer_step(before=before, after=after)
