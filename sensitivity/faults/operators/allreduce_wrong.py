"""An all-reduce with the wrong op or scale: from the trigger step on, DDP's gradient all-reduce averages twice,
sums without averaging, takes the maximum, or is left out so that each rank keeps its own gradient (the catalog's
communication bugs, such as VERDICT-INCONSISTENT-SCALING and VERDICT-MISSING-ALLREDUCE). Only DDP pipelines are
mutated. Severity: from a wrong scale (x0.5, x2) to a wrong op (max) and no reduction at all."""
NAME = "allreduce-wrong"
FAULT_CLASS = "software"
MIRRORS = "wrong collective"
SUMMARY = "DDP's gradient all-reduce scaled wrongly, with the wrong op, or left out"
SEVERITIES = [("halved", {"reduce": "halved"}), ("summed", {"reduce": "summed"}), ("max", {"reduce": "max"}),
              ("unreduced", {"reduce": "unreduced"})]
REQUIRES_ANY = ("ddp",)
PERSISTENCE = ("",)


def inject(fault):
    import torch.distributed as dist

    reduce = fault.parameters["reduce"]

    def before(buffer, bucket):
        if not fault.started():
            fault.allreduce_op, fault.allreduce_skipped = None, False
        elif reduce == "summed":
            fault.allreduce_op = dist.ReduceOp.SUM
        elif reduce == "max":
            fault.allreduce_op = dist.ReduceOp.MAX
        elif reduce == "unreduced":
            fault.allreduce_skipped = True

    def after(reduced):
        if fault.started() and reduce == "halved":
            reduced.div_(dist.get_world_size())

    fault.on_allreduce(before=before, after=after)
