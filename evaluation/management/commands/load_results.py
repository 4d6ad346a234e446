from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evaluation.actions import do_load_published_evaluation
from evaluation.published import PUBLISHED_DIR, SnapshotError, published_snapshots, read_snapshot


class Command(BaseCommand):
    help = ("Load the published evaluations that ship with the app (evaluation/published/*.json.gz) after "
            "load_catalog: their runs, tables and stability checks. Loading one again changes nothing.")

    def add_arguments(self, parser):
        parser.add_argument("snapshots", nargs="*", help="snapshot files (default: every one that ships)")

    def handle(self, *args, snapshots, **options):
        paths = [Path(path) for path in snapshots] or published_snapshots(PUBLISHED_DIR)
        if not paths:
            self.stdout.write(f"No published evaluation in {PUBLISHED_DIR}.")
        for path in paths:
            try:
                evaluation, loaded = do_load_published_evaluation(read_snapshot(path), acting_user=None)
            except (OSError, SnapshotError) as error:
                raise CommandError(str(error)) from error
            except (KeyError, IndexError, TypeError, ValueError) as error:  # a snapshot edited by hand
                raise CommandError(f"{path.name}: a malformed snapshot ({type(error).__name__}: {error}); "
                                   "nothing of it was loaded") from error
            runs = evaluation.parameters.get("runs", "?")
            self.stdout.write(f"Published evaluation {evaluation.published_id}: "
                              f"{'loaded' if loaded else 'already here'} (evaluation #{evaluation.pk}, {runs} runs).")
