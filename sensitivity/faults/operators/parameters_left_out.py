"""Parameters left out of the optimizer: from the trigger step on, some of the parameter tensors are no longer in the
optimizer's groups, so they keep their values while the rest train (the catalog's "wrong parameter set" bugs: a
filter on ``named_parameters()``, a module added after the optimizer was built, a frozen flag never cleared). As in
those bugs, ``optimizer.zero_grad()`` no longer clears their gradients, which grow step after step: a pipeline that
clips the norm of all the model's gradients then clips the others harder. Severity: the share of the parameters'
elements left out, from the smallest bias to a quarter, a half, and every tensor but the last."""
NAME = "parameters-left-out"
FAULT_CLASS = "software"
MIRRORS = "wrong parameter set"
SUMMARY = "some parameter tensors dropped from the optimizer's groups at the trigger step"
SEVERITIES = [("one-bias", {"share": 0}), ("quarter", {"share": 0.25}), ("half", {"share": 0.5}),
              ("all-but-one", {"share": 1})]
REQUIRES_ANY = ()
PERSISTENCE = ("",)


def left_out(params, share):
    """The tensors to drop, chosen by their sizes and positions only, so that every rank drops the same: share 0, the
    smallest bias (else the smallest tensor); share 1, all but the last; otherwise, in order, each tensor that keeps
    the elements dropped within ``share`` of all (at least one tensor)."""
    if share == 0:
        vectors = [param for param in params if param.dim() == 1] or params
        return [min(vectors, key=lambda param: param.numel())]
    if share == 1:
        return params[:-1]
    budget = share * sum(param.numel() for param in params)
    dropped, taken = [], 0
    for param in params:
        if taken + param.numel() <= budget:
            dropped.append(param)
            taken += param.numel()
    return dropped or [min(params, key=lambda param: param.numel())]


def inject(fault):
    share = fault.parameters["share"]
    done = set()

    def drop(optimizer):
        if fault.step != fault.trigger_step or id(optimizer) in done:
            return
        done.add(id(optimizer))
        params = [param for group in optimizer.param_groups for param in group["params"]]
        dropped = left_out(params, share)
        ids = {id(param) for param in dropped}
        for group in optimizer.param_groups:
            group["params"] = [param for param in group["params"] if id(param) not in ids]
        fault.note("parameters left out of the optimizer", tensors=len(dropped), of=len(params),
                   element_share=round(sum(p.numel() for p in dropped) / sum(p.numel() for p in params), 4))

    fault.before_step(drop)
