"""Print the queues this host can serve, for `celery worker -Q $(python manage.py worker_queues)`.

The same rule as `celery worker -Q auto` (runners.environments.routing.queues_for_worker); --verbosity 2 also
shows the capabilities it read (nvidia-smi, memory, CUDA, torch)."""
import json

from django.core.management.base import BaseCommand

from runners.environments.host import host_capabilities
from runners.environments.routing import queues_for_worker


class Command(BaseCommand):
    help = "Print the comma-separated Celery queues this host's GPUs can serve."

    def add_arguments(self, parser):
        parser.add_argument("--no-cpu", action="store_true", help="leave CPU runs to other workers")

    def handle(self, *args, no_cpu=False, verbosity=1, **options):
        capabilities = host_capabilities()
        if verbosity > 1:
            self.stderr.write(json.dumps({key: capabilities[key] for key in ("gpus", "memory_mb", "cuda", "torch")},
                                         indent=2))
        self.stdout.write(",".join(queues_for_worker(capabilities, cpu=not no_cpu)))
