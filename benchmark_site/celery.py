"""The Celery app. Brokers are transport only: PostgreSQL (or SQLite) holds every run's state."""
import os
from pathlib import Path

from celery import Celery
from celery.signals import celeryd_after_setup, worker_init, worker_process_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmark_site.settings")

app = Celery("silentbench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

BROKER_FOLDERS = ("data_folder_in", "data_folder_out", "processed_folder", "control_folder")


def ensure_broker_folders(broker_url, transport_options):
    """The filesystem broker's folders (the embedded default); kombu makes none but the control folder, and
    not its parents. Called as the app is configured (in a producer, and in a worker as it starts), before
    anything sends or consumes; not when the settings are read. Any other broker: nothing."""
    if not (broker_url or "").startswith("filesystem://"):
        return
    for key in BROKER_FOLDERS:
        if (transport_options or {}).get(key):
            Path(transport_options[key]).mkdir(parents=True, exist_ok=True)


@app.on_after_configure.connect
def make_broker_folders(sender, source, **kwargs):
    """The configuration is read on first use (a task sent, a worker started, a connection opened)."""
    ensure_broker_folders(source.broker_url, source.broker_transport_options)


# A worker's start (runners.worker.startup). The handlers import it when they run: this module is imported before
# Django is set up.

@celeryd_after_setup.connect
def consume_auto_queues(sender, instance, **kwargs):
    """``-Q auto`` derives the queues from the host's GPUs; connected here, before any task module loads."""
    from runners.worker.startup import consume_auto_queues

    consume_auto_queues(instance)


@celeryd_after_setup.connect
def share_cores(sender, instance, **kwargs):
    """Each run's CPU threads: the host's cores shared among the worker's concurrent runs."""
    from runners.worker.startup import share_cores

    share_cores(instance)


@worker_init.connect
def hide_worker_from_reproducers(**kwargs):
    """The main process too, before it forks its pool: its environment holds the same secrets."""
    from runners.executor import hide_from_reproducers

    hide_from_reproducers()


@worker_process_init.connect
def start_zygote(**kwargs):
    """Each pool process starts its zygote at once, so that its first run does not wait for torch's import."""
    from runners.worker.startup import start_zygote

    start_zygote()


@worker_ready.connect
def register_worker(sender, **kwargs):
    """The worker records itself and what its host offers. Connected before the next handler, which Celery calls
    even if this one raises (the database away at start)."""
    from runners.worker.startup import register_worker

    register_worker(sender)


@worker_ready.connect
def reconcile_and_beat(sender, **kwargs):
    """The worker repairs what its previous life left running, and keeps its heartbeat."""
    from runners.worker.startup import reconcile_and_beat

    reconcile_and_beat(sender)
