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
from evaluation.actions import do_retabulate_evaluation, do_store_evaluation
from evaluation.models import Evaluation
from evaluation.overhead import do_measure_overhead
from evaluation.results_doc import render
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.cli import plan_from_options
from runners.detector_versions.fitting import FitError, ensure_fit, is_fit_reference
from runners.detectors import all_plugins, get_plugin
from runners.detectors.traincheck import tool_version
from runners.models import CampaignPurpose
from runners.selectors import runnable_versions
from runners.worker.local import wait_with_local_worker


def command_line(options):
    """The evaluate command as it was asked for (the options that differ from their defaults)."""
    defaults = {"seeds": 1, "pairs": 5, "overhead_workload": "transformer-adamw", "concurrency": 2}
    parts = ["manage.py evaluate"]
    for name in ("seeds", "bugs", "pipelines", "detectors", "pairs", "overhead_workload", "overhead_steps",
                 "concurrency"):
        value = options.get(name)
        if value not in (None, defaults.get(name)):
            parts.append(f"--{name.replace('_', '-')} {','.join(value) if isinstance(value, list) else value}")
    return " ".join(parts)


class Command(BaseCommand):
    help = ("Run the full evaluation: every CPU bug reproducer (buggy and fixed) and every clean reference "
            "pipeline x every detector x seeds, then interleaved overhead pairs. Stores the tables in the "
            "database (results page and exports) and regenerates docs/results.md from them.")

    def add_arguments(self, parser):
        parser.add_argument("--seeds", type=positive_int, default=1,
                            help="seeds 0..N-1 per (reproducer, variant, detector)")
        parser.add_argument("--bugs", type=comma_list, help="comma-separated bug IDs (default: every runnable bug)")
        parser.add_argument("--pipelines", type=comma_list, help="comma-separated clean pipelines (default: all)")
        parser.add_argument("--detectors", type=comma_list,
                            help="comma-separated detectors (default: all but plain and traincheck_full, which takes "
                                 "half the hour: docs/performance.md)")
        parser.add_argument("--pairs", type=positive_int, default=5, help="plain/instrumented pairs per detector")
        parser.add_argument("--overhead-workload", default="transformer-adamw",
                            help="clean pipeline timed for overhead (held out of TrainCheck's fit)")
        parser.add_argument("--overhead-steps", type=positive_int,
                            help="steps of the overhead runs (default: the workload's)")
        parser.add_argument("--concurrency", type=positive_int, default=2, help="runs at a time on the local worker")
        parser.add_argument("--no-worker", action="store_true", help="rely on workers already consuming the queue")
        parser.add_argument("--results", default=str(settings.BASE_DIR / "docs" / "results.md"),
                            help="where to write the results page ('' to skip)")
        parser.add_argument("--retabulate", type=int, metavar="EVALUATION_ID",
                            help="run nothing: recompute a stored evaluation's tables from its runs, rewrite the page")

    def handle(self, *args, **options):
        if options["retabulate"] is not None:
            return self.retabulate(options["retabulate"], options["results"])
        signal.signal(signal.SIGTERM, exit_on_sigterm)  # stopped like Ctrl-C: nothing left running
        started, commit = time.monotonic(), source_commit()  # the code that runs, whatever is committed meanwhile
        write = line_writer(sys.stdout)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("load_catalog", verbosity=0)
        plain = do_record_detector("plain")
        every_pipeline = [version.reproducer.name for version in runnable_versions(pipelines=True)]
        plan = plan_from_options({
            "bugs": options["bugs"], "pipelines": options["pipelines"] or every_pipeline,
            "detectors": options["detectors"] or [name for name, plugin in all_plugins().items()
                                                  if name != "plain" and plugin.evaluated_by_default],
            "seeds": range(options["seeds"])}, skip=is_fit_reference)
        workload = plan_from_options({"bugs": [], "pipelines": [options["overhead_workload"]],
                                      "detectors": ["plain"]}).versions[0]
        detectors, versions = list(plan.detectors), list(plan.versions)

        fits = self.fit(detectors, versions, since=timezone.now())
        campaign = do_create_campaign("evaluation", plan, CampaignPurpose.EVALUATION, acting_user=None)
        self.stdout.write(f"Campaign #{campaign.pk}: {campaign.runs.count()} runs "
                          f"({len(versions)} programs x {len(detectors)} detectors x {options['seeds']} seed(s)).")
        wait_with_local_worker(campaign, write, "evaluate", options["concurrency"], start=not options["no_worker"])
        self.stdout.write("\nOverhead: interleaved plain/instrumented pairs, one run at a time.")
        overhead_campaign, overhead = do_measure_overhead(workload, detectors, plain, options["pairs"],
                                                          options["overhead_steps"], write)
        evaluation = do_store_evaluation(
            campaign, overhead_campaign, overhead, fits, wall_seconds=round(time.monotonic() - started, 1),
            parameters={
                "command": command_line(options), "seeds": options["seeds"], "detectors": [d.name for d in detectors],
                "pairs": options["pairs"], "overhead_workload": str(workload.reproducer),
                "host": socket.gethostname(), "torch": torch.__version__, "traincheck": tool_version(),
                "commit": commit,
            }, acting_user=None)
        self.write_results(evaluation, options["results"])
        self.stdout.write(f"Evaluation #{evaluation.pk} stored; {evaluation.wall_seconds / 60:.1f} min in all.")

    def retabulate(self, evaluation_id, results):
        evaluation = Evaluation.objects.filter(pk=evaluation_id).first()
        if evaluation is None:
            raise CommandError(f"No evaluation #{evaluation_id}.")
        try:
            do_retabulate_evaluation(evaluation, acting_user=None)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"Evaluation #{evaluation.pk}: tables recomputed from its runs.")
        self.write_results(evaluation, results)

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
