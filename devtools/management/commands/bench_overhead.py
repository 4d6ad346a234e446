"""Benchmark: the overhead of some detectors, alone, without a whole evaluation.

The same interleaved pairs as ``manage.py evaluate`` times (evaluation.overhead: a ``plain`` run and an instrumented
run of one clean pipeline, in alternating order, one at a time in this process), for the detectors named. Prints
each pair, then per detector the median step-time and end-to-end ratios; never asserts. The runs are a campaign of
purpose ``overhead`` in the database of ``SILENTBENCH_VAR_DIR``, which needs the catalog loaded.

    SILENTBENCH_VAR_DIR=/tmp/benchvar .venv/bin/python manage.py bench_overhead --detectors shadow_precise,grad_health
"""
from django.core.management.base import BaseCommand

from core.cli import comma_list, positive_int
from evaluation.overhead import do_measure_overhead
from runners.actions.detectors import do_record_detector
from runners.cli import plan_from_options


class Command(BaseCommand):
    help = "Interleaved overhead pairs (plain against each detector) on one clean pipeline; prints the medians."

    def add_arguments(self, parser):
        parser.add_argument("--detectors", type=comma_list, required=True, help="comma-separated detector names")
        parser.add_argument("--workload", default="transformer-adamw", help="clean pipeline to time")
        parser.add_argument("--pairs", type=positive_int, default=5, help="pairs per detector (default 5)")
        parser.add_argument("--steps", type=positive_int, help="steps of each run (default: the workload's)")
        parser.add_argument("--cuda", action="store_true",
                            help="the workload may be a CUDA pipeline (--workload gpu-transformer, on a GPU host)")

    def handle(self, *args, detectors, workload, pairs, steps, cuda, **options):
        version = plan_from_options({"bugs": [], "pipelines": [workload], "detectors": ["plain"],
                                     "cuda": cuda}).versions[0]
        _, records = do_measure_overhead(version, [do_record_detector(name) for name in detectors],
                                         do_record_detector("plain"), pairs, steps, write=self.stdout.write)
        self.stdout.write(f"\n{'detector':<36} {'pairs':>5} {'step ratio':>10} {'end to end':>10} "
                          f"{'plain ms':>9} {'step ms':>8}")
        for record in records:
            self.stdout.write(f"{record['detector']:<36} {record['pairs']:>5} "
                              f"{record['median_step_time_ratio'] or '–':>10} "
                              f"{record['median_end_to_end_ratio'] or '–':>10} "
                              f"{record['median_plain_step_ms'] or '–':>9} {record['median_step_ms'] or '–':>8}")
