"""Repair what the broker lost or a dead worker left behind (runners/reconciler.py)."""
import time

from django.core.management.base import BaseCommand
from django.db import DatabaseError, connection

from runners.reconciler import reconcile


class Command(BaseCommand):
    help = ("Queue again the runs of vanished workers, enqueue queued runs the broker lost, fail runs "
            "nobody can serve and complete finished campaigns. Once, or every --every seconds.")

    def add_arguments(self, parser):
        parser.add_argument("--every", type=float, default=0,
                            help="Repeat every so many seconds until stopped (default: once).")
        parser.add_argument("--once", action="store_true", help="One pass, then exit (the default).")

    def handle(self, every, once, **options):
        while True:
            try:
                repaired = reconcile()
                summary = ", ".join(f"{what.replace('_', ' ')} {len(ids)}" for what, ids in repaired.items())
                self.stdout.write(f"reconciled: {summary}")
            except Exception as error:  # the database or the broker is away: try again next time
                if once or not every:
                    raise
                self.stderr.write(f"reconcile failed, trying again in {every:g} s: {error!r}")
                if isinstance(error, DatabaseError):
                    connection.close()
            if once or not every:
                return
            time.sleep(every)
