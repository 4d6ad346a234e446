from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluation.methodology import markdown_document

DOCUMENT = Path(settings.BASE_DIR) / "docs" / "methodology.md"


class Command(BaseCommand):
    help = ("Write docs/methodology.md from the code's own definitions (evaluation.methodology: the metric "
            "docstrings, the detector registry's descriptions, ...), the same text as the /methodology/ page.")

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true",
                            help="write nothing; fail when docs/methodology.md is not what the code says")

    def handle(self, *args, **options):
        text = markdown_document()
        if options["check"]:
            if DOCUMENT.read_text(encoding="utf-8") != text:
                raise CommandError("docs/methodology.md is out of date: run manage.py methodology")
            return
        DOCUMENT.write_text(text, encoding="utf-8")
        self.stdout.write(f"Wrote {DOCUMENT}")
