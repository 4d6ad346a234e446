"""What a worker does as it starts, wired to Celery's signals by benchmark_site/celery.py: the queues it consumes
(``-Q auto``, the Python environments it serves), its zygote, its registration with what its host offers, the
repair of what its previous life left running, and its heartbeat."""
import logging
import threading
import time

from django.conf import settings
from django.db import DatabaseError, connection

from ..actions.workers import do_record_heartbeat, do_register_worker
from ..detectors.base import PROBE_PRELOAD
from ..environments.gpu_check import check_gpus
from ..environments.host import (
    cores_per_run,
    gpu_inventory,
    host_capabilities,
    share_cores_among,
    usable_cores,
    withhold_gpus,
)
from ..environments.python_environments import EnvironmentBuildError, build_environment, do_advertise_environments
from ..environments.routing import (
    ENVIRONMENT_SEPARATOR,
    environment_of_queue,
    needs_of_queue,
    queues_for_worker,
    queues_in_environments,
)
from ..executor import Limits, ZygoteClient, describe_confinement, isolation_layers
from ..models import PythonEnvironment
from ..reconciler import do_requeue_runs_of_restarted_worker, reconcile

logger = logging.getLogger(__name__)


def share_cores(instance):
    """As the worker sets up, before its pool forks: each run gets its share of the cores (runners.execution)."""
    share_cores_among(instance.concurrency)
    logger.info("each run gets %d CPU thread(s): %d cores, concurrency %d", cores_per_run(), usable_cores(),
                instance.concurrency)


def start_zygote():
    """In each pool process: start the zygote of instrumented runs at once, so that its first run does not wait for
    torch's import."""
    if isolation_layers()["namespaces"]:
        threading.Thread(target=_start_zygote, name="silentbench-zygote", daemon=True).start()


def _start_zygote():
    try:
        ZygoteClient.shared(PROBE_PRELOAD)
    except Exception:  # the first run will try again, and fail with the reason
        logger.exception("the zygote did not start")


AUTO_QUEUES = {"auto": True, "auto-gpu": False}  # -Q value: with the cpu queue or without


_gpu_checks: list[dict] = []  # this worker's self-check of its GPUs, recorded as it registers


def check_own_gpus():
    """Probe every GPU this host offers, sealed as a run holding it would be (runners.environments.gpu_check); a GPU
    that fails is withheld from the worker's queues and leases, with the reason in the log and on its Worker row."""
    checks = check_gpus(gpu_inventory())
    ZygoteClient.close_all()  # the probes' launcher: pool processes start their own, and it would idle here for ever
    withhold_gpus([check["index"] for check in checks if not check["passed"]])
    for check in checks:
        if check["passed"]:
            logger.info("GPU %d (%s) passed its check in %.1f s", check["index"], check["name"], check["seconds"])
        else:
            logger.error("GPU %d (%s) is not offered: %s", check["index"], check["name"], check["reason"])
    _gpu_checks[:] = checks


def offers_gpus(selected):
    """Whether a worker consuming ``selected`` (its -Q names) would take GPU runs on this host."""
    return bool(gpu_inventory()) and any(name in AUTO_QUEUES or needs_of_queue(name).gpus for name in selected)


def consume_auto_queues(instance):
    """``celery worker -Q auto`` (or ``auto-gpu``, which leaves CPU runs to others): consume every queue
    this host's capabilities can serve (runners.environments.routing). Called as the worker sets up, before it
    consumes anything. Other names given with it (``-Q auto-gpu,x``) stay. A worker that would take GPU runs first
    checks its GPUs (check_own_gpus): GPU queues that only a GPU that failed could serve are dropped. Then, with
    any ``-Q``, the Python environments it serves are built and their queues added (consume_environment_queues)."""
    queues = instance.app.amqp.queues
    selected = list(queues.consume_from or {})
    if settings.SILENTBENCH_GPU_SELF_CHECK and offers_gpus(selected):
        check_own_gpus()
        servable = set(queues_for_worker(host_capabilities()))
        kept = [name for name in selected if name in AUTO_QUEUES or not needs_of_queue(name).gpus
                or name.partition(ENVIRONMENT_SEPARATOR)[0] in servable]
        if kept != selected:
            logger.error("not consuming %s: no GPU that passed its check can serve them",
                         ", ".join(sorted(set(selected) - set(kept))))
            queues.select(kept or ["cpu"])
    auto = [name for name in AUTO_QUEUES if name in (queues.consume_from or {})]
    if auto:
        named = [name for name in queues.consume_from if name not in AUTO_QUEUES]
        cpu = any(AUTO_QUEUES[name] for name in auto)
        chosen = list(dict.fromkeys(queues_for_worker(host_capabilities(), cpu=cpu) + named))
        if not chosen:  # -Q auto-gpu on a node with no GPU, or none that passed its check
            logger.error("no GPU of this node %s: this worker serves the cpu queue instead",
                         "passed its check" if _gpu_checks else "is offered (nvidia-smi lists none)")
            chosen = ["cpu"]
        queues.select(chosen)
    consume_environment_queues(queues)


def consume_environment_queues(queues):
    """Build the environments this worker serves (SILENTBENCH_WORKER_ENVIRONMENTS; cached per machine, so only a
    worker's first start pays for it) and consume each of its cpu and GPU queues in each of them too. One that
    fails to build is left out, with the reason in the log: its runs wait for a worker that has it."""
    names = []
    for requirements in settings.SILENTBENCH_WORKER_ENVIRONMENTS:
        started = time.monotonic()
        try:
            names.append(build_environment(requirements).name)
        except (EnvironmentBuildError, ValueError):
            logger.exception("the environment %s was not built; this worker does not serve it", requirements)
            continue
        logger.info("environment %s ready in %.1f s", names[-1], time.monotonic() - started)
    if names and queues.consume_from:
        queues.select(queues_in_environments(list(queues.consume_from), names))


def register_worker(sender):
    """As the worker is ready (``sender``: Celery's worker): record the queues it consumes, what its host offers
    (GPUs, memory, CUDA, torch) and the Python environments it serves besides the default one."""
    queues = sorted(sender.app.amqp.queues.consume_from or sender.app.amqp.queues)
    worker = do_register_worker(sender.hostname, queues, sender.controller.concurrency, gpu_checks=_gpu_checks)
    served = {environment_of_queue(queue) for queue in queues} - {""}
    worker = do_advertise_environments(worker, PythonEnvironment.objects.filter(name__in=served))
    logger.info("registered %s: queues %s, %d GPU(s)", worker.hostname, ", ".join(queues), worker.gpu_count)


def reconcile_and_beat(sender):
    """As the worker is ready, after ``register_worker``: runs left ``running`` under this worker's name belong to a
    previous life of it (it has claimed nothing yet): queue them again, reconcile once, then keep ``last_seen``
    fresh, so that the reconciler can tell when this worker dies."""
    logger.info("sandbox: %s", describe_confinement(Limits(time_limit_seconds=0, memory_mb=0,
                                                          user=settings.SILENTBENCH_SANDBOX_USER,
                                                          allow_unisolated=settings.SILENTBENCH_ALLOW_UNISOLATED)))
    # The heartbeat first: whatever happens below, this worker must not look dead while it takes runs.
    threading.Thread(target=_heartbeat, args=(sender.hostname, settings.SILENTBENCH_HEARTBEAT_SECONDS),
                     name="silentbench-heartbeat", daemon=True).start()
    try:
        do_requeue_runs_of_restarted_worker(sender.hostname)
        reconcile()
    except Exception:  # the database or the broker is away: the periodic reconciler will catch up
        logger.exception("reconcile on start failed; the periodic reconciler will catch up")


def _heartbeat(name, interval):
    while True:
        time.sleep(interval)
        try:
            do_record_heartbeat(name)
        except Exception as error:  # never let the heartbeat die: a silent worker loses its runs
            logger.warning("heartbeat of %s not recorded: %s", name, error)
            if isinstance(error, DatabaseError):
                connection.close()
