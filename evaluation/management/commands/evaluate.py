import signal
import socket
import sys
import time
from pathlib import Path

import torch
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from core.cli import comma_list, exit_on_sigterm, line_writer, positive_int, source_commit
from evaluation.actions import (
    do_publish_evaluation,
    do_record_overhead,
    do_retabulate_evaluation,
    do_store_evaluation,
)
from evaluation.models import Device, Evaluation
from evaluation.overhead import do_measure_overhead
from evaluation.results_doc import render, results_page
from runners.actions.campaigns import do_cancel_campaign, do_create_campaign
from runners.actions.detectors import do_record_builtin_detector_version, do_record_detector
from runners.actions.runs import do_give_up_running_runs
from runners.cli import plan_from_options
from runners.detector_versions.fitting import FitError, ensure_fit, is_fit_reference
from runners.detectors import all_plugins, get_plugin
from runners.detectors.bundle import Bundle, bundling_refusal
from runners.detectors.traincheck import tool_version
from runners.environments.host import gpu_inventory, host_capabilities, host_facts
from runners.environments.routing import needs_of, queue_for, queues_for_worker
from runners.models import CampaignPurpose
from runners.plans import CampaignPlan
from runners.selectors import runnable_versions
from runners.worker.local import wait_with_local_worker

CPU_WORKLOAD, GPU_WORKLOAD = "transformer-adamw", "gpu-transformer"  # the clean pipelines timed for overhead


def gpu_parameters(gpus):
    """What a GPU evaluation records of where it ran: the GPUs' model, the driver, CUDA and the GPU slots."""
    facts = host_facts()
    return {"gpu": ", ".join(sorted({gpu["name"] for gpu in gpus})), "gpus": len(gpus),
            "gpu_driver": facts["gpu_driver"], "cuda": torch.version.cuda or facts["cuda"],
            "runs_per_gpu": settings.SILENTBENCH_RUNS_PER_GPU}


def command_line(options):
    """The evaluate command as it was asked for (the options that were given)."""
    parts = ["manage.py evaluate" + (" --cuda" if options.get("cuda") else "") + (" --apart" if options.get("apart")
                                                                                    else "")]
    for name in ("seeds", "bugs", "pipelines", "detectors", "pairs", "baseline_every", "overhead_workload",
                 "overhead_steps", "concurrency", "timeout", "overhead_timeout"):
        value = options.get(name)
        if value is not None:
            parts.append(f"--{name.replace('_', '-')} {','.join(value) if isinstance(value, list) else value}")
    return " ".join(parts)


class Command(BaseCommand):
    help = ("Run the full evaluation: every CPU bug reproducer (buggy and fixed) and every clean reference "
            "pipeline x every detector x seeds, then interleaved overhead pairs. Stores the tables in the "
            "database (results page and exports) and regenerates docs/results.md from them.")

    def add_arguments(self, parser):
        parser.add_argument("--cuda", action="store_true",
                            help="the GPU evaluation, on this GPU node: every CUDA reproducer (and the CUDA pipelines "
                                 "--pipelines names) under every detector without a fit phase, those that only observe "
                                 "together in one bundle; "
                                 "stored as a GPU evaluation, written to docs/results-gpu.md (defaults: 3 seeds, "
                                 "overhead on gpu-transformer, a run at a time per GPU slot)")
        parser.add_argument("--apart", action="store_true",
                            help="with --cuda: every detector in runs of its own, none in a bundle (to compare: a "
                                 "race's window closes for all the members of a bundle when one waits for the GPU)")
        parser.add_argument("--timeout", type=positive_int,
                            help="seconds for the campaign's runs: those not finished by then are cancelled and the "
                                 "evaluation is stored with what finished (its run counts say so)")
        parser.add_argument("--overhead-timeout", type=positive_int,
                            help="seconds for the overhead pairs: the detectors not timed by then are left untimed "
                                 "(the evaluation is stored before they start)")
        parser.add_argument("--seeds", type=positive_int,
                            help="seeds 0..N-1 per (reproducer, variant, detector) (default 1; 3 with --cuda)")
        parser.add_argument("--bugs", type=comma_list, help="comma-separated bug IDs (default: every runnable bug)")
        parser.add_argument("--pipelines", type=comma_list, help="comma-separated clean pipelines (default: all)")
        parser.add_argument("--detectors", type=comma_list,
                            help="comma-separated detectors (default: all but plain and traincheck_full, which takes "
                                 "half the hour: docs/performance.md)")
        parser.add_argument("--pairs", type=positive_int,
                            help="the CPU's overhead: interleaved plain/instrumented pairs per detector (default 5)")
        parser.add_argument("--baseline-every", type=positive_int,
                            help="--cuda's overhead: each detector timed once, with a shared plain run before every N "
                                 "detectors and at the end (default 6: 22 runs for 18 detectors, not 36)")
        parser.add_argument("--overhead-workload",
                            help="clean pipeline timed for overhead (default transformer-adamw, held out of "
                                 "TrainCheck's fit; gpu-transformer with --cuda)")
        parser.add_argument("--overhead-steps", type=positive_int,
                            help="steps of the overhead runs (default: the workload's)")
        parser.add_argument("--concurrency", type=positive_int,
                            help="runs at a time on the local worker (default 2; with --cuda, the GPU slots: GPUs x "
                                 "SILENTBENCH_RUNS_PER_GPU)")
        parser.add_argument("--no-worker", action="store_true", help="rely on workers already consuming the queue")
        parser.add_argument("--results",
                            help="where to write the results page ('' to skip; default docs/results.md, "
                                 "docs/results-gpu.md with --cuda)")
        parser.add_argument("--publish", metavar="DIRECTORY",
                            help="then publish the evaluation: its snapshot written to DIRECTORY, to ship in "
                                 "evaluation/published/ (manage.py publish_evaluation)")
        parser.add_argument("--retabulate", type=int, metavar="EVALUATION_ID",
                            help="run nothing: recompute a stored evaluation's tables from its runs, rewrite the page")

    def handle(self, *args, **options):
        cuda = options["cuda"]
        if options["retabulate"] is not None:
            return self.retabulate(options["retabulate"], options["results"])
        if options["results"] is None:
            options["results"] = str(results_page(Device.GPU if cuda else Device.CPU))
        signal.signal(signal.SIGTERM, exit_on_sigterm)  # stopped like Ctrl-C: nothing left running
        started, commit = time.monotonic(), source_commit()  # the code that runs, whatever is committed meanwhile
        write = line_writer(sys.stdout)
        if options["apart"] and not cuda:
            raise CommandError("--apart is for --cuda: the CPU evaluation runs every detector apart already.")
        if cuda and options["pairs"] or not cuda and options["baseline_every"]:
            raise CommandError("--pairs times the CPU evaluation's overhead in interleaved pairs; --cuda times each "
                               "detector once against shared plain runs (--baseline-every).")
        gpus = gpu_inventory() if cuda else []
        if cuda and not gpus:
            raise CommandError("--cuda evaluates on this node's GPUs, and nvidia-smi lists none (or this worker "
                               "withholds them): run it on a GPU node, after bin/gpu-check.")
        pairs, baseline_every = (1, options["baseline_every"] or 6) if cuda else (options["pairs"] or 5, 0)
        seeds = options["seeds"] or (3 if cuda else 1)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("load_catalog", verbosity=0)
        plain = do_record_detector("plain")
        plan, overhead_detectors = self.gpu_plan(options, seeds) if cuda else self.cpu_plan(options, seeds)
        workload = plan_from_options({"bugs": [], "pipelines": [options["overhead_workload"] or (
            GPU_WORKLOAD if cuda else CPU_WORKLOAD)], "detectors": ["plain"], "cuda": cuda}).versions[0]
        detectors, versions = list(plan.detectors), list(plan.versions)

        fits = self.fit(detectors, versions, since=timezone.now())
        campaign = do_create_campaign("GPU evaluation" if cuda else "evaluation", plan, CampaignPurpose.EVALUATION,
                                      acting_user=None)
        self.stdout.write(f"Campaign #{campaign.pk}: {campaign.runs.count()} runs "
                          f"({len(versions)} programs x {len(detectors)} detectors x {seeds} seed(s)).")
        slots = len(gpus) * settings.SILENTBENCH_RUNS_PER_GPU
        progress = wait_with_local_worker(campaign, write, "evaluate", options["concurrency"] or slots or 2,
                                          start=not options["no_worker"], queues="auto-gpu" if cuda else "cpu",
                                          timeout=options["timeout"])
        if progress["done"] < progress["total"]:
            self.stdout.write(f"--timeout: {progress['total'] - progress['done']} run(s) not finished in "
                              f"{options['timeout']} s, cancelled; the evaluation keeps the finished ones.")
            do_give_up_running_runs(campaign, acting_user=None)
            do_cancel_campaign(campaign, acting_user=None)
        evaluation = do_store_evaluation(  # before the overhead: an interruption there loses only the overhead
            campaign, None, [], fits, wall_seconds=round(time.monotonic() - started, 1),
            parameters={
                "command": command_line(options), "seeds": seeds,
                "detectors": [d.name for d in overhead_detectors], "pairs": pairs,
                **({"baseline_every": baseline_every} if baseline_every else {}),
                "overhead_workload": str(workload.reproducer), "host": socket.gethostname(), "torch": torch.__version__,
                "traincheck": tool_version(), "commit": commit,
                **({**gpu_parameters(gpus), "apart": options["apart"]} if cuda else {}),
            }, device=Device.GPU if cuda else Device.CPU, acting_user=None)
        self.write_results(evaluation, options["results"])
        self.stdout.write(f"Evaluation #{evaluation.pk} stored, its overhead next.")
        self.stdout.write("\nOverhead: " + (f"each detector once, a shared plain run every {baseline_every}"
                                             if baseline_every else "interleaved plain/instrumented pairs")
                          + ", one run at a time.")
        deadline = options["overhead_timeout"] and time.monotonic() + options["overhead_timeout"]
        overhead_campaign, overhead = do_measure_overhead(workload, overhead_detectors, plain, pairs,
                                                          options["overhead_steps"], write, deadline=deadline,
                                                          baseline_every=baseline_every)
        do_record_overhead(evaluation, overhead_campaign, overhead, round(time.monotonic() - started, 1),
                           acting_user=None)
        self.stdout.write(f"Evaluation #{evaluation.pk} stored; {evaluation.wall_seconds / 60:.1f} min in all.")
        if options["publish"]:
            try:
                path = do_publish_evaluation(evaluation, Path(options["publish"]), acting_user=None)
                self.stdout.write(f"Published as {evaluation.published_id}: {path}")
            except ValidationError as error:  # the tables are stored and the page written below all the same
                self.stdout.write(f"Not published: {' '.join(error.messages)}")
        self.write_results(evaluation, options["results"])

    def cpu_plan(self, options, seeds):
        """(the plan, the detectors timed for overhead): every CPU bug and pipeline under every detector evaluated by
        default, each in runs of its own."""
        every_pipeline = [version.reproducer.name for version in runnable_versions(pipelines=True)]
        plan = plan_from_options({
            "bugs": options["bugs"], "pipelines": options["pipelines"] or every_pipeline,
            "detectors": options["detectors"] or [name for name, plugin in all_plugins().items()
                                                  if name != "plain" and plugin.evaluated_by_default],
            "seeds": range(seeds)}, skip=is_fit_reference)
        return plan, list(plan.detectors)

    def gpu_plan(self, options, seeds):
        """(the plan, the detectors timed for overhead): every CUDA reproducer (of ``--bugs``), and the CUDA pipelines
        ``--pipelines`` names (none by default: gpu-transformer, the overhead's workload, needs a GPU of 32 GB, which
        a GPU shared by several runs does not offer; the fixed variants are the clean runs), under every detector
        without a fit phase (of ``--detectors``; ``plain`` is the overhead's
        baseline, and ``bin/gpu-check`` verifies the reproducers before); the detectors that only observe watch each
        run together, in one bundle (runners.detectors.bundle), so that the GPU track fits in a node's few minutes.
        Each is timed alone for overhead."""
        plugins = all_plugins()
        names = options["detectors"] or [name for name, plugin in plugins.items()
                                         if not plugin.needs_fit and plugin.standalone and name != "plain"]
        unfit = sorted(name for name in names if name not in plugins or plugins[name].needs_fit
                       or not plugins[name].standalone)
        if unfit:
            raise CommandError(f"--cuda evaluates the detectors without a fit phase; not these: {', '.join(unfit)}")
        together = [] if options["apart"] else [name for name in names if not bundling_refusal(plugins[name])]
        apart = [name for name in names if name not in together or len(together) == 1]
        detectors = [do_record_detector(name) for name in apart]
        if len(together) > 1:  # the members' code is part of the bundle's config: new code, a new Detector row
            code = {name: do_record_builtin_detector_version(plugins[name]).code_hash for name in together}
            detectors.append(do_record_detector(Bundle.name, {"detectors": together, "code": code}))
        versions = runnable_versions(options["bugs"], cuda=True)
        pipelines = [version for version in runnable_versions(pipelines=True, cuda=True)
                     if version.reproducer.name in (options["pipelines"] or ())]
        problems = [f"{name}: no CUDA reproducer that runs today" for name in sorted(
            set(options["bugs"] or ()) - {version.reproducer.bug.bug_id for version in versions})]
        problems += [f"{name}: no CUDA pipeline" for name in sorted(
            set(options["pipelines"] or ()) - {version.reproducer.name for version in pipelines})]
        served = set(queues_for_worker(host_capabilities(), cpu=False))
        problems += [f"{version.reproducer}: it needs {needs_of(version)}, more than this node's GPUs offer each run "
                     f"(SILENTBENCH_RUNS_PER_GPU={settings.SILENTBENCH_RUNS_PER_GPU})"
                     for version in versions + pipelines if queue_for(version) not in served]
        if problems or not versions + pipelines:
            raise CommandError("; ".join(problems) or "no CUDA reproducer or pipeline in the catalog to evaluate")
        try:
            plan = CampaignPlan.build(versions + pipelines, detectors, seeds=range(seeds))
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from error
        return plan, [do_record_detector(name) for name in names]

    def retabulate(self, evaluation_id, results):
        evaluation = Evaluation.objects.filter(pk=evaluation_id).first()
        if evaluation is None:
            raise CommandError(f"No evaluation #{evaluation_id}.")
        try:
            do_retabulate_evaluation(evaluation, acting_user=None)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"Evaluation #{evaluation.pk}: tables recomputed from its runs.")
        self.write_results(evaluation, str(results_page(evaluation.device)) if results is None else results)

    def write_results(self, evaluation, results):
        if results:
            Path(results).write_text(render(evaluation), encoding="utf-8")
            self.stdout.write(f"Wrote {results}")

    def fit(self, detectors, versions, since):
        """Fit every fitted detector once per reference set, before any run, so that fit time is measured apart.
        An artifact made before ``since`` came from the cache."""
        rows = []
        for detector in detectors:
            if not get_plugin(detector.name).needs_fit:
                continue
            seen = set()
            for version in versions:
                if is_fit_reference(version, detector):
                    continue
                try:
                    artifact = ensure_fit(detector, version)
                except FitError as error:
                    raise CommandError(f"{detector.name}: fit for {version.reproducer} failed: {error}") from error
                if artifact.pk in seen:
                    continue
                seen.add(artifact.pk)
                cached = artifact.created_at < since
                rows.append({"detector": detector.name, "references": ", ".join(artifact.summary["references"]),
                             "invariants": artifact.summary["invariants"],
                             "collect_seconds": artifact.summary["collect_seconds"],
                             "infer_seconds": artifact.summary["infer_seconds"],
                             "fit_seconds": artifact.fit_seconds, "cached": cached})
                self.stdout.write(f"{detector.name}: fit on {rows[-1]['references']}: {rows[-1]['invariants']} "
                                  f"invariants, {artifact.fit_seconds:.0f} s{' (cached)' if cached else ''}")
        return rows
