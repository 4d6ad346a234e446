from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from evaluation.actions import do_publish_evaluation
from evaluation.models import Device, Evaluation
from evaluation.published import PUBLISHED_DIR
from evaluation.results_doc import render, results_page


class Command(BaseCommand):
    help = ("Publish a stored evaluation: name it by its published ID and write the snapshot that ships with the app "
            "(evaluation/published/, loaded by load_results and the quickstart), and docs/results.md from the same "
            "data.")

    def add_arguments(self, parser):
        parser.add_argument("evaluation", type=int, nargs="?",
                            help="the evaluation's number here (default: the latest CPU one)")
        parser.add_argument("--directory", default=str(PUBLISHED_DIR), help="where the snapshot goes")
        parser.add_argument("--results", help="where to write the results page ('' to skip; default "
                                              "docs/results.md, docs/results-gpu.md for a GPU evaluation)")

    def handle(self, *args, evaluation, directory, results, **options):
        stored = (Evaluation.objects.filter(pk=evaluation) if evaluation is not None
                  else Evaluation.objects.filter(device=Device.CPU)).first()
        if stored is None:
            raise CommandError(f"No evaluation #{evaluation}." if evaluation is not None else
                               "No stored evaluation: run manage.py evaluate first.")
        try:
            path = do_publish_evaluation(stored, Path(directory), acting_user=None)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"Evaluation #{stored.pk} published as {stored.published_id}: {path} "
                          f"({path.stat().st_size / 1e6:.1f} MB)")
        results = str(results_page(stored.device)) if results is None else results
        if results:
            Path(results).write_text(render(stored), encoding="utf-8")
            self.stdout.write(f"Wrote {results}")
