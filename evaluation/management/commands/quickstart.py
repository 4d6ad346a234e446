import os
import socket
import subprocess
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core.cli import comma_list, int_list, line_writer, positive_int
from core.enums import Variant
from evaluation.tables import cell_text, detection_table
from runners.cli import create_campaign_from_options
from runners.detectors import all_plugins
from runners.models import RunStatus
from runners.progress import wait_for_campaign
from runners.worker.local import local_worker, log_tail, stop_process


class Command(BaseCommand):
    help = ("The main job on one machine: migrate, load the catalog and the published results, run every CPU "
            "reproducer under every detector (buggy and fixed) through a local Celery worker, and serve the "
            "dashboard.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--seeds", type=int_list, default=[0], help="comma-separated seeds (default 0)")
        parser.add_argument("--bugs", type=comma_list, help="comma-separated bug IDs (default: every runnable bug)")
        parser.add_argument("--detectors", type=comma_list,
                            help="comma-separated detector names (default: every detector without a fit phase "
                                 "but the practitioners' rules and the shadows, which evaluate runs; TrainCheck fits "
                                 "for minutes and runs ~6x slower: add any by name, or use evaluate)")
        parser.add_argument("--no-serve", action="store_true", help="stop once the campaign has finished")
        parser.add_argument("--concurrency", type=positive_int, default=os.cpu_count() or 1,
                            help="runs at a time (default: one per core)")

    def handle(self, *args, port, seeds, bugs, detectors, no_serve, concurrency, **options):
        if not no_serve:
            self.check_port_free(port)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("load_catalog")
        try:  # the published numbers, shown before this machine's own campaign ends
            call_command("load_results")
        except CommandError as error:  # a snapshot for another catalog: this machine's own runs still come
            self.stderr.write(f"The published results were not loaded: {error}")
        logs = settings.VAR_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise serves from it (and the finders)
        web = None
        try:
            # Each slot holds its next run and starts it as soon as its last one ends, instead of at the broker's
            # next read of its queue folder (every 0.1 s: 17 s of the matrix). The worker is the only one on this
            # broker; should it die, the quickstart stops. The run it was running is queued again as the next worker
            # starts; the runs it held, at a worker's start once they have waited for a message longer than
            # SILENTBENCH_REQUEUE_QUEUED_AFTER_SECONDS (runners.reconciler).
            with local_worker(logs / "worker.log", concurrency=concurrency, prefetch_multiplier=2) as worker:
                if not no_serve:
                    web = subprocess.Popen(
                        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
                        cwd=settings.BASE_DIR, stdout=open(logs / "web.log", "ab"), stderr=subprocess.STDOUT,
                        start_new_session=True)
                    self.stdout.write(f"Dashboard: http://127.0.0.1:{port}/ (live progress under /campaigns/)")
                campaign = create_campaign_from_options({
                    "name": "quickstart", "bugs": bugs, "variants": Variant.values,
                    "detectors": detectors or [name for name, plugin in all_plugins().items()
                                               if not plugin.needs_fit and plugin.in_quickstart],
                    "seeds": seeds, "steps": None,
                })
                self.stdout.write(f"Campaign #{campaign.pk}: {campaign.runs.count()} runs queued on the local worker.")
                progress = wait_for_campaign(campaign, line_writer(sys.stdout),
                                             watchdog=lambda: self.check_alive(worker, logs))
                self.report(campaign, progress)
                if web is not None:
                    self.stdout.write(self.style.SUCCESS(
                        f"Serving http://127.0.0.1:{port}/ — results at /results/. Ctrl-C stops."))
                    web.wait()
        except KeyboardInterrupt:
            self.stdout.write("Stopping.")
        finally:
            if web is not None:
                stop_process(web)

    def check_port_free(self, port):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                raise CommandError(f"Port {port} is in use; choose another with --port.")

    def check_alive(self, worker, logs):
        if worker.poll() is not None:
            raise CommandError(f"The local worker exited (code {worker.returncode}):\n{log_tail(logs / 'worker.log')}")

    def report(self, campaign, progress):
        table = detection_table(campaign.runs.all())
        self.stdout.write("\nDetection matrix (outcome, detected buggy runs / buggy runs; =fixed: the same alarm on "
                          "the fixed variant; no fixed twin: the fixed run of that seed did not succeed; FA: a false "
                          "alarm):")
        if not table.empty:
            view = table.assign(cell=[f"{cell['outcome']} {cell_text(cell)}" for cell in table.to_dict("records")])
            self.stdout.write(view.pivot(index="bug", columns="detector", values="cell").to_string())
        failed = campaign.runs.filter(status=RunStatus.FAILED)
        for run in failed:
            self.stdout.write(self.style.ERROR(f"run {run.pk} failed: {run.failure_reason}"))
        self.stdout.write(f"{progress['done']}/{progress['total']} runs finished, {failed.count()} failed.")
        if failed.exists():
            raise CommandError("Some runs failed; see the reasons above and the run pages.")
