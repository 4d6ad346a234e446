from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from sensitivity.actions import do_load_mutants
from sensitivity.mutants import SpecError


class Command(BaseCommand):
    help = ("Load the sensitivity track's mutants (sensitivity/spec.yaml) as reproducers of their own track, after "
            "load_catalog. Idempotent; changed code becomes a new version.")

    def add_arguments(self, parser):
        parser.add_argument("--path", default=str(settings.SILENTBENCH_CATALOG_DIR),
                            help="the catalog whose clean pipelines are mutated")

    def handle(self, *args, path, **options):
        try:
            summary = do_load_mutants(path)
        except (SpecError, ValueError) as error:
            raise CommandError(str(error)) from error
        self.stdout.write(self.style.SUCCESS(f"Mutants loaded: {summary}"))
