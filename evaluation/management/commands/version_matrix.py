from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from core.cli import comma_list, positive_int
from evaluation.actions import do_create_version_matrix
from runners.bisection import release_environment, release_key
from runners.environments.python_environments import EnvironmentBuildError
from runners.selectors import live_workers, runnable_versions


class Command(BaseCommand):
    help = ("Queue the version matrix: every CPU bug reproducer, buggy and fixed, without a detector (plain), over "
            "seeds 0..N-1, in the environment of each torch release (built here with uv unless already recorded: "
            "runners.environments). Workers that serve those environments (SILENTBENCH_WORKER_ENVIRONMENTS) run it; "
            "/results/versions/, `manage.py export versions` and `manage.py versions_doc` read it.")

    def add_arguments(self, parser):
        parser.add_argument("--releases", type=comma_list, required=True,
                            help="torch releases, comma-separated, e.g. 2.11.0,2.13.0,2.15.0")
        parser.add_argument("--seeds", type=positive_int, default=3, help="seeds 0..N-1 (default 3)")
        parser.add_argument("--steps", type=positive_int, help="training steps (default: each reproducer's)")

    def handle(self, *args, **options):
        try:
            releases = sorted(dict.fromkeys(options["releases"]), key=release_key)
        except ValueError as error:
            raise CommandError(str(error)) from error
        versions = runnable_versions()  # of several environments of a release, the one most of them run in
        environments = []
        for release in releases:
            try:
                environment = release_environment(release, versions)
            except (ValueError, EnvironmentBuildError) as error:
                raise CommandError(f"torch {release}: {error}") from error
            self.stdout.write(f"torch {release}: environment {environment.name}")
            environments.append(environment)
        try:
            campaign = do_create_version_matrix(environments, range(options["seeds"]), options["steps"],
                                                acting_user=None)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"Queued campaign #{campaign.pk} ({campaign.name}): {campaign.runs.count()} runs.")
        served = {queue for queues in live_workers().values_list("queues", flat=True) for queue in queues}
        waiting = sorted(set(campaign.runs.values_list("queue", flat=True)) - served)
        if waiting:
            self.stdout.write(self.style.WARNING(
                f"No live worker consumes {', '.join(waiting)} yet: start workers that serve these environments "
                f"(SILENTBENCH_WORKER_ENVIRONMENTS), or the runs will be failed as unservable."))
