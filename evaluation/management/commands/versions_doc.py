from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.http import QueryDict

from evaluation.results import NotFound
from evaluation.versions_doc import render


class Command(BaseCommand):
    help = ("Write docs/versions.md from the stored runs of the newest version-matrix campaign (or --campaign, "
            "repeatable): the bug x torch release matrix, the flips and the bisections.")

    def add_arguments(self, parser):
        parser.add_argument("--campaign", type=int, action="append", help="a version-matrix campaign's ID")
        parser.add_argument("--output", default=str(settings.BASE_DIR / "docs" / "versions.md"))

    def handle(self, *args, **options):
        query = QueryDict(mutable=True)
        query.setlist("campaign", [str(pk) for pk in options["campaign"] or []])
        try:
            text = render(query)
        except NotFound as error:
            raise CommandError(str(error)) from error
        with open(options["output"], "w", encoding="utf-8") as output:
            output.write(text)
        self.stdout.write(f"Wrote {options['output']}.")
