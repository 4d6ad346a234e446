import statistics
import sys

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core.cli import comma_list, line_writer, positive_int
from core.enums import VerificationVerdict
from runners.actions.campaigns import do_complete_campaign, do_start_verification
from runners.cli import plan_from_options
from runners.models import RunStatus, StabilityCheck
from runners.worker.local import wait_with_local_worker


class Command(BaseCommand):
    help = ("Verify reproducers through the normal run pipeline: k seeds of the buggy and the fixed variant "
            "(no detector). Records stability (buggy a/k, fixed b/k) and sets each bug to verified, flaky or "
            "unreproducible.")

    def add_arguments(self, parser):
        parser.add_argument("--bugs", type=comma_list, help="comma-separated bug IDs (default: every CPU reproducer)")
        parser.add_argument("--seeds", type=positive_int, default=3, help="k, the number of seeds (0..k-1)")
        parser.add_argument("--steps", type=positive_int, help="override each reproducer's default steps")
        parser.add_argument("--concurrency", type=positive_int, default=1,
                            help="runs at a time on the local worker (the verdict does not depend on it)")
        parser.add_argument("--no-worker", action="store_true",
                            help="do not start a local worker: rely on workers already consuming the queue")

    def handle(self, *args, bugs, seeds, steps, concurrency, no_worker, **options):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("load_catalog", verbosity=0)
        plan = plan_from_options({"bugs": bugs, "detectors": ["plain"], "seeds": range(seeds), "steps": steps})
        campaign = do_start_verification(list(plan.versions), seeds, steps, acting_user=None)  # the operator
        self.stdout.write(f"Campaign #{campaign.pk}: {campaign.runs.count()} verification runs.")
        wait_with_local_worker(campaign, line_writer(sys.stdout), "verify", concurrency, start=not no_worker)
        do_complete_campaign(campaign)  # normally done by the worker that finished the last run
        checks = list(StabilityCheck.objects.filter(campaign=campaign).select_related("reproducer_version__reproducer"))
        self.report(campaign, checks)
        if any(check.verdict != VerificationVerdict.VERIFIED for check in checks):
            raise CommandError("Not every reproducer verified; see the table above.")

    def report(self, campaign, checks):
        walls = {}
        for version_id, wall in campaign.runs.filter(status=RunStatus.SUCCEEDED).values_list(
                "reproducer_version_id", "wall_seconds"):
            walls.setdefault(version_id, []).append(wall)
        self.stdout.write(f"\n{'reproducer':<36}{'strategy':<10}{'buggy':>7}{'fixed':>7}{'failed':>8}"
                          f"{'median s':>10}  verdict")
        for check in sorted(checks, key=lambda c: str(c.reproducer_version.reproducer)):
            version = check.reproducer_version
            median = statistics.median(walls[version.pk]) if walls.get(version.pk) else float("nan")
            self.stdout.write(
                f"{str(version.reproducer):<36}{version.reproducer.strategy:<10}"
                f"{check.buggy_manifested:>4}/{check.seeds:<2}{check.fixed_manifested:>4}/{check.seeds:<2}"
                f"{check.failed_runs:>8}{median:>10.2f}  {check.verdict}")
        for run in campaign.runs.exclude(status=RunStatus.SUCCEEDED):
            self.stdout.write(self.style.ERROR(f"run {run.pk} ({run.reproducer_version.reproducer} {run.variant} "
                                               f"seed {run.seed}): {run.failure_reason}"))
