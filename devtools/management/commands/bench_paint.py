"""First paint of the landing page, the catalog, the leaderboard, results, methodology, a bug page, a detector page
and a run page, each opened --repeat times in a fresh browser context (empty cache), as a first visit (issue 16).
Prints a Markdown table of first paint, first contentful paint, DOMContentLoaded and load (median / max ms) and the
bytes transferred; never asserts.

    SILENTBENCH_VAR_DIR=/tmp/var-paint .venv/bin/python manage.py bench_paint

gunicorn is started on a free loopback port over the configured database (as bench_load does), or
--base-url names a server already running on it, e.g. an older checkout's for a before/after comparison.
Needs the test extra (playwright) and Chromium, as the browser tests do.
"""
import os

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection

from devtools.browser import VIEWPORT, launch
from devtools.loadbench import gunicorn
from devtools.pages import first_visit_pages
from devtools.paint import measure, paint_table
from evaluation.models import Evaluation
from runners.models import Alarm, Run
from runners.worker.local import database_url


class Command(BaseCommand):
    help = "First paint, DOMContentLoaded and load of the main pages in a fresh browser, and the bytes they transfer."

    def add_arguments(self, parser):
        parser.add_argument("--repeat", type=int, default=5, help="timed loads per page, each in a fresh context")
        parser.add_argument("--warmup", type=int, default=2, help="untimed loads per page first")
        parser.add_argument("--width", type=int, default=VIEWPORT["width"], help="viewport width in px")
        parser.add_argument("--gunicorn-workers", type=int, default=2)
        parser.add_argument("--base-url", help="measure this running server instead of starting gunicorn "
                                               "(it must serve the configured database)")
        parser.add_argument("--only", default="", help="only pages whose label contains this text")

    def handle(self, *args, **options):
        listed = [(label, path) for label, path in first_visit_pages() if options["only"] in label]
        load = os.getloadavg()
        self.stdout.write(f"Database: {connection.vendor} {connection.settings_dict['NAME']}: "
                          f"{Run.objects.count()} runs, {Alarm.objects.count()} alarms, "
                          f"{Evaluation.objects.count()} evaluation(s). {os.cpu_count()} CPUs, load average before "
                          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.")
        if options["base_url"]:
            self.stdout.write(f"Server: {options['base_url']}")
            self.measure(options["base_url"].rstrip("/"), listed, options)
        else:
            logs = settings.VAR_DIR / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            workers = options["gunicorn_workers"]
            with gunicorn(database_url(connection.settings_dict), workers, logs / "bench-paint-gunicorn.log") as base:
                self.stdout.write(f"Server: gunicorn, {workers} sync workers, {base}")
                self.measure(base, listed, options)
        load = os.getloadavg()
        self.stdout.write(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    def measure(self, base_url, listed, options):
        from playwright.sync_api import sync_playwright  # a test dependency, like the browser it drives

        viewport = {**VIEWPORT, "width": options["width"]}
        with sync_playwright() as playwright:
            browser = launch(playwright)
            self.stdout.write(f"Chromium {browser.version}, headless, {viewport['width']}x{viewport['height']}; "
                              f"{options['warmup']} untimed and {options['repeat']} timed loads per page, "
                              f"each in a new context (empty cache).\n")
            measured = measure(browser, base_url, listed, viewport, options["repeat"], options["warmup"])
            browser.close()
        for line in paint_table(measured):
            self.stdout.write(line)
