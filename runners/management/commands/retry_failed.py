import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from core.cli import comma_list, line_writer, positive_int
from runners.actions.campaigns import do_retry_failed_runs
from runners.failures import parse_kinds
from runners.models import Campaign
from runners.selectors import watched_by
from runners.worker.local import wait_with_local_worker


class Command(BaseCommand):
    help = "Queue a campaign's failed runs again (new attempts) and wait for them with a local worker."

    def add_arguments(self, parser):
        parser.add_argument("campaign", type=int, help="campaign ID")
        parser.add_argument("--detectors", type=comma_list, help="only runs of these detectors")
        parser.add_argument("--kinds", type=comma_list,
                            help="only runs that failed this way, e.g. time_limit,crash (see Run.failure_kind)")
        parser.add_argument("--concurrency", type=positive_int, default=1)
        parser.add_argument("--no-worker", action="store_true", help="rely on workers already consuming the queue")

    def handle(self, *args, campaign, detectors, kinds, concurrency, no_worker, **options):
        if kinds is not None and not kinds:
            raise CommandError("--kinds names no kind: give one or more, e.g. --kinds time_limit,crash.")
        try:
            kinds = parse_kinds(kinds) if kinds else None
        except ValueError as error:
            raise CommandError(str(error)) from error
        found = Campaign.objects.filter(pk=campaign).first()
        if found is None:
            raise CommandError(f"No campaign #{campaign}.")
        runs = found.runs.all()
        if detectors:  # a bundle's run too, when one of them is a member (it runs again whole)
            runs = runs.filter(watched_by(detectors))
        try:
            run_ids = do_retry_failed_runs(found, runs, kinds=kinds, acting_user=None)  # the operator
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"Campaign #{found.pk}: {len(run_ids)} failed run(s) queued again.")
        if run_ids:
            progress = wait_with_local_worker(found, line_writer(sys.stdout), "retry", concurrency,
                                              start=not no_worker)
            self.stdout.write(f"\n{progress['counts']}")
