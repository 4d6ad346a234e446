"""The Celery app. Brokers are transport only: PostgreSQL (or SQLite) holds every run's state."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmark_site.settings")

app = Celery("silentbench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
