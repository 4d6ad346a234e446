"""Benchmark: cold starts (``python repro.py`` in the sealed sandbox) against warm ones (forked from the zygote
that has already imported torch), through one local worker running one run at a time.

Prints figures, never asserts. Every CPU reproducer of the catalog (buggy and fixed) and every clean pipeline
runs under the ``plain`` detector (or ``--detector``), once through a worker started with
``SILENTBENCH_WARM_START=false`` and once through one started with ``true``; with ``--rounds N`` the pair is
repeated, the order alternating (cold, warm, warm, cold, ...) so that a drift of the machine's load weighs on
both. Uses the database and broker of the settings (SQLite and the filesystem broker by default):

    SILENTBENCH_VAR_DIR=/tmp/benchvar .venv/bin/python manage.py bench_executor [--bugs DS-1801] [--seeds 0,1]
        [--detector traincheck]

A detector that fits (TrainCheck) fits before the first campaign, so that neither mode pays for it; its
programs that are reference pipelines are left out, as the evaluation leaves them out. Its runs' offline
check (``Run.analysis_seconds``) is reported apart, and the alarms of each pair compared.

Per start mode: runs, the campaign's wall time (created -> completed), runs per hour, the median run wall
time, and the median overhead per run by world size: ``Run.wall_seconds`` minus the reproducer's own time,
from its first to its last step record over all ranks (a Run does not keep the ``start`` record, so the first
step is part of the overhead: the interpreter, ``import torch``, building the model, starting the ranks); the sum
of the runs' wall times and the median gap from one run's end to the next one's claim (the broker and the worker:
the filesystem broker polls once a second). Each campaign has a fresh worker, so its first run also waits for the
worker's zygote to import torch, in both modes. Then cold/warm ratios, how many runs recorded a warm or a cold
start (``Run.execution["start"]``), whether each run's per-step losses were the same warm and cold, and every
failed run with its reason.
"""
import os
import statistics
import time
from collections import Counter, defaultdict
from contextlib import contextmanager

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from core.cli import comma_list, int_list, positive_int
from core.enums import Variant
from devtools.run_times import own_seconds, world_size
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.detector_versions.fitting import ensure_fit, is_fit_reference
from runners.detectors import get_plugin
from runners.models import Campaign, RunStatus, Worker
from runners.plans import CampaignPlan
from runners.progress import wait_for_campaign
from runners.selectors import runnable_versions
from runners.worker.local import local_worker, log_tail

MODES = {"cold": "false", "warm": "true"}  # start mode -> SILENTBENCH_WARM_START of its worker
WORKER_START_TIMEOUT = 120


@contextmanager
def environment_variable(name, value):
    """``os.environ[name] = value`` for the block (the local worker copies this process's environment)."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def step_losses(run):
    return sorted((record.get("step"), record.get("rank"), repr(record.get("loss")))
                  for record in run.step_records or () if isinstance(record, dict))


def alarm_rules(run):
    return sorted((alarm.step, alarm.rule) for alarm in run.alarms.all())


def median(values, spec=".2f"):
    return format(statistics.median(values), spec) if values else "-"


def ratio(cold, warm):
    return f"{statistics.median(cold) / statistics.median(warm):.2f}" if cold and warm else "-"


class Command(BaseCommand):
    help = ("Cold against warm starts: every CPU reproducer (buggy and fixed) and clean pipeline under plain "
            "(or --detector), through one local worker, with SILENTBENCH_WARM_START false then true. Prints figures.")

    def add_arguments(self, parser):
        parser.add_argument("--seeds", type=int_list, default=[0], help="comma-separated seeds (default 0)")
        parser.add_argument("--bugs", type=comma_list,
                            help="comma-separated bug IDs (default: every runnable bug); with it, no clean pipeline "
                                 "runs unless --pipelines names some")
        parser.add_argument("--pipelines", type=comma_list,
                            help="comma-separated clean pipelines (default: all of them, none with --bugs)")
        parser.add_argument("--detector", default="plain", help="the detector every run is under (default plain)")
        parser.add_argument("--rounds", type=positive_int, default=1,
                            help="cold and warm campaigns each, alternating (cold, warm, warm, cold, ...)")

    def handle(self, *args, seeds, bugs, pipelines, rounds, detector, **options):
        try:
            plugin = get_plugin(detector)
        except KeyError as error:
            raise CommandError(f"no such detector: {detector}") from error
        call_command("migrate", interactive=False, verbosity=0)
        call_command("load_catalog", verbosity=0)
        record = do_record_detector(detector)
        versions = [version for version in self.versions(bugs, pipelines) if not is_fit_reference(version, record)]
        if plugin.needs_fit:
            started = time.monotonic()
            fits = {ensure_fit(record, version).pk for version in versions}
            self.stdout.write(f"{detector}: {len(fits)} fit(s) ready in {time.monotonic() - started:.1f} s")
        plan = CampaignPlan.build(versions, [record], Variant.values, seeds)
        sizes = Counter(world_size(version) for version in versions)
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        broker = settings.CELERY_BROKER_URL.split("://")[0]
        load = os.getloadavg()
        shapes = ", ".join(f"{n} x {size} rank(s)" for size, n in sorted(sizes.items()))
        self.stdout.write(
            f"bench_executor: {len(versions)} reproducers ({shapes}), "
            f"{len(plan.runs)} runs per campaign ({detector}, seeds {','.join(map(str, seeds))}), {rounds} round(s); "
            f"one local worker, concurrency 1; database={database} broker={broker}; {os.cpu_count()} CPUs; "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

        order = []
        for round_ in range(rounds):
            modes = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            order += [(mode, round_ + 1) for mode in modes]
        campaigns = {}
        for mode, round_ in order:
            campaigns[(mode, round_)] = self.campaign(mode, round_, plan)
        load = os.getloadavg()
        self.stdout.write(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        self.summary(campaigns, rounds)

    def versions(self, bugs, pipelines):
        versions = runnable_versions(bugs) if bugs is None or bugs else []
        missing = sorted(set(bugs or ()) - {version.reproducer.bug.bug_id for version in versions})
        if missing:
            raise CommandError(f"no approved CPU reproducer for {', '.join(missing)}")
        clean = runnable_versions(pipelines=True)
        if pipelines is None:
            clean = [] if bugs else clean
        else:
            unknown = sorted(set(pipelines) - {version.reproducer.name for version in clean})
            if unknown:
                raise CommandError(f"no such clean pipeline: {', '.join(unknown)}")
            clean = [version for version in clean if version.reproducer.name in pipelines]
        if not versions + clean:
            raise CommandError("nothing to run")
        return versions + clean

    def campaign(self, mode, round_, plan):
        """One campaign of ``plan`` through a fresh local worker whose starts are ``mode``; returns it done."""
        logs = settings.VAR_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"bench-executor-{mode}.log"
        name = f"benchexec{mode}{round_}"
        asked = timezone.now()
        with environment_variable("SILENTBENCH_WARM_START", MODES[mode]), \
                local_worker(log, name=name, concurrency=1) as worker:
            def watchdog():
                if worker.poll() is not None:
                    raise CommandError(f"The local worker exited (code {worker.returncode}):\n{log_tail(log)}")

            deadline = time.monotonic() + WORKER_START_TIMEOUT  # the clock starts once it consumes the queue
            while not Worker.objects.filter(hostname__startswith=f"{name}@", registered_at__gte=asked).exists():
                watchdog()
                if time.monotonic() > deadline:
                    raise CommandError(f"the local worker did not register within {WORKER_START_TIMEOUT} s:\n"
                                       f"{log_tail(log)}")
                time.sleep(0.2)
            campaign = do_create_campaign(f"bench_executor {mode} round {round_}", plan, acting_user=None)
            self.stdout.write(f"{mode} round {round_}: campaign #{campaign.pk}, {len(plan.runs)} runs "
                              f"(SILENTBENCH_WARM_START={MODES[mode]} on worker {name})")
            started = time.monotonic()
            wait_for_campaign(campaign, lambda line: None, interval=0.5, watchdog=watchdog)
            waited = time.monotonic() - started
            campaign.refresh_from_db()
            completed = campaign.completed_at
            while completed is None and time.monotonic() - started < waited + 30:  # completes after its last run
                time.sleep(0.2)
                campaign.refresh_from_db()
                completed = campaign.completed_at
        wall = (completed - campaign.created_at).total_seconds() if completed else None
        self.stdout.write(f"  done: {wall:.1f} s created -> completed" if wall is not None
                          else f"  done after {waited:.1f} s, but the campaign was never marked completed")
        return campaign

    def summary(self, campaigns, rounds):
        by_mode = defaultdict(list)
        totals = defaultdict(float)
        for (mode, round_), campaign in campaigns.items():
            campaign = Campaign.objects.get(pk=campaign.pk)
            runs = list(campaign.runs.select_related("reproducer_version__reproducer__bug").order_by("id"))
            by_mode[mode] += [(round_, run) for run in runs]
            end = campaign.completed_at or max((run.finished_at for run in runs if run.finished_at), default=None)
            totals[mode] += (end - campaign.created_at).total_seconds() if end else float("nan")

        figures = {}
        self.stdout.write("\n| | cold | warm | cold / warm |\n|---|---:|---:|---:|")
        for mode, runs in by_mode.items():
            done = [run for _, run in runs if run.status == RunStatus.SUCCEEDED]
            overhead = defaultdict(list)
            for run in done:
                own = own_seconds(run)
                if own is not None and run.wall_seconds is not None:
                    overhead[world_size(run.reproducer_version)].append(run.wall_seconds - own)
            gaps = []  # a run's end to the next one's claim, within a campaign: the broker and the worker
            for round_ in {round_ for round_, _ in runs}:
                started = sorted((run for r, run in runs if r == round_ and run.started_at and run.finished_at),
                                 key=lambda run: run.started_at)
                gaps += [(after.started_at - before.finished_at).total_seconds()
                         for before, after in zip(started, started[1:])]
            figures[mode] = {"runs": len(runs), "succeeded": len(done), "total": totals[mode],
                             "walls": [run.wall_seconds for run in done if run.wall_seconds is not None],
                             "checks": [run.analysis_seconds for run in done if run.analysis_seconds is not None],
                             "executing": sum(run.wall_seconds or 0 for _, run in runs),
                             "overhead": overhead, "gaps": gaps}
        cold, warm = figures.get("cold"), figures.get("warm")

        def row(label, cold_text, warm_text, ratio_text="-"):
            self.stdout.write(f"| {label} | {cold_text} | {warm_text} | {ratio_text} |")

        row("runs (succeeded)", f"{cold['runs']} ({cold['succeeded']})", f"{warm['runs']} ({warm['succeeded']})")
        row(f"total wall time, created -> completed, {rounds} campaign(s) (s)", f"{cold['total']:.1f}",
            f"{warm['total']:.1f}", f"{cold['total'] / warm['total']:.2f}")
        row("runs per hour", f"{3600 * cold['runs'] / cold['total']:.0f}", f"{3600 * warm['runs'] / warm['total']:.0f}",
            f"{(cold['runs'] / cold['total']) / (warm['runs'] / warm['total']):.2f}")
        row("median run wall time (s)", median(cold["walls"]), median(warm["walls"]),
            ratio(cold["walls"], warm["walls"]))
        if cold["checks"] or warm["checks"]:
            row("median offline check after the run (s)", median(cold["checks"]), median(warm["checks"]),
                ratio(cold["checks"], warm["checks"]))
        for size in sorted(set(cold["overhead"]) | set(warm["overhead"])):
            c, w = cold["overhead"].get(size, []), warm["overhead"].get(size, [])
            row(f"median overhead per run, {size} rank(s) (s; n = {len(c)} / {len(w)})", median(c), median(w),
                ratio(c, w))
        row("sum of the runs' wall times (s)", f"{cold['executing']:.1f}", f"{warm['executing']:.1f}",
            f"{cold['executing'] / warm['executing']:.2f}" if warm["executing"] else "-")
        row("median gap between runs, one finished -> the next claimed (s)", median(cold["gaps"], ".3f"),
            median(warm["gaps"], ".3f"))
        row("mean run wall time (s)", f"{statistics.mean(cold['walls']):.2f}" if cold["walls"] else "-",
            f"{statistics.mean(warm['walls']):.2f}" if warm["walls"] else "-")
        self.stdout.write(f"\ncold/warm: total wall time {cold['total'] / warm['total']:.2f}, median run wall time "
                          f"{ratio(cold['walls'], warm['walls'])}, median overhead "
                          + ", ".join(f"{size} rank(s) {ratio(cold['overhead'].get(size), warm['overhead'].get(size))}"
                                      for size in sorted(set(cold["overhead"]) | set(warm["overhead"]))))

        self.stdout.write("\nStart recorded in Run.execution['start']:")
        for mode, runs in by_mode.items():
            starts = Counter((run.execution or {}).get("start") or "not recorded" for _, run in runs)
            line = f"  {mode} campaign(s): " + ", ".join(f"{n} {start}" for start, n in sorted(starts.items()))
            wrong = sum(n for start, n in starts.items() if start != mode)
            if set(starts) == {"not recorded"}:
                line += " (Run.execution is empty: the worker's do_finish_run does not store it)"
            self.stdout.write(self.style.ERROR(line + f"  <- {wrong} not {mode}") if wrong else line)
            reasons = Counter((run.execution or {}).get("cold_reason") for _, run in runs
                              if (run.execution or {}).get("cold_reason"))
            for reason, n in reasons.items():
                self.stdout.write(f"    cold because: {reason} ({n})")

        self.compare_losses(by_mode)
        self.per_reproducer(by_mode)
        self.failures(by_mode)

    def compare_losses(self, by_mode):
        """Each (reproducer, variant, seed, round): the same (step, rank, loss) records and verdict warm and cold?"""
        keyed = {mode: {(run.reproducer_version_id, run.variant, run.seed, round_): run for round_, run in runs
                        if run.status == RunStatus.SUCCEEDED} for mode, runs in by_mode.items()}
        common = sorted(set(keyed.get("cold", {})) & set(keyed.get("warm", {})))
        differ = [key for key in common if step_losses(keyed["cold"][key]) != step_losses(keyed["warm"][key])
                  or keyed["cold"][key].manifested != keyed["warm"][key].manifested
                  or alarm_rules(keyed["cold"][key]) != alarm_rules(keyed["warm"][key])]
        line = (f"\nPer-step losses, oracle verdict and alarms identical warm and cold: {len(common) - len(differ)}/"
                f"{len(common)} pairs of succeeded runs")
        self.stdout.write(self.style.ERROR(line) if differ else line)
        for key in differ:
            cold, warm = keyed["cold"][key], keyed["warm"][key]
            self.stdout.write(self.style.ERROR(
                f"  differ: {cold.reproducer_version.reproducer} {cold.variant} seed {cold.seed} round {key[3]} "
                f"(runs {cold.pk} cold, {warm.pk} warm; manifested {cold.manifested} / {warm.manifested}; "
                f"{len(alarm_rules(cold))} / {len(alarm_rules(warm))} alarms)"))

    def per_reproducer(self, by_mode):
        walls = defaultdict(lambda: defaultdict(list))
        for mode, runs in by_mode.items():
            for _, run in runs:
                if run.status == RunStatus.SUCCEEDED and run.wall_seconds is not None:
                    walls[str(run.reproducer_version.reproducer)][mode].append(run.wall_seconds)
        self.stdout.write(f"\n{'reproducer':<44}{'ranks':>6}{'cold (s)':>10}{'warm (s)':>10}{'cold/warm':>11}")
        ranks = {str(run.reproducer_version.reproducer): world_size(run.reproducer_version)
                 for runs in by_mode.values() for _, run in runs}
        for name in sorted(walls):
            cold, warm = walls[name].get("cold", []), walls[name].get("warm", [])
            self.stdout.write(f"{name:<44}{ranks[name]:>6}{median(cold):>10}{median(warm):>10}"
                              f"{ratio(cold, warm):>11}")
        self.stdout.write("(median run wall time over both variants, seeds and rounds)")

    def failures(self, by_mode):
        failed = [(mode, round_, run) for mode, runs in by_mode.items() for round_, run in runs
                  if run.status != RunStatus.SUCCEEDED]
        if not failed:
            self.stdout.write(self.style.SUCCESS("\nNo failed runs."))
            return
        self.stdout.write(self.style.ERROR(
            f"\n!!! {len(failed)} RUN(S) DID NOT SUCCEED: the figures above leave them out of the medians and "
            f"include them in the wall times !!!"))
        for mode, round_, run in failed:
            reason = " ".join((run.failure_reason or "").split())
            self.stdout.write(self.style.ERROR(
                f"  {mode} round {round_}: run {run.pk} {run.reproducer_version.reproducer} {run.variant} seed "
                f"{run.seed}: {run.status} [{run.failure_kind or '-'}] {reason[:400]}"))
