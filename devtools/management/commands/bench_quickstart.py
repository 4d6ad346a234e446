"""Where a quickstart's time went (issue 33): read from its campaign's runs, after the fact. Prints figures, never
asserts. Time the quickstart itself, then read it:

    SILENTBENCH_VAR_DIR=/tmp/qs /usr/bin/time -f %e .venv/bin/python manage.py quickstart --no-serve
    SILENTBENCH_VAR_DIR=/tmp/qs .venv/bin/python manage.py bench_quickstart

Per campaign (the newest named "quickstart", or --campaign): its span from first claim to last result; the
run-seconds from claim to result, in the sandbox (``Run.wall_seconds``) and the reproducers' own (first to last step
record, over all ranks); the median sandbox time beyond the reproducer's own, by the world size its manifest
declares; the gap from a run's result to the next claim; how long fewer than --slots runs were under way; the
programs that cost the most. Every run that ran counts in the time; the sandbox figures are the succeeded runs'.

``--direct BUG,...`` times ``runners.execution.execute`` in this process instead, --repeat times on one stored
buggy run of each bug under ``--detector`` (after one untimed run that starts the zygote): the sealed run alone,
without broker or worker, for comparing two trees of the executor side by side.
"""
import bisect
import statistics
import time
from collections import defaultdict

from django.core.management.base import BaseCommand, CommandError

from core.cli import comma_list, positive_int
from devtools.run_times import own_seconds, world_size
from runners.execution import execute
from runners.models import Campaign, Run, RunStatus


class Command(BaseCommand):
    help = "Where a quickstart campaign's time went, from its runs; or --direct: sealed runs timed in-process."

    def add_arguments(self, parser):
        parser.add_argument("--campaign", type=int, help="a campaign's ID (default: the newest named quickstart)")
        parser.add_argument("--top", type=positive_int, default=8, help="programs listed by their cost")
        parser.add_argument("--slots", type=positive_int, default=2,
                            help="runs at a time the campaign had (the quickstart's default: one per core)")
        parser.add_argument("--direct", type=comma_list, help="bug IDs whose runs are timed through execute()")
        parser.add_argument("--detector", default="plain", help="with --direct: the detector of the runs timed")
        parser.add_argument("--repeat", type=positive_int, default=10, help="with --direct: timed runs per bug")

    def handle(self, *args, campaign, top, slots, direct, detector, repeat, **options):
        if direct:
            return self.direct(direct, detector, repeat)
        chosen = (Campaign.objects.filter(pk=campaign) if campaign
                  else Campaign.objects.filter(name="quickstart").order_by("-pk")).first()
        if chosen is None:
            raise CommandError("No such campaign: run `manage.py quickstart --no-serve` first, or give --campaign.")
        # every run that ran counts in the time (a failed one held its slot too); the sandbox figures are of those
        # that succeeded
        ran = list(chosen.runs.filter(started_at__isnull=False, finished_at__isnull=False)
                   .select_related("reproducer_version__reproducer__bug"))
        runs = [run for run in ran if run.status == RunStatus.SUCCEEDED]
        if not runs:
            raise CommandError(f"Campaign #{chosen.pk} has no succeeded run to read.")
        starts = sorted(run.started_at.timestamp() for run in ran)
        ends = [run.finished_at.timestamp() for run in ran]
        claimed = [end - run.started_at.timestamp() for run, end in zip(ran, ends)]
        sandbox = [run.wall_seconds or 0.0 for run in runs]
        own = [own_seconds(run) or 0.0 for run in runs]  # without two timed records, all of it is beyond
        write = self.stdout.write
        write(f"Campaign #{chosen.pk} ({chosen.name}): {len(runs)} succeeded runs of {chosen.runs.count()}, "
              f"{len(ran)} ran.")
        write(f"span, first claim to last result: {max(ends) - starts[0]:.1f} s")
        write(f"run-seconds, claim to result: {sum(claimed):.0f}; succeeded runs in the sandbox: {sum(sandbox):.0f}, "
              f"of which the reproducers' own: {sum(own):.0f}")
        by_size = defaultdict(list)
        for run, seconds, mine in zip(runs, sandbox, own):
            by_size[world_size(run.reproducer_version)].append(seconds - mine)
        for size, beyond in sorted(by_size.items()):
            write(f"median sandbox time beyond the reproducer's own, {size} rank(s): {statistics.median(beyond):.3f} s "
                  f"(n = {len(beyond)})")
        # to the next claim by any slot: one that has just stored a result claims the next run, unless another was free
        gaps = [starts[index] - end for end in ends if (index := bisect.bisect_right(starts, end)) < len(starts)]
        if gaps:
            write(f"gap from a result to the next claim: median {statistics.median(gaps):.3f} s, sum {sum(gaps):.1f} s")
        write(f"time with fewer than {slots} runs under way: {self.time_below(ran, slots):.1f} s")
        cost = defaultdict(float)
        for run, seconds in zip(ran, claimed):
            reproducer = run.reproducer_version.reproducer
            cost[reproducer.bug.bug_id if reproducer.bug else str(reproducer)] += seconds
        write("costliest programs (run-seconds, claim to result):")
        for name, seconds in sorted(cost.items(), key=lambda item: -item[1])[:top]:
            write(f"  {name}: {seconds:.1f}")

    @staticmethod
    def time_below(runs, slots):
        """Seconds of the campaign's span during which fewer than ``slots`` runs were under way."""
        events = sorted([(run.started_at.timestamp(), 1) for run in runs]
                        + [(run.finished_at.timestamp(), -1) for run in runs])
        below, running, previous = 0.0, 0, events[0][0]
        for moment, change in events:
            if running < slots:
                below += moment - previous
            running, previous = running + change, moment
        return below

    def direct(self, bugs, detector, repeat):
        for bug_id in bugs:
            run = (Run.objects.filter(reproducer_version__reproducer__bug__bug_id=bug_id, detector__name=detector,
                                      variant="buggy").order_by("pk").first())
            if run is None:
                raise CommandError(f"No buggy run of {bug_id} under {detector} is stored to time.")
            execute(run)  # starts the zygote
            sandbox, whole = [], []
            for _ in range(repeat):
                started = time.monotonic()
                outcome = execute(run)
                whole.append(time.monotonic() - started)
                sandbox.append(outcome.wall_seconds)
                if not outcome.succeeded:
                    raise CommandError(f"{bug_id}: {outcome.failure_reason}")
            self.stdout.write(f"{bug_id} under {detector}, {repeat} runs: median sandbox "
                              f"{statistics.median(sandbox):.3f} s, execute() {statistics.median(whole):.3f} s")
