"""TrainCheck under its paper's protocol, beside the benchmark's (``manage.py traincheck_protocols``).

The paper (TrainCheck, OSDI'25, as its talk states it) counts a bug as detected when the invariant relevant to
the bug fires, read by a person (18 of 20); gives a false-positive rate per invariant (failed / deployed on a
clean program, 5 reference pipelines: under 2 %); and checks 100 invariants selectively for its overhead
figure (under 11 %). This module measures each here, through the real pipeline (campaigns, a local worker, the
real traincheck package): ``measure_*`` store their figures in a JSON file, ``render`` writes the Markdown page
from that file alone, and the benchmark's own figures come from a stored evaluation (``benchmark_figures``).
A JSON file rather than database rows: it travels with the page it renders (in the repository, reviewed in
diffs), needs no migration, and the page can be rewritten from any checkout, also where the measuring database
is not at hand.
"""
import json
import re
import statistics
import time
from dataclasses import dataclass

import pandas as pd
from django.conf import settings

from core.enums import Variant
from core.exports import export
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.models import CampaignPurpose, Run, RunStatus
from runners.plans import CampaignPlan, PlannedRun
from runners.selectors import runnable_versions, shown_command
from runners.worker.local import wait_with_local_worker

from .held_out import public_tables
from .metrics import AlarmPoint, detected_beyond_clean
from .overhead import do_measure_overhead

DETECTOR = "traincheck"
DATA_FILE = settings.BASE_DIR / "docs" / "traincheck-protocols.json"  # the measured figures; the page renders them
CHECK_SEED = 0  # every checked run; the per-bug fit runs the fixed variant at DETECTION_CONFIG's fit_seed
# The paper's kind of reference for a bug: a clean run of the same pipeline (runners.detector_versions.fitting.reference_versions).
DETECTION_CONFIG = {"fit_on_self": True, "fit_seed": 1}
# Leave-one-out over the clean pipelines: each held-out pipeline is checked against a fit on all the others.
FALSE_POSITIVE_CONFIG = {"fit_pipelines": None}
# transformer-adamw first: the overhead workload must be held out of the fit it checks against
FOLD_ORDER = ("transformer-adamw", "ddp-gloo", "mlp-adam", "cnn-sgd-momentum", "lstm-lm", "autocast-bf16")
OVERHEAD_WORKLOAD = "transformer-adamw"  # the benchmark's overhead workload; its fold's fit is reused
DEPLOYED_FOR_OVERHEAD = 100
OVERHEAD_CONFIG = {**FALSE_POSITIVE_CONFIG, "deploy_top": DEPLOYED_FOR_OVERHEAD}
PARTS = ("detection", "false_positives", "overhead")

PAPER = {
    "detection": "18/20 bugs (the relevant invariant fires, read by a person)",
    "false_positives": "< 2 % per invariant (failed / deployed on a clean program), 5 references",
    "overhead": "< 11 % (x1.11) with 100 invariants checked selectively",
}


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
    "PT-115607": Relevance(
        STEP_UPDATES, "the optimizer's step() and the parameters it must change",
        "the compiled step keeps replaying its cached no-op graph, so step() stops changing the parameters"),
    "PT-124357": Relevance(
        (), "the output of a compiled forward after a module attribute changed",
        f"the stale graph bakes in the old constant; {VALUES_ONLY}"),
    "PT-179804": Relevance(
        (("ConsistentOutputRelation", ("dtype",)),), "the dtype of the tensors the backward's matmuls return",
        "compiled, the backward of an autocast-disabled block runs in the outer autocast dtype, not fp32"),
    "PT-181723": Relevance(
        (), "param.grad after gradient accumulation over graphed microbatches",
        f"the accumulated gradient is g2+g2 instead of g1+g2; {VALUES_ONLY}"),
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


# --- measuring (through campaigns, a local worker and the real traincheck package) ---

def failure_line(reason):
    """A run's failure reason as stored here: its first line, without the machine's paths to installed packages."""
    first = reason.splitlines()[0] if reason else ""
    return re.sub(r"/\S*/site-packages/", "", first)[:300]


def _run_summary(run):
    return {"run": run.pk, "status": run.status, "failure_reason": failure_line(run.failure_reason),
            "alarms": run.alarms.count(), "rules_deployed": (run.detector_summary or {}).get("rules_deployed"),
            "rules_failed": (run.detector_summary or {}).get("rules_failed"),
            "models_tracked": (run.detector_summary or {}).get("models_tracked"),
            "processes_traced": (run.detector_summary or {}).get("processes_traced"),
            "wall_seconds": run.wall_seconds, "check_seconds": run.analysis_seconds}


def _plan(runs):
    versions = tuple(dict.fromkeys(run.version for run in runs))
    detectors = tuple(dict.fromkeys(run.detector for run in runs))
    return CampaignPlan(versions, detectors, tuple(dict.fromkeys(run.variant for run in runs)), (CHECK_SEED,), None,
                        tuple(runs))


def _campaign(name, runs, concurrency, write):
    campaign = do_create_campaign(f"traincheck protocols: {name}", _plan(runs), CampaignPurpose.MANUAL,
                                  acting_user=None)
    write(f"Campaign #{campaign.pk} ({name}): {len(runs)} runs.")
    wait_with_local_worker(campaign, write, "traincheck-protocols", concurrency)
    write("")
    return campaign


def measure_runs(bug_ids, folds, concurrency, write):
    """Check the buggy variant of every bug with a relevant relation (each fits on its own fixed variant at another
    seed) and ``folds`` held-out pipelines (each fits on the five others), then the fixed variants against the
    cached per-bug fits. Two campaigns, so that no two runs fit the same thing at once. A bug that no relation can
    state is not run: nothing could count for it. Returns (detection, false positives, campaign IDs)."""
    detection_detector = do_record_detector(DETECTOR, DETECTION_CONFIG)
    fold_detector = do_record_detector(DETECTOR, FALSE_POSITIVE_CONFIG)
    # written to docs/ for everyone: never a held-out bug (evaluation.held_out)
    every_bug = [version for version in (runnable_versions(bug_ids) if bug_ids is None or bug_ids else [])
                 if not version.reproducer.bug.held_out]
    bugs = [version for version in every_bug if relevance_of(version.reproducer.bug.bug_id).matchers]
    pipelines = {version.reproducer.name: version for version in runnable_versions(pipelines=True)}
    held_out = [pipelines[name] for name in FOLD_ORDER if name in pipelines][:folds]
    # the held-out pipelines first: their fits on five pipelines take longest, and two slots finish soonest so
    first = [PlannedRun(version, fold_detector, Variant.FIXED, CHECK_SEED) for version in held_out]
    first += [PlannedRun(version, detection_detector, Variant.BUGGY, CHECK_SEED) for version in bugs]
    unstated = [detection_record(version, None, None) for version in every_bug if version not in bugs]
    if not first:
        return unstated, [], []
    one = _campaign("buggy variants and held-out pipelines", first, concurrency, write)
    campaigns = [one.pk]
    fixed = {}
    if bugs:
        two = _campaign("fixed variants", [PlannedRun(version, detection_detector, Variant.FIXED, CHECK_SEED)
                                           for version in bugs], concurrency, write)
        campaigns.append(two.pk)
        fixed = {run.reproducer_version_id: run for run in two.runs.select_related("fit_artifact")}
    runs = {run.reproducer_version_id: run for run in one.runs.select_related("fit_artifact")}
    detection = [detection_record(version, runs[version.pk], fixed.get(version.pk)) for version in bugs] + unstated
    detection.sort(key=lambda record: record["bug"])
    folds_measured = [fold_record(version, runs[version.pk]) for version in held_out]
    return detection, folds_measured, campaigns


def _alarms(run):
    return [(step, rule) for step, rule in run.alarms.values_list("step", "rule")] if run else []


def detection_record(version, buggy, fixed):
    """One bug under the paper's protocol: the fit, both runs, the relevant alarms and both verdicts (``buggy``
    None: not run)."""
    bug = version.reproducer.bug
    relevance = relevance_of(bug.bug_id)
    measured = (buggy is not None and buggy.status == RunStatus.SUCCEEDED and fixed is not None
                and fixed.status == RunStatus.SUCCEEDED)
    buggy_alarms, fixed_alarms = _alarms(buggy), _alarms(fixed)
    trigger_step = buggy.trigger_step if buggy else None
    detected, rule = paper_verdict(relevance, trigger_step, buggy_alarms, fixed_alarms) if measured else (False, "")
    fixed_rules = {r for _, r in fixed_alarms}
    relevant_buggy = sorted({r for s, r in buggy_alarms if s >= (trigger_step or 0) and relevance.matches(r)})
    relevant_fixed = sorted({r for _, r in fixed_alarms if relevance.matches(r)})
    artifact = buggy.fit_artifact if buggy is not None and buggy.fit_artifact_id else None
    deployed = fit_rules(artifact.content) if artifact else []
    relevant_deployed = [r for r in deployed if relevance.matches(r)]
    record = {
        "bug": bug.bug_id, "reproducer": version.reproducer.name,
        "in_traincheck_evaluation": "TrainCheck" in bug.source,
        "relations": sorted({relation for relation, _ in relevance.matchers}), "about": relevance.about,
        "reason": relevance.reason,
        "status": "measured" if measured else ("not run" if buggy is None else "failed"),
        "trigger_step": trigger_step,
        "fit": {"artifact": artifact.pk if artifact else None, "references": f"{version.reproducer} fixed, seed "
                f"{DETECTION_CONFIG['fit_seed']}", "invariants": len(deployed),
                "by_relation": artifact.summary.get("by_relation", {}) if artifact else {},
                "fit_seconds": artifact.fit_seconds if artifact else None},
        "relevant_in_fit": len(relevant_deployed), "relevant_in_fit_example": relevant_deployed[:1],
        "buggy": _run_summary(buggy) if buggy else None, "fixed": _run_summary(fixed) if fixed else None,
        "relevant_on_buggy": len(relevant_buggy),
        "relevant_on_buggy_not_fixed": len([r for r in relevant_buggy if r not in fixed_rules]),
        "relevant_on_fixed": len(relevant_fixed), "relevant_on_fixed_example": relevant_fixed[:1],
        "detected": detected, "evidence_rule": rule,
        "benchmark_rule_here": measured and detected_beyond_clean(
            trigger_step, [AlarmPoint(step, rule=r) for step, r in buggy_alarms], fixed_rules),
    }
    record["miss_reason"] = miss_reason(record)
    return record


def rejudge(records):
    """The detection records judged again from their runs in this database (after a change of the declared
    relations), running nothing; a record whose runs this database does not hold is kept as it was."""
    judged = []
    for record in records:
        runs = {run.pk: run for run in Run.objects.select_related("fit_artifact", "reproducer_version__reproducer__bug")
                .filter(pk__in=[record[variant]["run"] for variant in ("buggy", "fixed") if record[variant]])}
        buggy = runs.get(record["buggy"]["run"]) if record["buggy"] else None
        if buggy is None:
            judged.append(record)
            continue
        fixed = runs.get(record["fixed"]["run"]) if record["fixed"] else None
        judged.append(detection_record(buggy.reproducer_version, buggy, fixed))
    return judged


def fold_record(version, run):
    """One leave-one-out fold: the held-out pipeline checked against a fit on the other clean pipelines."""
    summary = _run_summary(run)
    failed_rules = sorted({rule for rule in run.alarms.values_list("rule", flat=True)})
    return {"held_out": version.reproducer.name, **summary,
            "references": (run.fit_artifact.summary.get("references", []) if run.fit_artifact_id else []),
            "fit_invariants": (run.fit_artifact.summary.get("invariants") if run.fit_artifact_id else None),
            "fit_seconds": run.fit_artifact.fit_seconds if run.fit_artifact_id else None,
            "deployed": summary["rules_deployed"] or 0, "failed": summary["rules_failed"] or 0,
            "failed_example": failed_rules[:2]}


def measure_overhead(pairs, write):
    """Interleaved plain / TrainCheck pairs on the benchmark's overhead workload (evaluation.overhead), with only
    the 100 best-supported invariants of the workload's leave-one-out fit deployed."""
    workload = next(version for version in runnable_versions(pipelines=True)
                    if version.reproducer.name == OVERHEAD_WORKLOAD)
    detector = do_record_detector(DETECTOR, OVERHEAD_CONFIG)
    write(f"Overhead: {pairs} interleaved pairs on {workload.reproducer}, {DEPLOYED_FOR_OVERHEAD} invariants.")
    campaign, records = do_measure_overhead(workload, [detector], do_record_detector("plain"), pairs, None, write)
    checked = campaign.runs.filter(detector=detector, status=RunStatus.SUCCEEDED).order_by("id")
    deployed = sorted({(run.detector_summary or {}).get("rules_deployed") for run in checked} - {None})
    fitted = next((run.fit_artifact for run in checked if run.fit_artifact_id), None)
    return {**records[0], "campaign": campaign.pk, "workload": str(workload.reproducer), "deployed": deployed,
            "fit_invariants": fitted.summary.get("invariants") if fitted else None,
            "runs": list(checked.values_list("id", flat=True))}


def benchmark_figures(evaluation):
    """TrainCheck's figures in a stored evaluation (the benchmark's protocol), as the third column takes them: written
    to docs/ for everyone, so without the held-out bugs' rows (evaluation.held_out.public_tables)."""
    tables = public_tables(evaluation.tables)
    rows = [row for row in tables.get("detection", []) if row["detector"] == DETECTOR]
    fp = next((row for row in tables.get("false_positives", []) if row["detector"] == DETECTOR), {})
    overhead = next((row for row in tables.get("overhead", []) if row["detector"] == DETECTOR), {})
    fits = [row for row in tables.get("fits", []) if row["detector"] == DETECTOR]
    return {
        "evaluation": evaluation.pk, "stored": evaluation.created_at.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": evaluation.parameters.get("commit", ""),
        "command": shown_command(evaluation.parameters.get("command", ""), None),
        "bugs": len({row["bug"] for row in rows}),
        "beyond_fixed": len({row["bug"] for row in rows if row["detected_beyond_fixed_runs"]}),
        "raw": len({row["bug"] for row in rows if row["detected_runs"]}),
        "per_bug": {row["bug"]: {"buggy_runs": row["buggy_runs"], "detected_runs": row["detected_runs"],
                                 "beyond_fixed_runs": row["detected_beyond_fixed_runs"]} for row in rows},
        "clean_runs": fp.get("clean_runs"), "clean_runs_with_alarm": fp.get("clean_runs_with_alarm"),
        "fp_rate": fp.get("fp_rate"), "per_check_fp_rate": fp.get("per_check_fp_rate"),
        "step_ratio": overhead.get("median_step_time_ratio"),
        "end_to_end_ratio": overhead.get("median_end_to_end_ratio"),
        "overhead_pairs": overhead.get("pairs"),
        "fit_invariants": max((row["invariants"] for row in fits), default=None),
        "fit_references": fits[0]["references"] if fits else "",
    }


def measured_at():
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


# --- rendering (from the JSON alone) ---

def _pct(value, digits=2):
    return "–" if value is None else f"{100 * value:.{digits}f} %"


def _ratio(value):
    return "–" if value is None else f"x{value:.2f}"


def detection_cells(data):
    """(paper's protocol here, benchmark's protocol here) for the detection row."""
    records, benchmark = data.get("detection") or [], data.get("benchmark")
    here = "not measured"
    if records:
        ours = [r for r in records if r["in_traincheck_evaluation"]]
        here = (f"{sum(r['detected'] for r in records)}/{len(records)} bugs measured "
                f"({sum(r['detected'] for r in ours)}/{len(ours)} of those from TrainCheck's own evaluation)")
    there = "no stored evaluation"
    if benchmark:
        there = (f"{benchmark['beyond_fixed']}/{benchmark['bugs']} beyond the fixed twin "
                 f"(raw {benchmark['raw']}/{benchmark['bugs']}; evaluation #{benchmark['evaluation']})")
    return here, there


def false_positive_cells(data):
    folds, benchmark = (data.get("false_positives") or {}).get("folds") or [], data.get("benchmark")
    rates = per_invariant_rates([fold for fold in folds if fold["status"] == RunStatus.SUCCEEDED])
    here = "not measured"
    if rates["folds"]:
        alarmed = sum(1 for fold in folds if fold["status"] == RunStatus.SUCCEEDED and fold["alarms"])
        here = (f"{_pct(rates['mean'])} per invariant, mean of {rates['folds']} leave-one-out folds "
                f"(pooled {rates['failed']}/{rates['deployed']} = {_pct(rates['pooled'])}, highest "
                f"{_pct(rates['max'])}); per run {alarmed}/{rates['folds']}")
    there = "no stored evaluation"
    if benchmark and benchmark.get("clean_runs"):
        there = (f"per run {benchmark['fp_rate']} ({benchmark['clean_runs_with_alarm']}/{benchmark['clean_runs']} "
                 f"clean runs alarmed); per check {_pct(benchmark['per_check_fp_rate'])}")
    return here, there


def overhead_cells(data):
    overhead, benchmark = data.get("overhead"), data.get("benchmark")
    here = "not measured"
    if overhead and overhead.get("pairs"):
        here = (f"step {_ratio(overhead['median_step_time_ratio'])}, end to end "
                f"{_ratio(overhead['median_end_to_end_ratio'])}, {'/'.join(map(str, overhead['deployed']))} of "
                f"{overhead['fit_invariants']} invariants deployed ({overhead['pairs']} pairs)")
    there = "no stored evaluation"
    if benchmark and benchmark.get("step_ratio") is not None:
        there = (f"step {_ratio(benchmark['step_ratio'])}, end to end {_ratio(benchmark['end_to_end_ratio'])}, "
                 f"all {benchmark['fit_invariants']} invariants of the default fit deployed")
    return here, there


def comparison_table(data):
    rows = [(what, PAPER[key], *cells(data)) for what, key, cells in (
        ("bugs detected", "detection", detection_cells), ("false positives", "false_positives", false_positive_cells),
        ("checking overhead", "overhead", overhead_cells))]
    return export(pd.DataFrame(rows, columns=["", "paper", "paper's protocol here", "benchmark's protocol here"]),
                  "md")


def _both(record, key, form="{}"):
    """``buggy / fixed`` of a run field, "–" for a run that did not happen."""
    return " / ".join(form.format(record[variant][key]) if record[variant] else "–" for variant in ("buggy", "fixed"))


def detection_table(records, benchmark):
    per_bug = (benchmark or {}).get("per_bug", {})
    rows = []
    for r in records:
        stored = per_bug.get(r["bug"])
        rows.append({
            "bug": r["bug"] + (" (TrainCheck's)" if r["in_traincheck_evaluation"] else ""),
            "relevant relation": ", ".join(r["relations"]) or "none",
            "fit: invariants / relevant": (f"{r['fit']['invariants']} / {r['relevant_in_fit']}" if r["buggy"]
                                           else "not run"),
            "runs buggy / fixed": _both(r, "run", "#{}"),
            "alarms buggy / fixed": _both(r, "alarms"),
            "relevant buggy / fixed": f"{r['relevant_on_buggy']} / {r['relevant_on_fixed']}" if r["buggy"] else "–",
            "paper's way": "detected" if r["detected"] else f"missed: {r['miss_reason']}",
            "benchmark rule, same runs": ("–" if r["status"] != "measured"
                                          else "beyond fixed" if r["benchmark_rule_here"] else "no"),
            "stored evaluation": (f"{stored['beyond_fixed_runs']}/{stored['buggy_runs']} beyond fixed"
                                  if stored else "–"),
        })
    return export(pd.DataFrame(rows), "md")


def relevance_table(records):
    return export(pd.DataFrame([{"bug": r["bug"], "relation": ", ".join(r["relations"]) or "none", "about": r["about"],
                                 "why (root cause)": r["reason"]} for r in records]), "md")


def fold_table(folds):
    return export(pd.DataFrame([{
        "held out": f["held_out"], "run": f"#{f['run']}", "fitted on": ", ".join(f["references"]),
        "deployed": f["deployed"], "failed": f["failed"],
        "per invariant": _pct(f["failed"] / f["deployed"]) if f["deployed"] else "–",
        "example failed invariant": f["failed_example"][0] if f["failed_example"] else "–",
        "status": f["status"] if f["status"] == RunStatus.SUCCEEDED else f"{f['status']}: {f['failure_reason']}",
    } for f in folds]), "md")


def detection_gaps(records, benchmark, data_bugs=()):
    """The detection row's gap, as sentences with runs and invariants for evidence; ``data_bugs``: every CPU bug of
    the catalog when it was measured."""
    if not records:
        return ["Not measured."]
    lines = []
    by_reason = {}
    for record in records:
        if not record["detected"]:
            by_reason.setdefault(record["miss_reason"], []).append(record)
    detected = [r for r in records if r["detected"]]
    ours = [r for r in records if r["in_traincheck_evaluation"]]
    found = f"{len(detected)}/{len(records)} ({len(detected) / len(records):.0%})"
    lines.append(
        f"The paper's 18/20 (90 %) is {'' if len(detected) >= 0.9 * len(records) else 'not '}reproduced here: "
        f"{found} of the catalog's CPU bugs, {sum(r['detected'] for r in ours)}/{len(ours)} of those taken from "
        f"TrainCheck's own evaluation. The bug sets differ: most of ours are not in the paper, and ours run as CPU "
        f"stand-ins of the original programs.")
    unmeasured = sorted(set(data_bugs) - {r["bug"] for r in records})
    if unmeasured:
        lines.append(f"Not measured within the compute budget ({len(unmeasured)} of the catalog's {len(data_bugs)} CPU "
                     f"bugs, left out of the count): {', '.join(unmeasured)}.")
    if not detected:
        lines.append("None detected the paper's way.")
    if detected:
        lines.append("Detected the paper's way: " + "; ".join(
            f"{r['bug']} (run #{r['buggy']['run']}: \"{r['evidence_rule']}\")" for r in detected) + ".")
    for reason, missed in sorted(by_reason.items()):
        lines.append(f"Missed, {reason} ({len(missed)}): " + "; ".join(_miss_evidence(r) for r in missed) + ".")
        if any(r["reason"].endswith(VALUES_ONLY) for r in missed if reason == "no TrainCheck relation states it"):
            lines[-1] += f" In each, {VALUES_ONLY}."
    measured = [r for r in records if r["status"] == "measured"]
    fixed_alarmed = sum(1 for r in measured if r["fixed"]["alarms"])
    if benchmark:
        lines.append(
            f"The benchmark's rule counts a bug when any alarm rule at or after the trigger step is absent from the "
            f"fixed twin's alarms; under its default fit (on {benchmark['fit_references'] or 'the default pipelines'},"
            f" {benchmark['fit_invariants']} invariants) evaluation #{benchmark['evaluation']} has "
            f"{benchmark['beyond_fixed']} such bugs of {benchmark['bugs']}, and {benchmark['raw']} with any alarm. "
            f"On this protocol's own runs, the same rule gives {sum(bool(r['benchmark_rule_here']) for r in measured)}"
            f" of the {len(measured)} bugs run, whose fixed runs alarmed in {fixed_alarmed} of {len(measured)} cases: "
            f"a differing rule is not yet the relevant one.")
    return lines


def _miss_evidence(record):
    reason = record["miss_reason"]
    if reason == "no TrainCheck relation states it":
        return f"{record['bug']} ({record['reason'].removesuffix(f'; {VALUES_ONLY}')})"
    run = f"run #{record['buggy']['run']}"
    if reason == "run failed":
        failed = record["buggy"] if record["buggy"]["status"] != RunStatus.SUCCEEDED else record["fixed"] or {}
        return f"{record['bug']} (run #{failed.get('run')}: {failed.get('failure_reason', '')[:220]})"
    if reason == "the fit holds no relevant invariant":
        tracked = record["buggy"].get("models_tracked")
        relations = ", ".join(f"{name} {count}" for name, count in sorted((record["fit"]["by_relation"] or {}).items()))
        return (f"{record['bug']} ({record['fit']['invariants']} invariants: {relations or 'none'}; model variables "
                f"traced: {', '.join(tracked) if tracked else 'none'})")
    if reason == "the relevant invariant fires on the fixed variant too":
        example = record["relevant_on_fixed_example"]
        return f"{record['bug']} ({run} and fixed run #{record['fixed']['run']}: \"{example[0] if example else ''}\")"
    example = record["relevant_in_fit_example"]
    return (f"{record['bug']} ({run}: {record['relevant_in_fit']} relevant invariants deployed, none violated at or "
            f"after the trigger step, e.g. \"{example[0] if example else ''}\")")


def false_positive_gaps(data):
    folds = (data.get("false_positives") or {}).get("folds") or []
    benchmark = data.get("benchmark")
    if not folds:
        return ["Not measured."]
    good = [f for f in folds if f["status"] == RunStatus.SUCCEEDED]
    rates = per_invariant_rates(good)
    lines = []
    if rates["folds"]:
        lines.append(
            f"The paper's < 2 % per invariant is {'' if rates['mean'] < 0.02 else 'not '}reproduced: with 5 "
            f"references the mean over {rates['folds']} held-out pipelines is {_pct(rates['mean'])}. "
            + " ".join(f"Held-out {f['held_out']} (run #{f['run']}): {f['failed']} of {f['deployed']} invariants "
                       f"failed" + (f", e.g. \"{f['failed_example'][0]}\"." if f["failed_example"] else ".")
                       for f in good))
    if benchmark and benchmark.get("clean_runs"):
        lines.append(
            f"The benchmark reports per run, as for every other detector: a clean run with any failed invariant is a "
            f"false positive, so with hundreds of invariants deployed one failure in any of them makes the run "
            f"count ({benchmark['clean_runs_with_alarm']}/{benchmark['clean_runs']} in evaluation "
            f"#{benchmark['evaluation']}). Its per-check rate ({_pct(benchmark['per_check_fp_rate'])}) is the paper's "
            f"measure, but of a fit on {benchmark['fit_references'] or 'the default pipelines'} checked mostly on "
            f"programs of other families (the bugs' fixed variants), not on one more program like the references.")
    return lines


def overhead_gaps(data):
    overhead, benchmark = data.get("overhead"), data.get("benchmark")
    if not overhead or not overhead.get("pairs"):
        return ["Not measured."]
    step = overhead["median_step_time_ratio"]
    lines = [
        f"The paper's < 11 % is {'' if step is not None and step < 1.11 else 'not '}reproduced for the time per "
        f"training step here ({_ratio(step)}, {_increase(step)}); end to end, a run costs "
        f"{_ratio(overhead['median_end_to_end_ratio'])}.",
        f"With {'/'.join(map(str, overhead['deployed']))} invariants deployed the step-time ratio is "
        f"{_ratio(overhead['median_step_time_ratio'])} (plain {overhead['median_plain_step_ms']:.2f} ms, "
        f"checked {overhead['median_step_ms']:.2f} ms per step) and the end-to-end ratio "
        f"{_ratio(overhead['median_end_to_end_ratio'])} (runs {', '.join(f'#{run}' for run in overhead['runs'])}; "
        f"the end-to-end time includes TrainCheck's "
        f"instrumentation of the script and its offline check, median {overhead['median_check_seconds']} s, which "
        f"a per-step figure leaves out). GPU training steps of large models, as in the paper's workloads, take far "
        f"longer than this CPU workload's {overhead['median_plain_step_ms']:.2f} ms, against which the same per-call "
        f"tracing weighs more."]
    if benchmark and benchmark.get("step_ratio") is not None:
        lines.append(f"The benchmark deploys every invariant of its default fit ({benchmark['fit_invariants']}): step "
                     f"{_ratio(benchmark['step_ratio'])}, end to end {_ratio(benchmark['end_to_end_ratio'])} "
                     f"(evaluation #{benchmark['evaluation']}).")
    return lines


def render(data):
    """docs/traincheck-paper.md from the stored figures (``data``, the JSON file's content)."""
    benchmark = data.get("benchmark")
    source = (f"evaluation #{benchmark['evaluation']} of {benchmark['stored']} (commit {benchmark['commit'] or '?'})"
              if benchmark else "no stored evaluation yet (`--render-only` against a database that has one fills it)")
    out = [
        "# TrainCheck: the paper's protocol beside the benchmark's",
        "",
        "Generated by `manage.py traincheck_protocols` from docs/traincheck-protocols.json (`--render-only` rewrites "
        "it without running anything); do not edit by hand. The logic and the per-bug relevant relations live in "
        "evaluation/traincheck_protocols.py.",
        "",
        f"Measured {data.get('measured_at', '?')} at commit {data.get('commit') or '?'} with traincheck "
        f"{data.get('traincheck') or '?'} and torch {data.get('torch') or '?'}; compute "
        f"{_minutes(data.get('compute_seconds', {}).get('total'))} of wall time on this machine. The benchmark's "
        f"column: {source}.",
        "",
        comparison_table(data).rstrip(),
        "",
        "## How each column is measured",
        "",
        "* **Paper**: the TrainCheck paper (OSDI'25) as its talk states it.",
        "* **Paper's protocol here**, through the real pipeline (campaigns, a local worker, traincheck 0.2.0):",
        f"  * *Detection*: each bug is fitted on a clean run of the same pipeline, its own fixed variant at seed "
        f"{DETECTION_CONFIG['fit_seed']} (`fit_on_self`), the closest thing to the paper's references of the same "
        f"family (for DS-1801, the same Megatron-DeepSpeed with BF16 and no clipping): none of the six clean pipelines "
        f"shares a bug's model, optimizer or rank layout. Then its buggy and fixed variants run at seed {CHECK_SEED}. "
        "A bug counts when the buggy run violates, at or after the trigger step, an invariant of the relation "
        "declared relevant to it (a person's reading, written down per bug below) that the fixed run does not. "
        "A bug whose fault no relation of traincheck 0.2.0 can state is not run and counts as missed.",
        "  * *False positives*: leave-one-out over the six clean pipelines: fit on five (`fit_pipelines: None`), "
        "check the held-out one; failed invariants / deployed invariants per fold.",
        f"  * *Overhead*: interleaved plain / TrainCheck pairs on {OVERHEAD_WORKLOAD} (evaluation/overhead.py), with "
        f"the {DEPLOYED_FOR_OVERHEAD} invariants with the most positive examples of its leave-one-out fit deployed "
        "(`deploy_top`), traced selectively.",
        "* **Benchmark's protocol here**: the stored evaluation's rule for every detector: detected beyond the fixed "
        "twin, false positives per clean run (and TrainCheck's per-check rate), overhead with the full default fit.",
        "",
        "## Gaps, with evidence",
        "",
        "### Bugs detected",
        "",
        *_paragraphs(detection_gaps(data.get("detection") or [], benchmark, data.get("catalog_bugs", []))),
        "### False positives",
        "",
        *_paragraphs(false_positive_gaps(data)),
        "### Overhead",
        "",
        *_paragraphs(overhead_gaps(data)),
    ]
    records = data.get("detection") or []
    if records:
        out += ["## Per bug", "",
                "Runs are those of the measuring database (campaigns "
                f"{', '.join(f'#{c}' for c in data.get('campaigns', []))}). \"(TrainCheck's)\" marks the bugs taken "
                "from TrainCheck's own evaluation. \"Benchmark rule, same runs\": the benchmark's "
                "beyond-the-fixed-twin rule applied to this protocol's runs.", "",
                detection_table(records, benchmark).rstrip(), "",
                "### The relevant relation declared for each bug", "", relevance_table(records).rstrip(), ""]
    folds = (data.get("false_positives") or {}).get("folds") or []
    if folds:
        out += ["## Leave-one-out folds", "", fold_table(folds).rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"


def _paragraphs(lines):
    return [part for line in lines for part in (line, "")]


def _increase(ratio):
    return "–" if ratio is None else f"{100 * (ratio - 1):+.1f} %"


def _minutes(seconds):
    return "?" if seconds is None else f"{seconds / 60:.1f} min"
