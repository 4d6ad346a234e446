from .base import DROP_IN, DetectorPlugin, owned_parameters, register


@register
class CrossRankConsistency(DetectorPlugin):
    """Parameters that start identical on every rank must stay identical (what BLOOM-176B needed)."""

    name = "cross_rank_consistency"
    version = "3"
    integration = DROP_IN
    description = (
        "In a torch.distributed run, all-gathers a checksum of every parameter an optimizer owns. Parameters "
        "whose checksums agree on all ranks before the first step are replicas (data-parallel copies, "
        "tensor-parallel LayerNorms...); after every step, a replica whose checksum differs between ranks "
        "raises an alarm. Sharded parameters, which differ from the start, are left alone. Unlike Megatron's "
        "data-parallel-only check it needs no annotation of which parameters are replicated. Only the first "
        "optimizer that steps in each process (the training optimizer) is followed, so that a rank-local extra "
        "optimizer (a single-device reference on rank 0) cannot unbalance the collectives. Single-process runs "
        "are not checked. Parameters the optimizer takes on later are not checked; those it drops are no longer "
        "checked."
    )
    default_config = {"every_n_steps": 1}

    def install(self, probe):
        import torch
        import torch.distributed as dist

        every = max(1, int(probe.config["every_n_steps"]))
        replicas = {}  # optimizer -> {parameter: whether it was a replica before the first step}

        def checksums(params):
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
                params = owned_parameters(optimizer)
                replicas[id(optimizer)] = dict(zip(map(id, params), agreeing(checksums(params)).tolist()))

        def after(optimizer):
            replicated = replicas.get(id(optimizer))
            if replicated is None or probe.step % every:
                return
            # by parameter, not by position: the optimizer's groups may lose or gain tensors (the same on every rank)
            params = owned_parameters(optimizer)
            agree = agreeing(checksums(params)).tolist()
            diverged = [index for index, (param, same) in enumerate(zip(params, agree))
                        if replicated.get(id(param)) and not same]
            if diverged:
                probe.alarm("replicas_diverged",
                            f"{len(diverged)} replicated parameter tensor(s) differ across ranks",
                            {"param_indices": diverged[:20], "world_size": dist.get_world_size()})

        probe.on_optimizer_step(before=before, after=after)


@register
class MegatronParamHashes(DetectorPlugin):
    """Megatron-Core's ``check_param_hashes_across_dp_replicas`` (megatron/core/utils.py), as its training loop
    calls it: every parameter hashed, every rank compared with rank 0 of its data-parallel group."""

    name = "param_hashes_megatron"
    version = "1"
    integration = DROP_IN
    in_quickstart = False
    description = (
        "Megatron-Core's check_param_hashes_across_dp_replicas: a SHA-1 of each parameter's bytes (as float32, "
        "on the CPU) that the training optimizer owns, all-gathered over the data-parallel group, here the whole "
        "world (a reproducer names no parallel groups); alarm `param_hashes_differ` on each rank whose hashes "
        "differ from rank 0's, naming the parameters. Checked before the first step, as Megatron checks at "
        "start-up, and after every `every_n_steps`-th step (Megatron's "
        "--check-weight-hash-across-dp-replicas-interval). Unlike cross_rank_consistency it assumes every "
        "parameter is a replica, so a sharded one (tensor or pipeline parallel) differs from the start. "
        "Single-process runs are not checked."
    )
    default_config = {"every_n_steps": 1}

    def install(self, probe):
        import hashlib

        import torch.distributed as dist

        every = max(1, int(probe.config["every_n_steps"]))
        followed = []  # the training optimizer: the first to step in this process, the same on every rank
        steps = [0]  # the followed optimizer's steps

        def compare_hashes(optimizer, when):
            params = owned_parameters(optimizer)
            local = [hashlib.sha1(p.detach().float().cpu().numpy().tobytes()).hexdigest() for p in params]
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, local)  # any backend, and ranks with other numbers of parameters
            reference = gathered[0]
            differing = [index for index, digest in enumerate(local)
                         if index >= len(reference) or reference[index] != digest]
            if differing:
                probe.alarm("param_hashes_differ", f"{len(differing)} parameter(s) hash otherwise than on rank 0 "
                            f"({when})", {"param_indices": differing[:20], "world_size": dist.get_world_size()})

        def before(optimizer):
            if not followed and dist.is_available() and dist.is_initialized():
                followed.append(id(optimizer))
                compare_hashes(optimizer, "before the first step")

        def after(optimizer):
            if followed and followed[0] == id(optimizer):
                steps[0] += 1  # its own steps: the probe's count may lead on a rank with an extra optimizer
                if steps[0] % every == 0:
                    compare_hashes(optimizer, f"after step {probe.step}")

        probe.on_optimizer_step(before=before, after=after)
