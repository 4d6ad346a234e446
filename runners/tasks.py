"""Celery tasks. They carry only a run ID: the database says what to do and records what happened."""
import logging
import threading
import time

from celery import shared_task
from celery.signals import worker_process_init, worker_ready
from django.conf import settings
from django.db import DatabaseError, connection

from .actions import (
    current_worker,
    do_attach_fit,
    do_claim_run,
    do_complete_campaign,
    do_fail_run_without_executing,
    do_finish_run,
    do_record_heartbeat,
    do_register_worker,
    retry_while_database_away,
)
from .environment import host_capabilities
from .environments import EnvironmentBuildError, build_environment, do_advertise_environments
from .execution import execute
from .failures import fit_failed, internal_error, unapproved
from .fitting import FitError, ensure_fit
from .models import PythonEnvironment, Run, RunFailureKind
from .registry import plugin_for
from .routing import (
    DevicesBusy,
    NotEnoughDevices,
    devices_for_run,
    environment_of_queue,
    queues_for_worker,
    queues_in_environments,
)
from .sandbox import Limits, describe_confinement

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def execute_run(run_id):
    """Hold the GPUs the run's queue stands for (none for ``cpu``), then claim and execute it."""
    try:
        with devices_for_run(run_id) as devices:
            _claim_and_execute(run_id, devices)
    except DevicesBusy as busy:  # back in its queue, for this worker or another one, once the GPUs free up
        logger.warning("run %s: %s; queued again", run_id, busy)
        execute_run.apply_async(args=[run_id], queue=Run.objects.get(pk=run_id).queue)
    except NotEnoughDevices as error:
        _claim_and_execute(run_id, (), refusal=str(error))


def _claim_and_execute(run_id, devices, refusal=""):
    """``refusal``: why this worker's host cannot serve the run at all (NotEnoughDevices)."""
    run = do_claim_run(run_id, current_worker(execute_run.request.hostname))
    if run is None:
        logger.info("run %s is not queued any more; nothing to do", run_id)
        return
    try:
        if refusal:
            do_fail_run_without_executing(run, refusal, RunFailureKind.UNSERVABLE)
        else:
            _execute_claimed(run, devices)
    finally:
        if run.campaign_id:
            retry_while_database_away(do_complete_campaign)(run.campaign)


def _execute_claimed(run, devices):
    if not run.reproducer_version.is_approved:  # checked again here: no path runs unapproved code
        do_fail_run_without_executing(run, unapproved(), RunFailureKind.UNAPPROVED)
        return
    try:
        if plugin_for(run.detector).needs_fit:
            do_attach_fit(run, ensure_fit(run.detector, run.reproducer_version))
    except FitError as error:
        do_fail_run_without_executing(run, fit_failed(error), RunFailureKind.FIT_FAILED)
        return
    try:
        outcome = execute(run, devices)
    except Exception as error:  # the worker lives on; the run says why it failed
        logger.exception("run %s could not be executed", run.pk)
        do_fail_run_without_executing(run, internal_error(error), RunFailureKind.INTERNAL)
        return
    do_finish_run(run, outcome)


@worker_process_init.connect
def start_zygote(**kwargs):
    """Each pool process starts its zygote at once, so that its first run does not wait for torch's import."""
    from .sandbox import isolation_layers
    from .zygote import ZygoteClient

    if isolation_layers()["namespaces"]:
        threading.Thread(target=_start_zygote, args=(ZygoteClient,), name="silentbench-zygote", daemon=True).start()


def _start_zygote(client):
    try:
        client.shared()
    except Exception:  # the first run will try again, and fail with the reason
        logger.exception("the zygote did not start")


AUTO_QUEUES = {"auto": True, "auto-gpu": False}  # -Q value: with the cpu queue or without


def consume_auto_queues(instance):
    """``celery worker -Q auto`` (or ``auto-gpu``, which leaves CPU runs to others): consume every queue
    this host's capabilities can serve (runners.routing). Called from benchmark_site/celery.py, as the
    worker sets up, before it consumes anything. Other names given with it (``-Q auto-gpu,x``) stay. Then, with
    any ``-Q``, the Python environments it serves are built and their queues added (consume_environment_queues)."""
    queues = instance.app.amqp.queues
    auto = [name for name in AUTO_QUEUES if name in (queues.consume_from or {})]
    if auto:
        named = [name for name in queues.consume_from if name not in AUTO_QUEUES]
        cpu = any(AUTO_QUEUES[name] for name in auto)
        queues.select(list(dict.fromkeys(queues_for_worker(host_capabilities(), cpu=cpu) + named)))
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


@worker_ready.connect
def register_worker_on_start(sender, **kwargs):
    """Record the queues this worker consumes, what its host offers (GPUs, memory, CUDA, torch) and the Python
    environments it serves besides the default one."""
    queues = sorted(sender.app.amqp.queues.consume_from or sender.app.amqp.queues)
    worker = do_register_worker(sender.hostname, queues, sender.controller.concurrency)
    served = {environment_of_queue(queue) for queue in queues} - {""}
    worker = do_advertise_environments(worker, PythonEnvironment.objects.filter(name__in=served))
    logger.info("registered %s: queues %s, %d GPU(s)", worker.hostname, ", ".join(queues), worker.gpu_count)


@worker_ready.connect
def reconcile_and_beat_on_start(sender, **kwargs):
    """Runs left ``running`` under this worker's name belong to a previous life of it (it has claimed
    nothing yet): queue them again, reconcile once, then keep ``last_seen`` fresh, so that the
    reconciler can tell when this worker dies."""
    from .reconciler import do_requeue_runs_of_restarted_worker, reconcile

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
