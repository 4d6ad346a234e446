"""Fill the configured database with a synthetic run history, to measure the dashboard at scale.

    .venv/bin/python manage.py load_catalog
    .venv/bin/python manage.py seed_history --runs 100000 --alarms 1000000

Everything it makes is marked synthetic (devtools/synthetic.py); it refuses a database that already
has runs unless --force, so that it is never mixed into measured data by accident.
"""
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from devtools.synthetic import seed_history
from runners.models import Run


class Command(BaseCommand):
    help = "Create a synthetic history (campaigns, runs, alarms, stability checks) on top of the loaded catalog."

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, default=100_000)
        parser.add_argument("--alarms", type=int, default=1_000_000)
        parser.add_argument("--campaigns", type=int, default=None, help="default: one per 2,500 runs")
        parser.add_argument("--seed", type=int, default=0, help="random seed (the same seed makes the same history)")
        parser.add_argument("--no-evaluation", action="store_true", help="do not store a synthetic evaluation")
        parser.add_argument("--force", action="store_true", help="add to a database that already has runs")

    def handle(self, *args, **options):
        if options["runs"] < 1 or options["alarms"] < 0:
            raise CommandError("--runs must be positive and --alarms not negative")
        existing = Run.objects.count()
        if existing and not options["force"]:
            raise CommandError(f"the database already has {existing} runs; seed_history adds synthetic data only to "
                               f"an empty history (use --force to add to it anyway)")
        started = time.perf_counter()
        self.stdout.write(f"Seeding {connection.vendor} database {connection.settings_dict['NAME']}: "
                          f"{options['runs']} runs, {options['alarms']} alarms")
        try:
            made = seed_history(runs=options["runs"], alarms=options["alarms"], campaigns=options["campaigns"],
                                seed=options["seed"], evaluation=not options["no_evaluation"],
                                log=self.stdout.write)
        except ValueError as error:
            raise CommandError(str(error)) from error
        for line in made.lines():
            self.stdout.write(line)
        self.stdout.write(self.style.SUCCESS(f"Done in {time.perf_counter() - started:.1f} s."))
