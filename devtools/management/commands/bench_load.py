"""Load benchmark (issue 6), two parts; prints Markdown tables, never asserts.

**Pages**: gunicorn on a free loopback port over the configured database, started with the web image's
docker/gunicorn.conf.py (``--worker-class``, ``--gunicorn-workers`` and ``--threads`` override it), or
--base-url for a server already running on it; ``--concurrency`` client threads per endpoint for
``--duration`` seconds each: p50/p95 latency and throughput of the catalog, a bug page, results, the
leaderboard, campaigns, the API and the exports. Meant for PostgreSQL with a synthetic history:

    createdb -h 127.0.0.1 -U postgres -T silentbench_scale silentbench_load   # 100k runs, 1M alarms
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/silentbench_load \\
        .venv/bin/python manage.py bench_load --pages --concurrency 16 --duration 10

(``silentbench_scale`` is made as in docs/performance.md: migrate, load_catalog, seed_history.)

**Runs**: ``manage.py bench_runs --throughput N --workers W`` in a subprocess, on a separate small
database and a Redis broker (queued-to-started latency, runs per minute, ratio to running the same
reproducers directly):

    createdb -h 127.0.0.1 -U postgres silentbench_load_runs
    .venv/bin/python manage.py bench_load --runs \\
        --runs-database-url postgres://postgres@127.0.0.1:5432/silentbench_load_runs \\
        --broker-url redis://127.0.0.1:6379/9 --throughput 40 --workers 2

No part given: both.
"""
import os
import re
import subprocess
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from core.cli import positive_int
from devtools.loadbench import GUNICORN_CONFIG, endpoints, gunicorn, gunicorn_settings, hammer
from runners.models import Alarm, Run
from runners.worker.local import database_url


class Command(BaseCommand):
    help = "Latency and throughput of the pages under concurrent clients, and of runs through the broker."

    def add_arguments(self, parser):
        parser.add_argument("--pages", action="store_true", help="only the pages part")
        parser.add_argument("--runs", action="store_true", help="only the runs part")
        pages = parser.add_argument_group("pages")
        pages.add_argument("--concurrency", type=int, default=16, help="client threads per endpoint")
        pages.add_argument("--duration", type=float, default=10.0, help="seconds per endpoint")
        pages.add_argument("--requests", type=int, default=10_000, help="at most this many requests per endpoint")
        pages.add_argument("--warmup", type=int, default=2,
                           help="untimed requests per client first, all clients at once (so that every gunicorn "
                                "process has served the endpoint: imports, per-process state)")
        pages.add_argument("--worker-class", choices=["sync", "gthread"],
                           help="gunicorn's worker class (default: docker/gunicorn.conf.py's)")
        pages.add_argument("--gunicorn-workers", type=positive_int, help="processes (default: the config file's)")
        pages.add_argument("--threads", type=positive_int, help="threads per process (default: the config file's)")
        pages.add_argument("--base-url", help="measure this running server instead of starting gunicorn "
                                              "(it must serve the configured database; its throttles apply)")
        pages.add_argument("--only", default="", help="only endpoints whose label contains this text")
        runs = parser.add_argument_group("runs")
        runs.add_argument("--runs-database-url", help="a separate small database for the runs part (bench_runs "
                                                      "migrates it and loads the catalog); default: the configured one")
        runs.add_argument("--broker-url", default=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/9"))
        runs.add_argument("--throughput", type=int, default=40, help="runs through the broker (and directly)")
        runs.add_argument("--workers", type=int, default=2, help="local worker processes (and direct threads)")
        runs.add_argument("--idle", type=int, default=5, help="single runs timed queued->started, idle worker")
        runs.add_argument("--bugs", default="TE-1047,PT-124357", help="reproducers to run (the fastest CPU ones)")

    def handle(self, *args, **options):
        both = not options["pages"] and not options["runs"]
        if options["pages"] or both:
            self.pages(options)
        if options["runs"] or both:
            self.runs(options)

    def pages(self, options):
        runs, alarms = Run.objects.count(), Alarm.objects.count()
        load = os.getloadavg()
        self.stdout.write(f"Database: {connection.vendor} {connection.settings_dict['NAME']}: {runs} runs, "
                          f"{alarms} alarms. {os.cpu_count()} CPUs, load average before "
                          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.")
        listed = [(label, path) for label, path in endpoints() if options["only"] in label]
        logs = settings.VAR_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if options["base_url"]:
            self.measure(options["base_url"].rstrip("/"), listed, options)
        else:
            worker_class, workers, threads = gunicorn_settings(
                options["worker_class"], options["gunicorn_workers"], options["threads"])
            with gunicorn(database_url(connection.settings_dict), workers, logs / "bench-load-gunicorn.log",
                          worker_class=worker_class, threads=threads) as base:
                self.stdout.write(f"gunicorn --config {GUNICORN_CONFIG}: {worker_class}, {workers} processes x "
                                  f"{threads} threads, {base} (anonymous API throttle lifted); cache: "
                                  f"{settings.CACHES['default']['BACKEND'].rsplit('.', 1)[-1]}")
                self.measure(base, listed, options)
        load = os.getloadavg()
        self.stdout.write(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    def measure(self, base, listed, options):
        concurrency, duration = options["concurrency"], options["duration"]
        self.stdout.write(f"{concurrency} concurrent clients per endpoint, {duration:g} s each (at most "
                          f"{options['requests']} requests), after {options['warmup']} warm-up requests per client; "
                          f"each client keeps its connection while the server keeps it open.\n")
        self.stdout.write("| endpoint | path | requests | p50 ms | p95 ms | req/s | KiB | non-200 |")
        self.stdout.write("|---|---|---:|---:|---:|---:|---:|---|")
        for label, path in listed:
            hammer(base, path, concurrency, duration=float("inf"), max_requests=options["warmup"] * concurrency)
            row = hammer(base, path, concurrency, duration, options["requests"]).row()
            self.stdout.write(f"| {label} | `{path}` | {row['requests']} | {row['p50']:.0f} | {row['p95']:.0f} | "
                              f"{row['rps']:.1f} | {row['kib']:.0f} | {row['other']} |")

    def runs(self, options):
        """bench_runs in a subprocess, so that it has its own database and broker settings."""
        env = {**os.environ, "CELERY_BROKER_URL": options["broker_url"],
               "DATABASE_URL": options["runs_database_url"] or database_url(connection.settings_dict)}
        argv = [sys.executable, "manage.py", "bench_runs", "--throughput", str(options["throughput"]),
                "--workers", str(options["workers"]), "--idle", str(options["idle"]), "--bugs", options["bugs"]]
        shown = {name: re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", env[name])  # no password in the output
                 for name in ("CELERY_BROKER_URL", "DATABASE_URL")}
        self.stdout.write(f"\n$ CELERY_BROKER_URL={shown['CELERY_BROKER_URL']} DATABASE_URL={shown['DATABASE_URL']} "
                          f"{' '.join(argv[1:])}")
        self.stdout.flush()
        if subprocess.run(argv, cwd=settings.BASE_DIR, env=env).returncode:
            raise CommandError("bench_runs failed")
