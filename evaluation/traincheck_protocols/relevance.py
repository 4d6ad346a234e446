"""The relevant-relation rule: which of TrainCheck's invariants a person reading its violations would accept as
pointing at each bug, and the paper's verdict, false-positive rates and reasons for a miss that follow from it."""
import json
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Relevance:
    """The invariants a person reading TrainCheck's violations would accept as pointing at a bug.

    ``matchers`` pairs a TrainCheck relation (the alarm rule's prefix; ``*`` for any) with the words its
    invariant's text must contain, any one of them; none at all when no relation of traincheck 0.2.0 can
    state the bug. ``about`` names the variable or API concerned, ``reason`` says why, from the root cause.
    An invariant whose text holds one of ``excluded`` is about something else: by default a tensor attribute's
    identity (TrainCheck's ``<attr>_ID``, its ``id()``), where every bug here is about values or calls.
    """

    matchers: tuple
    about: str
    reason: str
    excluded: tuple = ("_ID ", "_ID:", "_ID=")

    def matches(self, rule):
        """Whether an alarm rule ``"<Relation>: <invariant text>"`` (runners.detectors.traincheck) is relevant."""
        relation, _, text = rule.partition(": ")
        return not any(word in text for word in self.excluded) and any(
            wanted in ("*", relation) and any(word in text for word in words) for wanted, words in self.matchers)


CONSISTENCY = (("ConsistencyRelation", ("Parameter.",)),)


STEP_UPDATES = (("APIContainRelation", ("step()",)),)


API_ORDER = ("APIContainRelation", "FunctionLeadRelation", "FunctionCoverRelation")


def calls_of(*apis):
    """Matchers for an API that the fixed program calls and the buggy one does not (or the other way round)."""
    return tuple((relation, apis) for relation in API_ORDER)


VALUES_ONLY = ("the fault changes values only: the same APIs run in the same order on tensors of the same shape "
               "and dtype")


RELEVANT = {
    "BLOOM-176B-DIVERGENCE": Relevance(
        CONSISTENCY, "replicated LayerNorm weight and bias across tensor-parallel ranks",
        "the TP ranks' LayerNorm copies get different gradients, so replicas that must stay equal drift apart"),
    "DS-1801": Relevance(
        CONSISTENCY, "replicated LayerNorm weight and bias across tensor-parallel ranks",
        "rank 1 never clips its LayerNorm copy while rank 0 does: the paper's own Consistency example"),
    "PT-104157": Relevance(
        (), "the gradient that bilinear upsampling's backward adds up into a bf16 input",
        "16-bit atomic additions stop growing a shared element's gradient: the fault changes values only (the fix "
        "casts around the same interpolate)"),
    "PT-115607": Relevance(
        STEP_UPDATES, "the optimizer's step() and the parameters it must change",
        "the compiled step keeps replaying its cached no-op graph, so step() stops changing the parameters"),
    "PT-124357": Relevance(
        (), "the output of a compiled forward after a module attribute changed",
        f"the stale graph bakes in the old constant; {VALUES_ONLY}"),
    "PT-126514": Relevance(
        (), "the parameters AdamW's capturable single-tensor step writes at learning rate 0",
        "it divides by a step size of -0.0, writing NaN where gradients were 0: the fault changes values only (the "
        "fix takes the foreach implementation of the same step())"),
    "PT-179804": Relevance(
        (("ConsistentOutputRelation", ("dtype",)),), "the dtype of the tensors the backward's matmuls return",
        "compiled, the backward of an autocast-disabled block runs in the outer autocast dtype, not fp32"),
    "PT-181723": Relevance(
        (), "param.grad after gradient accumulation over graphed microbatches",
        f"the accumulated gradient is g2+g2 instead of g1+g2; {VALUES_ONLY}"),
    "PT-191612": Relevance(
        (), "the attention output computed with a float32 additive mask and fp16 q, k, v",
        "the mask's bytes are read as fp16 elements, NaN and zeros in place of -inf: the fault changes values only "
        "(the fix casts the mask before the same call)"),
    "PT-197888": Relevance(
        (), "the input gradient of adaptive_max_pool3d",
        f"gradient mass lands at positions that were not the argmax; {VALUES_ONLY}"),
    "PT-36485": Relevance(
        (), "softmax output rows",
        f"tail elements of long rows are computed wrongly; {VALUES_ONLY}"),
    "PT-51800": Relevance(
        calls_of("train()", "eval()", "SpectralNorm"),
        "a train-mode forward before the first eval() forward of a spectral-normalised module",
        "the power iteration is initialised only in train mode; the bug's own signal is this API order"),
    "PT-5801": Relevance(
        (), "the gradient of KLDivLoss",
        f"the backward ignores grad_output, so a scaled loss gets an unscaled gradient; {VALUES_ONLY}"),
    "PT-68425": Relevance(
        (), "the input gradient of torch.where",
        f"0 * inf in the unselected branch turns the gradient NaN; {VALUES_ONLY}"),
    "PT-84803": Relevance(
        CONSISTENCY, "replicated parameters across data-parallel ranks",
        "device-to-device copies deliver zeros, so the ranks' replicas of a parameter differ"),
    "PT-FORUM-19117": Relevance(
        (("APIContainRelation", ("step()", "backward()")),),
        "the optimizer's step() and the update of the checkpointed block's parameters",
        "the reentrant checkpoint cuts the block from autograd: its parameters get no gradient, step() skips them"),
    "PT-FORUM-84911": Relevance(
        STEP_UPDATES, "Adam.step() and the parameter update it must cause",
        "every parameter in the optimizer is frozen: the paper's invariant 'Adam.step should update parameters'"),
    "PT-SYNCBN-UNEVEN": Relevance(
        (), "the input gradient of SyncBatchNorm with uneven per-rank batches",
        f"the backward averages per-rank reductions over the world size; {VALUES_ONLY}"),
    "SO-60335387": Relevance(
        (*calls_of("zero_grad"), ("VarPeriodicChangeRelation", (".grad is periodicaly",))),
        "optimizer.zero_grad() around backward(), and .grad periodically cleared",
        "zero_grad() is never called, so gradients accumulate: the paper's Lead and VarPeriodicChange invariants"),
    "TE-1047": Relevance(
        (), "the cached FP8 weight and its scale after microbatch 0",
        f"the cached bytes are read with a scale updated since; {VALUES_ONLY}"),
    "VERDICT-ALLGATHER-AS-ALLREDUCE": Relevance(
        calls_of("all_gather"), "the all_gather the parallel plan must issue",
        "the plan calls all_reduce where it must call all_gather: the fixed program's collective is missing"),
    "VERDICT-ALLREDUCE-AS-ALLGATHER": Relevance(
        calls_of("all_reduce"), "the all_reduce the parallel plan must issue",
        "the plan calls all_gather where it must call all_reduce: the fixed program's collective is missing"),
    "VERDICT-BW-WRONG-TENSORS": Relevance(
        CONSISTENCY, "data-parallel replicas' parameters across ranks",
        "one rank's backward consumes swapped gradient tensors, so the replicas' updates differ across ranks"),
    "VERDICT-CONST-MUTATED-ONE-RANK": Relevance(
        CONSISTENCY, "replicated parameters across ranks",
        "one rank computes with a different constant, so replicated parameters diverge across ranks"),
    "VERDICT-EARLY-GRAD-SYNC": Relevance(
        CONSISTENCY + calls_of("all_reduce"), "the gradient all_reduce after the last backward, and the replicas",
        "the reducer runs before the final microbatch's backward: an API order, and replicas that then differ"),
    "VERDICT-FUSED-BW-MISSING-REDUCE": Relevance(
        CONSISTENCY + calls_of("all_reduce"), "the backward all_reduce of the fused communication op",
        "the backward's all_reduce became an identity: a missing collective and inconsistent replicated gradients"),
    "VERDICT-INCONSISTENT-SCALING": Relevance(
        CONSISTENCY, "replicated parameters across ranks",
        "rank 0 scales by a different factor, so its replica's updates differ from the other rank's"),
    "VERDICT-MISSING-ALLREDUCE": Relevance(
        calls_of("all_reduce"), "the all_reduce of tensor-parallel partial results",
        "the plan drops an all_reduce, so a collective the fixed program calls is missing"),
    "PT-104336": Relevance(
        CONSISTENCY, "replicated parameters across data-parallel ranks",
        "after the model's parameters are moved, DDP stops synchronising the gradients and the replicas drift apart"),
    "PT-188166": Relevance(
        STEP_UPDATES, "the optimizer's step() and the parameters the model trains",
        "a later load gives the model new parameter objects the optimizer does not hold, so step() changes nothing "
        "the model uses"),
    "PT-193671": Relevance(
        (), "the gradients of the layers before an RReLU in a checkpointed block",
        f"the backward multiplies by a noise buffer the early-stopped recomputation never wrote; {VALUES_ONLY}"),
    "PT-24836": Relevance(
        (), "the shards gloo's scatter delivers to each rank",
        f"non-contiguous blocks arrive with the wrong elements; {VALUES_ONLY}"),
    "HF-34191": Relevance(
        (), "the loss of a gradient-accumulated batch",
        f"each micro-batch's mean loss is averaged instead of normalising by the batch's tokens; {VALUES_ONLY}"),
    "HF-33844": Relevance(
        (("*", ("scaled_dot_product_attention",)),), "the dropout_p argument of scaled_dot_product_attention",
        "attention dropout stays on in eval mode: the call's dropout argument differs from the fixed program's"),
    "VERDICT-PIPELINE-WRONG-RANK": Relevance(
        (("*", ("send()", "recv()")),), "the point-to-point transfers between pipeline stages",
        "send/recv use the wrong peer rank: their arguments differ from the fixed plan's"),
}


NOT_DECLARED = Relevance((), "", "no relevant relation declared for this bug (evaluation.traincheck_protocols)")


def relevance_of(bug_id):
    return RELEVANT.get(bug_id, NOT_DECLARED)


def paper_verdict(relevance, trigger_step, buggy_alarms, fixed_alarms):
    """The paper's way, with the fixed twin as the check of attribution: detected when the buggy run raises, at or
    after the trigger step, a relevant invariant that the fixed run of the same seed does not. Alarms are
    ``(step, rule)`` pairs. Returns (detected, the first such rule or "")."""
    fixed_rules = {rule for _, rule in fixed_alarms}
    for step, rule in sorted(buggy_alarms):
        if step >= (trigger_step or 0) and relevance.matches(rule) and rule not in fixed_rules:
            return True, rule
    return False, ""


def fit_rules(fit_artifact):
    """The alarm rule each invariant of a fit would raise (runners.detectors.traincheck.violation_alarms)."""
    rules = []
    for line in fit_artifact.splitlines():
        if line.strip():
            invariant = json.loads(line)
            rules.append(f"{invariant.get('relation', 'Invariant')}: {invariant.get('text_description', '')}"[:200])
    return rules


def per_invariant_rates(folds):
    """The paper's false-positive rate over leave-one-out folds ``[{deployed, failed}]``: the mean of the folds'
    failed / deployed, the pooled rate and the highest fold's."""
    rates = [fold["failed"] / fold["deployed"] for fold in folds if fold.get("deployed")]
    if not rates:
        return {"folds": 0, "mean": None, "pooled": None, "max": None}
    deployed = sum(fold["deployed"] for fold in folds if fold.get("deployed"))
    failed = sum(fold["failed"] for fold in folds if fold.get("deployed"))
    return {"folds": len(rates), "mean": round(statistics.mean(rates), 4), "pooled": round(failed / deployed, 4),
            "max": round(max(rates), 4), "failed": failed, "deployed": deployed}


def miss_reason(record):
    """Why a bug was not detected the paper's way, in one short phrase (the gap's category)."""
    if record["detected"]:
        return ""
    if record.get("reason") == NOT_DECLARED.reason:
        return "no relevant relation declared yet"
    if not record["relations"]:
        return "no TrainCheck relation states it"
    if record["status"] != "measured":
        return "run failed"
    if not record["relevant_in_fit"]:
        return "the fit holds no relevant invariant"
    if record["relevant_on_buggy"] and record["relevant_on_buggy_not_fixed"] == 0:
        return "the relevant invariant fires on the fixed variant too"
    return "the relevant invariant holds on the buggy run"
