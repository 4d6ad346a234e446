"""Benchmark: the sensitivity track's detectors bundled in one run each against the same detectors in runs of their
own. Prints agreement and wall times, never asserts. Run the same slice both ways, then compare:

    manage.py evaluate_sensitivity --pipelines mlp-adam,ddp-gloo --apart --results ''   # evaluation A
    manage.py evaluate_sensitivity --pipelines mlp-adam,ddp-gloo --results ''           # evaluation B
    manage.py bench_bundle A B

For every run both hold (a mutant or a clean twin, a detector, a seed): whether it raised the same alarms (rule,
step) and, for a mutant, whether it was caught in time beyond its clean twin (evaluation.sensitivity), which is what
the tables count. The evaluations may differ in size (B can be the full track, A a slice of it): only the runs both
hold are compared. The cost: for each program both ran (a mutant or a twin, a variant, a seed), the bundle's one run
against the sum of its members' runs apart, in seconds of run time.
"""
import statistics
from collections import defaultdict

from django.core.management.base import BaseCommand, CommandError

from evaluation.models import SensitivityEvaluation
from evaluation.sensitivity import (
    BASELINE,
    calibrations,
    judged_mutant_runs,
    labels,
    run_rows,
)
from runners.detectors.bundle import Bundle
from runners.models import RunStatus


def watched(evaluation):
    """{(mutant or pipeline, variant, detector, seed): (alarm set, caught or None)} of one evaluation's runs."""
    rows = run_rows(evaluation.campaign.runs.all())
    verdicts = labels(rows, calibrations(rows, evaluation.parameters.get("quantile", 0.9)))
    caught = {(row["mutant"], row["detector"], row["seed"]): row["caught"]
              for row in judged_mutant_runs(rows, verdicts)}
    return {(row["mutant"] or row["pipeline"], row["variant"], row["detector"], row["seed"]): (
        frozenset((alarm.rule, alarm.step) for alarm in row["alarms"]),
        caught.get((row["mutant"], row["detector"], row["seed"])))
        for row in rows if row["detector"] != BASELINE}


def run_seconds(evaluation, detectors):
    """{(mutant or pipeline, variant, seed): seconds} summed over the runs of ``detectors`` (names)."""
    seconds = defaultdict(float)
    for mutant, pipeline, variant, seed, wall in evaluation.campaign.runs.filter(
            status=RunStatus.SUCCEEDED, detector__name__in=detectors).values_list(
            "reproducer_version__reproducer__mutant__mutant_id", "reproducer_version__reproducer__name", "variant",
            "seed", "wall_seconds"):
        seconds[(mutant or pipeline, variant, seed)] += wall or 0.0
    return seconds


class Command(BaseCommand):
    help = "Compare a sensitivity evaluation run --apart with one run bundled: agreement per run, wall times."

    def add_arguments(self, parser):
        parser.add_argument("apart", type=int, help="the sensitivity evaluation run with --apart")
        parser.add_argument("bundled", type=int, help="the same slice, bundled")

    def handle(self, *args, **options):
        found = {pk: SensitivityEvaluation.objects.filter(pk=pk).select_related("campaign").first()
                 for pk in (options["apart"], options["bundled"])}
        missing = [f"#{pk}" for pk, evaluation in found.items() if evaluation is None]
        if missing:
            raise CommandError(f"No sensitivity evaluation {', '.join(missing)}.")
        apart, bundled = found[options["apart"]], found[options["bundled"]]
        if not bundled.parameters.get("bundled"):
            raise CommandError(f"Sensitivity evaluation #{bundled.pk} bundled no detectors.")
        runs = {name: watched(evaluation) for name, evaluation in (("apart", apart), ("bundled", bundled))}
        shared = sorted(set(runs["apart"]) & set(runs["bundled"]), key=str)
        members = set(bundled.parameters["bundled"])
        compared = [key for key in shared if key[2] in members]
        if not compared:
            raise CommandError("The two evaluations share no run of a bundled detector: run the same slice twice.")
        same_alarms = [key for key in compared if runs["apart"][key][0] == runs["bundled"][key][0]]
        judged = [key for key in compared if runs["apart"][key][1] is not None]
        same_verdict = [key for key in judged if runs["apart"][key][1] == runs["bundled"][key][1]]
        self.stdout.write(f"{len(compared)} runs of {len(members)} bundled detectors in both evaluations "
                          f"({len(judged)} of them mutant runs judged caught or not):")
        self.stdout.write(f"  the same alarms (rule, step):   {len(same_alarms)}/{len(compared)}")
        self.stdout.write(f"  the same caught / missed:       {len(same_verdict)}/{len(judged)}")
        for key in [key for key in compared if key not in same_alarms][:20]:
            only_apart = sorted(runs["apart"][key][0] - runs["bundled"][key][0])
            only_bundled = sorted(runs["bundled"][key][0] - runs["apart"][key][0])
            self.stdout.write(f"    differs: {key}: apart only {only_apart[:5]}, bundled only {only_bundled[:5]}")
        alone, together = run_seconds(apart, members), run_seconds(bundled, [Bundle.name])
        programs = sorted(set(alone) & set(together), key=str)
        if programs and sum(alone[p] for p in programs):
            ratio = sum(together[p] for p in programs) / sum(alone[p] for p in programs)
            self.stdout.write(f"  run time of the {len(members)} detectors per program, over {len(programs)} programs "
                              f"both ran: apart {statistics.median(alone[p] for p in programs):.2f} s (median sum), "
                              f"bundled {statistics.median(together[p] for p in programs):.2f} s (median run); "
                              f"bundled / apart {ratio:.3f}")
        for name, evaluation in (("apart", apart), ("bundled", bundled)):
            self.stdout.write(f"  {name:8} #{evaluation.pk}: {evaluation.parameters.get('runs')} runs, "
                              f"{evaluation.wall_seconds / 60:.1f} min in all")
