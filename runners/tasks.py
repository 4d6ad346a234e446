"""Celery tasks. They carry only a run ID: the database says what to do and records what happened."""
import logging

from celery import shared_task
from celery.signals import worker_ready

from .detectors import get_plugin
from .execution import execute
from .fitting import FitError, ensure_fit
from .models import Run
from .services import (
    current_worker,
    do_claim_run,
    do_complete_campaign,
    do_fail_run_without_executing,
    do_finish_run,
    do_requeue_stale_runs,
)

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def execute_run(run_id):
    run = do_claim_run(run_id, current_worker())
    if run is None:
        logger.info("run %s is not queued any more; nothing to do", run_id)
    else:
        try:
            _execute_claimed(run)
        finally:
            if run.campaign_id:
                do_complete_campaign(run.campaign)


def _execute_claimed(run):
    if not run.reproducer_version.is_approved:  # checked again here: no path runs unapproved code
        do_fail_run_without_executing(run, "Refused: this reproducer version is not approved by a maintainer.")
        return
    try:
        if get_plugin(run.detector.name).needs_fit:
            run.fit_artifact = ensure_fit(run.detector, run.reproducer_version)
            Run.objects.filter(pk=run.pk).update(fit_artifact=run.fit_artifact)
    except FitError as error:
        do_fail_run_without_executing(run, f"The detector's fit phase failed: {error}")
        return
    try:
        outcome = execute(run)
    except Exception as error:  # the worker lives on; the run says why it failed
        logger.exception("run %s could not be executed", run.pk)
        do_fail_run_without_executing(run, f"Internal error before the reproducer ran: {error}")
        return
    do_finish_run(run, outcome)


@worker_ready.connect
def requeue_stale_runs_on_start(**kwargs):
    requeued = do_requeue_stale_runs()
    if requeued:
        logger.warning("requeued %d run(s) whose worker vanished: %s", len(requeued), requeued)
