"""manage.py evaluate_sensitivity: the sensitivity track's benchmark command (docs/writing-a-fault-operator.md).

One campaign through the real workers: every mutant's buggy variant under every detector without a fit phase (and
``plain``, whose runs label the mutants), the clean twins (each mutated pipeline's fixed variant, the same steps)
under the same detectors and seeds, and the clean pipelines under ``plain`` over the calibration seeds, which give
each pipeline's noise. Its tables are stored as a SensitivityEvaluation (evaluation.sensitivity).

The built-in detectors that only observe watch each run together, in one bundle (runners.detectors.bundle: one
process, a probe each, each alarm stored with the member that raised it), which keeps the track within its hour on two
cores; the others, and every approved submitted detector without a fit phase, run in runs of their own. ``--apart``
runs every detector alone, to compare."""
import socket
import sys
import time
from pathlib import Path

import torch
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from bugs.models import ReproducerVersion
from core.cli import comma_list, line_writer, positive_int, source_commit
from core.enums import Variant
from evaluation.actions import do_retabulate_sensitivity_evaluation, do_store_sensitivity_evaluation
from evaluation.models import SensitivityEvaluation
from evaluation.sensitivity import BASELINE, markdown_report
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import (
    do_record_builtin_detector_version,
    do_record_detector,
    do_record_submitted_detector,
)
from runners.detector_versions.registry import approved_submitted_versions
from runners.detector_versions.submitted import SubmittedPlugin
from runners.detectors import all_plugins
from runners.detectors.bundle import Bundle, bundling_refusal
from runners.models import CampaignPurpose
from runners.plans import CampaignPlan
from runners.selectors import runnable_versions
from runners.worker.local import wait_with_local_worker
from sensitivity.models import Mutant
from sensitivity.mutants import mutant_programs, read_spec
from sensitivity.oracle import DEFAULT_QUANTILE


def sensitivity_plan(mutants, detectors, seeds, calibration_seeds, steps):
    """The campaign's runs: mutants buggy and their pipelines fixed under ``detectors`` x ``seeds``, and the
    pipelines under ``plain`` over ``calibration_seeds``; each run once."""
    latest = ReproducerVersion.objects.approved().filter(reproducer__mutant__in=mutants).latest_ids()
    versions = list(ReproducerVersion.objects.filter(pk__in=latest.values()).select_related("reproducer")
                    .order_by("reproducer__name"))
    names = {mutant.pipeline.name for mutant in mutants}
    pipelines = [version for version in runnable_versions(pipelines=True) if version.reproducer.name in names]
    plain = do_record_detector(BASELINE)
    parts = [CampaignPlan.build(versions, detectors, (Variant.BUGGY,), seeds, steps),
             CampaignPlan.build(pipelines, detectors, (Variant.FIXED,), seeds, steps),
             CampaignPlan.build(pipelines, [plain], (Variant.FIXED,), calibration_seeds, steps)]
    runs = {}
    for part in parts:
        for run in part.runs:
            runs.setdefault((run.version.pk, run.detector.pk, run.variant, run.seed), run)
    return CampaignPlan(tuple(versions + pipelines), tuple(dict.fromkeys([*detectors, plain])),
                        (Variant.BUGGY, Variant.FIXED), tuple(sorted({*seeds, *calibration_seeds})), steps,
                        tuple(runs.values()), parts[0].environments)


def command_line(options):
    """The command as it could be typed again (its options as given, defaults included)."""
    words = ["manage.py evaluate_sensitivity"]
    for name in ("operators", "pipelines", "mutants", "detectors"):
        if options[name]:
            words.append(f"--{name} {','.join(options[name])}")
    words += [f"--seeds {options['seeds']}", f"--calibration-seeds {options['calibration_seeds']}",
              f"--quantile {options['quantile']:g}"]
    words += [f"--{flag}" for flag in ("apart", "no-submitted") if options[flag.replace("-", "_")]]
    return " ".join(words)


class Command(BaseCommand):
    help = ("Run the sensitivity track: mutants x detectors without a fit phase x seeds, with clean twins and "
            "calibration runs, through a local worker; store and print its tables.")

    def add_arguments(self, parser):
        parser.add_argument("--detectors", type=comma_list,
                            help="default: every detector without a fit phase (plain is always run: it labels)")
        parser.add_argument("--seeds", type=positive_int, default=3)
        parser.add_argument("--calibration-seeds", type=positive_int, default=10,
                            help="clean runs per pipeline that measure its seed-to-seed spread (at least 3)")
        parser.add_argument("--quantile", type=float, default=DEFAULT_QUANTILE,
                            help="the quantile of clean-vs-clean differences a mutant's outcome must exceed")
        parser.add_argument("--operators", type=comma_list, help="only these operators' mutants")
        parser.add_argument("--pipelines", type=comma_list, help="only mutants of these pipelines")
        parser.add_argument("--mutants", type=comma_list, help="only these mutants (IDs)")
        parser.add_argument("--apart", action="store_true",
                            help="run every detector in runs of its own, none in a bundle (to compare with bundled)")
        parser.add_argument("--no-submitted", action="store_true",
                            help="leave out the approved submitted detectors without a fit phase (run by default)")
        parser.add_argument("--concurrency", type=positive_int, default=2, help="runs at a time on the local worker")
        parser.add_argument("--no-worker", action="store_true", help="rely on workers already consuming the queue")
        parser.add_argument("--retabulate", type=int, metavar="ID",
                            help="run nothing: recompute a stored sensitivity evaluation's tables, rewrite the page")
        parser.add_argument("--results", default=str(settings.BASE_DIR / "docs" / "results-sensitivity.md"),
                            help="where to write the results page ('' to skip)")

    def handle(self, *args, **options):
        if options["retabulate"] is not None:
            evaluation = SensitivityEvaluation.objects.filter(pk=options["retabulate"]).first()
            if evaluation is None:
                raise CommandError(f"No sensitivity evaluation #{options['retabulate']}.")
            return self.finish(do_retabulate_sensitivity_evaluation(evaluation, acting_user=None), options)
        if options["calibration_seeds"] < 3 or not 0 < options["quantile"] < 1:
            raise CommandError("--calibration-seeds must be at least 3 and --quantile between 0 and 1.")
        started, commit = time.monotonic(), source_commit()
        write = line_writer(sys.stdout)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("load_catalog", verbosity=0)
        call_command("load_mutants", verbosity=0)
        # the spec's mutants only: one taken out of it keeps its row and runs, and is not run again
        in_spec = [mutant.mutant_id for mutant in mutant_programs(settings.SILENTBENCH_CATALOG_DIR)]
        mutants = Mutant.objects.filter(mutant_id__in=in_spec).select_related("pipeline")
        for option, field in (("operators", "operator__in"), ("pipelines", "pipeline__name__in"),
                              ("mutants", "mutant_id__in")):
            if options[option]:
                mutants = mutants.filter(**{field: options[option]})
        mutants = list(mutants)
        if not mutants:
            raise CommandError("No mutant matches these options (see /sensitivity/mutants/).")
        plugins = all_plugins()
        names = options["detectors"] or [name for name, plugin in plugins.items()
                                         if not plugin.needs_fit and name != Bundle.name]
        unfit = [name for name in names if name not in plugins or plugins[name].needs_fit or name == Bundle.name]
        if unfit:
            raise CommandError(f"Not a detector without a fit phase: {', '.join(unfit)}")
        names = [name for name in dict.fromkeys(names) if name != BASELINE]
        # the detectors that only observe watch each run together, in one bundle, unless --apart
        together = [] if options["apart"] else [name for name in names if not bundling_refusal(plugins[name])]
        detectors = [do_record_detector(name) for name in [BASELINE, *(name for name in names if name not in together)]]
        if len(together) > 1:  # the members' code is part of the bundle's config: new code, a new Detector row
            code = {name: do_record_builtin_detector_version(plugins[name]).code_hash for name in together}
            detectors.append(do_record_detector(Bundle.name, {"detectors": together, "code": code}))
        elif together:
            detectors.append(do_record_detector(together[0]))
        submitted = [] if options["no_submitted"] else [
            version for version in approved_submitted_versions() if not SubmittedPlugin(version).needs_fit]
        detectors += [do_record_submitted_detector(version) for version in submitted]
        steps = int(read_spec()["steps"])
        try:
            plan = sensitivity_plan(mutants, detectors, range(options["seeds"]), range(options["calibration_seeds"]),
                                    steps)
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from error
        campaign = do_create_campaign("sensitivity evaluation", plan, CampaignPurpose.SENSITIVITY, acting_user=None)
        self.stdout.write(f"Campaign #{campaign.pk}: {campaign.runs.count()} runs ({len(mutants)} mutants x "
                          f"{len(detectors)} detectors x {options['seeds']} seed(s), clean twins, calibration).")
        wait_with_local_worker(campaign, write, "sensitivity", options["concurrency"],
                               start=not options["no_worker"])
        evaluation = do_store_sensitivity_evaluation(campaign, {
            "command": command_line(options), "mutants": len(mutants), "detectors": [d.name for d in detectors],
            "bundled": together if len(together) > 1 else [],
            # the code each built-in ran, by name: the open leaderboard gives a version its cell only if it ran
            "code": {name: do_record_builtin_detector_version(plugins[name]).code_hash for name in names},
            "submitted": [f"{version.name} {version.version}" for version in submitted],
            "seeds": options["seeds"], "calibration_seeds": options["calibration_seeds"],
            "quantile": options["quantile"], "steps": steps, "host": socket.gethostname(),
            "torch": torch.__version__, "commit": commit,
        }, round(time.monotonic() - started, 1), acting_user=None)
        self.finish(evaluation, options)

    def finish(self, evaluation, options):
        self.report(evaluation)
        if options["results"]:
            Path(options["results"]).write_text(markdown_report(evaluation), encoding="utf-8")
            self.stdout.write(f"Wrote {options['results']}")

    def report(self, evaluation):
        tables = evaluation.tables
        benign = sum(not label["manifested"] for label in tables["labels"])
        self.stdout.write(f"\nSensitivity evaluation #{evaluation.pk} stored, {evaluation.wall_seconds / 60:.1f} min "
                          f"in all: {len(tables['labels'])} mutant runs labelled, {benign} benign.")
        self.stdout.write("\nDetection by class (manifested runs caught in time) and the 50 % / 90 % severities:")
        thresholds = {(row["detector"], row["fault_class"]): row for row in tables["thresholds"]}
        for row in tables["by_class"]:
            found = thresholds.get((row["detector"], row["fault_class"]), {})
            rate = "-" if row["rate"] is None else f"{row['rate']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
            self.stdout.write(f"  {row['detector']:32} {row['fault_class']:9} {row['caught']:4}/{row['manifested']:<4} "
                              f"{rate:20} 50 %: {found.get('severity_50') or '-'}  90 %: "
                              f"{found.get('severity_90') or '-'}")
