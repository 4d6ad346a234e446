"""Benchmark: SQL queries and render time of the dashboard's pages on the configured database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/silentbench_scale .venv/bin/python manage.py bench_pages

Each page is requested in-process with django.test.Client (the whole middleware stack, no network):
two warm-up requests, one under CaptureQueriesContext for the query count, then --repeat timed
requests (median and p95). Prints a Markdown table; never asserts.
"""
import statistics
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection
from django.db.models import Count
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bugs.models import Bug, Reproducer, ReproducerVersion
from devtools.loadbench import percentile
from evaluation.models import Evaluation
from runners.models import Alarm, Campaign, Environment, Run, StabilityCheck


def pages():
    """(label, URL) of every page measured, picked for the most runs where there is a choice."""
    listed = [("landing", "/"), ("catalog", "/catalog/"),
              ("catalog, filtered", "/catalog/?status=verified&framework=pytorch")]
    busiest = (Run.objects.filter(reproducer_version__reproducer__bug__isnull=False)
               .values("reproducer_version__reproducer__bug__bug_id").annotate(n=Count("id")).order_by("-n").first())
    if busiest:
        bug_id = busiest["reproducer_version__reproducer__bug__bug_id"]
        listed.append((f"bug page ({bug_id}, {busiest['n']} runs)", f"/bugs/{bug_id}/"))
    elif bug := Bug.objects.first():
        listed.append((f"bug page ({bug.bug_id})", bug.get_absolute_url()))
    listed.append(("results (latest evaluation)" if Evaluation.objects.exists() else "results (all runs)",
                   "/results/"))
    listed.append(("leaderboard", "/leaderboard/"))
    largest = (Run.objects.filter(campaign__isnull=False).values("campaign").annotate(n=Count("id"))
               .order_by("-n").first())
    if largest:
        pk, n = largest["campaign"], largest["n"]
        listed.append((f"results ?campaign= (live, {n} runs)", f"/results/?campaign={pk}"))
    listed.append(("campaign list", "/campaigns/"))
    if largest:
        listed += [(f"campaign detail ({n} runs)", f"/campaigns/{pk}/"),
                   ("campaign detail, page 2", f"/campaigns/{pk}/?page=2")]
    listed += [("API run list", "/api/runs/"),
               ("API run list, filtered", "/api/runs/?status=failed&variant=buggy&detector__name=nan_inf")]
    oldest = Campaign.objects.order_by("created_at", "id").values_list("pk", flat=True).first()
    if oldest is not None:  # its runs are the oldest: newest first, every newer run comes before them by ID
        listed.append(("API run list, the oldest campaign", f"/api/runs/?campaign={oldest}"))
    alarm = Alarm.objects.order_by("-run_id").values("run_id").first()
    run_id = alarm["run_id"] if alarm else Run.objects.order_by("-id").values_list("id", flat=True).first()
    if run_id:
        listed += [("run detail (with alarms)", f"/runs/{run_id}/"), ("API run detail", f"/api/runs/{run_id}/")]
    return listed


def measure(client, url, repeat):
    for _ in range(2):
        response = client.get(url)
    with CaptureQueriesContext(connection) as context:
        response = client.get(url)
    queries = list(context.captured_queries)  # now: the next request resets the connection's query log
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(url)
        times.append(1000 * (time.perf_counter() - started))
    return {"status": response.status_code, "queries": len(queries), "bytes": len(response.content),
            "median": statistics.median(times), "p95": percentile(times, 0.95),
            "slowest_query": max(queries, key=lambda q: float(q["time"]), default=None)}


class Command(BaseCommand):
    help = "Print the SQL query count and median / p95 render time of the dashboard's main pages."

    def add_arguments(self, parser):
        parser.add_argument("--repeat", type=int, default=20, help="timed requests per page")
        parser.add_argument("--slow-queries", action="store_true", help="also print each page's slowest query")
        parser.add_argument("--only", default="", help="measure only pages whose label contains this text")

    def handle(self, *args, **options):
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
        counts = {model.__name__: model.objects.count() for model in
                  (Bug, Reproducer, ReproducerVersion, StabilityCheck, Environment, Campaign, Run, Alarm, Evaluation)}
        with connection.cursor() as cursor:
            version = connection.pg_version if connection.vendor == "postgresql" else cursor.connection.execute(
                "select sqlite_version()").fetchone()[0] if connection.vendor == "sqlite" else ""
        self.stdout.write(f"Database: {connection.vendor} {version}, {connection.settings_dict['NAME']}")
        self.stdout.write("Rows: " + ", ".join(f"{n} {name}" for name, n in counts.items()))
        self.stdout.write(f"{options['repeat']} timed requests per page after 2 warm-ups, django.test.Client "
                          f"in-process; queries counted on one request.\n")
        self.stdout.write("| page | URL | status | queries | median ms | p95 ms | KiB |")
        self.stdout.write("|---|---|---:|---:|---:|---:|---:|")
        client = Client()
        slow = []
        for label, url in pages():
            if options["only"] not in label:
                continue
            result = measure(client, url, options["repeat"])
            self.stdout.write(f"| {label} | `{url}` | {result['status']} | {result['queries']} | "
                              f"{result['median']:.1f} | {result['p95']:.1f} | {result['bytes'] / 1024:.0f} |")
            if result["slowest_query"]:
                slow.append((label, result["slowest_query"]))
        if options["slow_queries"]:
            for label, query in slow:
                self.stdout.write(f"\n{label}: slowest query {float(query['time']) * 1000:.1f} ms\n  "
                                  f"{query['sql'][:600]}")
