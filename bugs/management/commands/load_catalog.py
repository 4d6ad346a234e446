from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from bugs.catalog import do_load_catalog


class Command(BaseCommand):
    help = "Load catalog/<BUG-ID>/bug.yaml and reproducer folders. Idempotent; changed code becomes a new version."

    def add_arguments(self, parser):
        parser.add_argument("--path", default=str(settings.SILENTBENCH_CATALOG_DIR))

    def handle(self, *args, path, **options):
        try:
            summary = do_load_catalog(path)
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from error
        self.stdout.write(self.style.SUCCESS(f"Catalog loaded from {path}: {summary}"))
        for version in summary.versions_created:
            self.stdout.write(f"  new version: {version}")
