"""Health endpoints for the load balancer, compose and monitoring (docs/operations.md).

``/healthz``: the process serves requests and reaches the database (liveness; cheap enough to poll).
``/healthz/ready``: also no unapplied migrations and the broker answers, i.e. this node can take
traffic after an upgrade. Both answer 200 or 503 with a small JSON body, never a page that could
itself fail, and need no session or login.
"""
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe


def check_database():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return "ok"


def check_migrations():
    executor = MigrationExecutor(connection)
    pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return "ok" if not pending else f"{len(pending)} unapplied migration(s)"


def check_broker():
    from benchmark_site.celery import app

    with app.connection_for_write() as broker:
        broker.ensure_connection(max_retries=1, timeout=2)
    return "ok"


def _report(checks):
    results, healthy = {}, True
    for name, check in checks:
        try:
            results[name] = check()
        except Exception as error:  # noqa: BLE001 - a health check reports (the type only, no details), never raises
            results[name] = f"error: {type(error).__name__}"
        healthy = healthy and results[name] == "ok"
    if not healthy and connection.connection is not None:
        connection.close_if_unusable_or_obsolete()
    return JsonResponse({"status": "ok" if healthy else "unavailable", **results}, status=200 if healthy else 503)


@never_cache
@require_safe
def healthz(request):
    return _report([("database", check_database)])


@never_cache
@require_safe
def ready(request):
    checks = [("database", check_database), ("migrations", check_migrations)]
    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        checks.append(("broker", check_broker))
    return _report(checks)
