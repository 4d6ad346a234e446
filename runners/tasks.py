"""Celery tasks. They carry only a run ID: the database says what to do and records what happened.

What a worker does as it starts (its queues, its registration, its zygote, its heartbeat) is runners.worker."""
import logging

from celery import shared_task

from .actions.campaigns import do_complete_campaign
from .actions.fits import do_attach_fit
from .actions.runs import do_claim_run, do_fail_run_without_executing, do_finish_run, retry_while_database_away
from .actions.workers import current_worker
from .detector_versions.fitting import ensure_fit
from .detector_versions.registry import plugin_for
from .environments.routing import (
    DevicesBusy,
    NotEnoughDevices,
    devices_for_run,
)
from .execution import execute
from .failures import RunRefused, Unapproved, Unservable, internal_error, kind_of
from .models import CampaignPurpose, Run

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def execute_run(run_id):
    """Hold the GPUs the run's queue stands for (none for ``cpu``), then claim and execute it."""
    try:
        with devices_for_run(run_id) as devices:
            _claim_and_execute(run_id, devices)
    except DevicesBusy as busy:  # back in its queue, for this worker or another one, once the GPUs free up
        run = Run.objects.select_related("campaign").get(pk=run_id)
        if run.campaign is not None and run.campaign.purpose == CampaignPurpose.OVERHEAD:
            # a timed run belongs to the process that times it (evaluation.overhead), never to the broker
            _claim_and_execute(run_id, (), Unservable(
                f"{busy}: a timed run needs GPUs of its own, and shared runs held them for longer than the lease wait"))
            return
        logger.warning("run %s: %s; queued again", run_id, busy)
        execute_run.apply_async(args=[run_id], queue=run.queue)
    except NotEnoughDevices as refusal:  # this host lacks the GPUs altogether: the run fails here, saying so
        _claim_and_execute(run_id, (), refusal)


def _claim_and_execute(run_id, devices, refusal=None):
    """``refusal``: a RunRefused that fails the run before anything of it starts (NotEnoughDevices)."""
    run = do_claim_run(run_id, current_worker(execute_run.request.hostname))
    if run is None:
        logger.info("run %s is not queued any more; nothing to do", run_id)
        return
    try:
        if refusal is not None:
            do_fail_run_without_executing(run, refusal.reason, refusal.kind)
        else:
            _execute_claimed(run, devices)
    finally:
        if run.campaign_id:
            retry_while_database_away(do_complete_campaign)(run.campaign)


def _execute_claimed(run, devices):
    """Fit if the detector needs it, execute, store the outcome. A refusal (a RunRefused: not approved, its fit
    failed, ...) fails the run with its own kind and sentence. Any other error of the fit (the database away) leaves
    the run running, for the reaper to queue again; any other error of the execution fails it as internal."""
    try:
        if not run.reproducer_version.is_approved:  # checked again here: no path runs unapproved code
            raise Unapproved(run.reproducer_version)
        if plugin_for(run.detector).needs_fit:
            do_attach_fit(run, ensure_fit(run.detector, run.reproducer_version))
    except RunRefused as refusal:
        do_fail_run_without_executing(run, refusal.reason, refusal.kind)
        return
    try:
        outcome = execute(run, devices)  # a refusal inside it is its outcome (runners.execution.refused)
    except Exception as error:  # the worker lives on; the run says why it failed
        logger.exception("run %s could not be executed", run.pk)
        do_fail_run_without_executing(run, internal_error(error), kind_of(internal_error))
        return
    do_finish_run(run, outcome)
