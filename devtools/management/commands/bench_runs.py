"""Benchmark: each reproducer alone vs through the pipeline (broker, worker, sandbox).

Prints medians, never asserts. Uses whatever DATABASE_URL / CELERY_BROKER_URL say, and starts its
own local worker, e.g.:

    CELERY_BROKER_URL=redis://127.0.0.1:6379/0 DATABASE_URL=postgres://postgres@127.0.0.1/silentbench \
        .venv/bin/python manage.py bench_runs --repeat 5

With ``--throughput N --workers W``: N runs at once through W local workers (queued-to-started
latency under a backlog and with an idle worker, runs per minute) against the same N runs executed
directly in the sandbox by W threads, as a wall-time ratio (devtools/loadbench.py; bench_load runs it).
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from core.enums import Variant
from devtools.loadbench import idle_dispatch, run_direct, run_specs, run_through_workers, throughput_summary
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.execution import materialize
from runners.plans import CampaignPlan
from runners.progress import wait_for_campaign
from runners.selectors import runnable_versions
from runners.worker.local import local_worker


def run_alone(version, variant, seed):
    """Wall time of ``python repro.py`` with no platform at all (report to stdout)."""
    with tempfile.TemporaryDirectory() as workdir:
        materialize(version.files, workdir)
        started = time.perf_counter()
        subprocess.run([sys.executable, version.entrypoint, "--variant", variant, "--seed", str(seed),
                        "--steps", str(version.default_steps)], cwd=workdir, check=True, capture_output=True)
        return time.perf_counter() - started


class Command(BaseCommand):
    help = "Time each CPU reproducer alone, then the queued-to-started latency and wall time through a worker."

    def add_arguments(self, parser):
        parser.add_argument("--repeat", type=int, default=3, help="runs alone per reproducer and variant")
        parser.add_argument("--through", type=int, default=1,
                            help="runs through the worker per reproducer and variant, one at a time")
        parser.add_argument("--bugs", help="comma-separated bug IDs (default: all runnable)")
        parser.add_argument("--throughput", type=int, default=0,
                            help="instead: this many runs through --workers workers at once, against directly")
        parser.add_argument("--workers", type=int, default=2, help="with --throughput: worker processes / threads")
        parser.add_argument("--idle", type=int, default=5,
                            help="with --throughput: single runs timed queued->started with an idle worker")

    def handle(self, *args, repeat, through, bugs, **options):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("load_catalog", verbosity=0)
        versions = runnable_versions(bugs.split(",") if bugs else None)
        broker = settings.CELERY_BROKER_URL.split("://")[0]
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        if options["throughput"]:
            return self.throughput(versions, options["throughput"], options["workers"], options["idle"],
                                   broker, database)
        self.stdout.write(f"broker={broker} database={database} alone x{repeat}, through the worker x{through}")

        alone = {}
        for version in versions:
            for variant in Variant.values:
                times = [run_alone(version, variant, seed) for seed in range(repeat)]
                alone[(str(version.reproducer), variant)] = statistics.median(times)

        (settings.VAR_DIR / "logs").mkdir(parents=True, exist_ok=True)
        with local_worker(settings.VAR_DIR / "logs" / "bench-worker.log", name="bench"):
            plain = do_record_detector("plain")
            time.sleep(3)  # let the worker connect before the first measurement
            pipeline, dispatch = {}, []
            for version in versions:
                for variant in Variant.values:
                    walls = []
                    for seed in range(through):  # one run at a time: queueing behind others is not dispatch
                        campaign = do_create_campaign("bench",
                                                      CampaignPlan.build([version], [plain], [variant],
                                                                         [seed]), acting_user=None)
                        wait_for_campaign(campaign, lambda line: None, timeout=600, interval=0.05)
                        run = campaign.runs.get()
                        dispatch.append((run.started_at - run.queued_at).total_seconds())
                        walls.append((run.finished_at - run.queued_at).total_seconds())
                    pipeline[(str(version.reproducer), variant)] = statistics.median(walls)

        self.stdout.write(f"\n{'reproducer':<36}{'variant':<8}{'alone (s)':>11}{'queued->done (s)':>18}{'ratio':>8}")
        for key, seconds in alone.items():
            self.stdout.write(f"{key[0]:<36}{key[1]:<8}{seconds:>11.2f}{pipeline[key]:>18.2f}"
                              f"{pipeline[key] / seconds:>8.2f}")
        ratios = [pipeline[key] / alone[key] for key in alone]
        self.stdout.write(f"\nmedian queued->started: {statistics.median(dispatch) * 1000:.0f} ms "
                          f"(min {min(dispatch) * 1000:.0f}, max {max(dispatch) * 1000:.0f}, n={len(dispatch)})")
        self.stdout.write(f"median pipeline/alone wall ratio: {statistics.median(ratios):.2f}")

    def throughput(self, versions, count, workers, idle, broker, database):
        plain = do_record_detector("plain")
        specs = run_specs(versions, count)
        load = os.getloadavg()
        self.stdout.write(f"broker={broker} database={database}: {count} plain runs of "
                          f"{', '.join(str(v.reproducer) for v in versions)} (both variants), {workers} workers; "
                          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        logs = settings.VAR_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        before = run_direct(specs, plain, workers)
        runs = run_through_workers(specs, plain, workers, logs)
        after = run_direct(specs, plain, workers)
        idle_latencies = idle_dispatch(specs[:idle], plain, logs) if idle else []
        for line in throughput_summary(runs, [before, after], workers, idle_latencies):
            self.stdout.write(line)
