"""The Celery app. Brokers are transport only: PostgreSQL (or SQLite) holds every run's state."""
import os

from celery import Celery
from celery.signals import celeryd_after_setup, worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmark_site.settings")

app = Celery("silentbench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_after_setup.connect
def consume_auto_queues(sender, instance, **kwargs):
    """``-Q auto`` derives the queues from the host's GPUs; connected here, before any task module loads."""
    from runners.tasks import consume_auto_queues

    consume_auto_queues(instance)


@worker_init.connect
def hide_worker_from_reproducers(**kwargs):
    """The main process too, before it forks its pool: its environment holds the same secrets."""
    from runners.sandbox import hide_from_reproducers

    hide_from_reproducers()
