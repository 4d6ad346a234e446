import signal
import sys
import time

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from bugs.models import Bug
from core.cli import comma_list, exit_on_sigterm, positive_int
from evaluation.actions import do_advance_bisection, do_fail_bisection, do_start_bisection
from evaluation.bisections import path_lines
from evaluation.models import Bisection, BisectionStatus


class Command(BaseCommand):
    help = ("Find the first torch release where a bug reproducer's oracle changes: each probe runs the buggy "
            "variant (plain, the seeds given) on one release through the workers, which must serve the releases' "
            "environments (SILENTBENCH_WORKER_ENVIRONMENTS); with k free worker slots each round probes k releases "
            "at once (k-section). The releases are those the package index serves between --good and --bad, or "
            "--releases. Prints the path it took (each probe: release, outcome, runs, seconds) and the result; "
            "the bisection's page shows the same.")

    def add_arguments(self, parser):
        parser.add_argument("bug", help="bug ID, e.g. PT-115607")
        parser.add_argument("--good", required=True, help="the release the search starts from, e.g. 2.9.0")
        parser.add_argument("--bad", required=True, help="the release whose outcome differs, e.g. 2.13.0")
        parser.add_argument("--releases", type=comma_list,
                            help="the releases to search, comma-separated (default: those the index serves)")
        parser.add_argument("--seeds", type=positive_int, default=3, help="seeds 0..N-1 per probe (default 3)")
        parser.add_argument("--workers", type=positive_int,
                            help="probes per round (default: the free worker slots as each round starts)")
        parser.add_argument("--steps", type=positive_int, help="training steps (default: the reproducer's)")
        parser.add_argument("--reproducer", help="which CPU reproducer of the bug (default: the first by name)")
        parser.add_argument("--poll", type=float, default=5.0, help="seconds between looks at the runs")

    def handle(self, *args, **options):
        signal.signal(signal.SIGTERM, exit_on_sigterm)
        bug = Bug.objects.filter(bug_id=options["bug"]).first()
        if bug is None:
            raise CommandError(f"No bug {options['bug']!r}.")
        try:
            bisection = do_start_bisection(
                bug, options["good"], options["bad"], seeds=range(options["seeds"]), releases=options["releases"],
                workers=options["workers"], steps=options["steps"], reproducer=options["reproducer"],
                acting_user=None)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"Bisection #{bisection.pk} of {bug.bug_id} ({bisection.reproducer_version}), "
                          f"{options['good']} -> {options['bad']}, {options['seeds']} seed(s).")
        try:
            self.drive(bisection, options["poll"])
        except (KeyboardInterrupt, SystemExit):
            do_fail_bisection(bisection, "stopped by the operator (its queued runs stay queued)", acting_user=None)
            raise
        bisection.refresh_from_db()
        self.stdout.write("\n".join(path_lines(bisection)))
        if bisection.status == BisectionStatus.FAILED:
            raise CommandError(bisection.reason)

    def drive(self, bisection, poll):
        """Advance until it ends, printing each round as it starts."""
        rounds = 0
        while bisection.status == BisectionStatus.RUNNING:
            bisection = do_advance_bisection(bisection, acting_user=None)
            started = bisection.probes.filter(round__gt=rounds).order_by("round", "id")
            for probe in started:
                rounds = max(rounds, probe.round)
                self.stdout.write(f"round {probe.round}: probing torch {probe.release} (campaign #{probe.campaign_id})")
            sys.stdout.flush()
            if bisection.status == BisectionStatus.RUNNING:
                time.sleep(poll)
                bisection = Bisection.objects.get(pk=bisection.pk)
