"""The Celery app. Brokers are transport only: PostgreSQL (or SQLite) holds every run's state."""
import os

from celery import Celery
from celery.signals import celeryd_after_setup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmark_site.settings")

app = Celery("silentbench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_after_setup.connect
def consume_auto_queues(sender, instance, **kwargs):
    """``-Q auto`` derives the queues from the host's GPUs; connected here, before any task module loads."""
    from runners.tasks import consume_auto_queues

    consume_auto_queues(instance)
