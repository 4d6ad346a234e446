"""Workers, as named actions: a worker registers as it starts, says it is alive, and records the host a run ran on."""
import socket
from collections.abc import Iterable

from django.conf import settings
from django.utils import timezone

from ..environments.host import host_capabilities
from ..environments.python_environments import facts_in
from ..models import Environment, PythonEnvironment, Worker


def do_register_worker(name: str, queues: Iterable[str], concurrency: int = 1,
                       gpu_checks: list[dict] | None = None) -> Worker:
    """Record a worker as it starts: the queues it consumes, what its host can serve and how its GPUs' self-check
    went (runners.environments.gpu_check), with how many runs may share each of its GPUs (runs_per_gpu)."""
    capabilities = {**host_capabilities(), "runs_per_gpu": settings.SILENTBENCH_RUNS_PER_GPU}
    gpus = capabilities["gpus"]
    now = timezone.now()
    worker, _ = Worker.objects.update_or_create(hostname=name, defaults={
        "queues": list(queues), "capabilities": capabilities, "concurrency": concurrency,
        "last_seen": now, "registered_at": now, "gpu_count": len(gpus),
        "gpu_model": ", ".join(dict.fromkeys(gpu["name"] for gpu in gpus)),
        "gpu_memory_mb": min((gpu["memory_mb"] for gpu in gpus), default=0),
        "memory_mb": capabilities["memory_mb"], "cuda": capabilities["cuda"] or capabilities["torch_cuda"],
        "torch": capabilities["torch"], "gpu_checks": list(gpu_checks or []),
    })
    return worker


def current_worker(name: str | None = None) -> Worker:
    """The Worker row of this process (its Celery node name, else the host name), marked seen now.
    A process that runs tasks without having registered (eagerly, in tests) is recorded consuming nothing."""
    name = name or socket.gethostname()
    if not Worker.objects.filter(hostname=name).update(last_seen=timezone.now()):
        return do_register_worker(name, queues=())
    return Worker.objects.get(hostname=name)


def current_environment(python_environment: PythonEnvironment | None = None) -> Environment:
    """The Environment row of this host as a run in ``python_environment`` (None: the default) sees it."""
    facts = facts_in(python_environment)
    environment, _ = Environment.objects.get_or_create(
        fingerprint=facts["fingerprint"],
        defaults={
            "host": facts["host"], "cpu": facts["cpu"], "gpu": facts["gpu"], "gpu_driver": facts["gpu_driver"],
            "cuda": facts["cuda"], "python": facts["python"], "torch": facts["packages"].get("torch", ""),
            "facts": facts,
        },
    )
    return environment


def do_record_heartbeat(worker_name: str) -> bool:
    """A worker is alive: its ``last_seen`` is now (the reconciler requeues the runs of silent workers)."""
    return bool(Worker.objects.filter(hostname=worker_name).update(last_seen=timezone.now()))
