"""The Celery task that drives a bisection started from the dashboard: each call advances it by one step
(evaluation.actions.do_advance_bisection) and, while it runs, calls itself again a little later, until the
rounds it queued (whose runs other tasks execute) have finished."""
from celery import shared_task

from .actions import do_advance_bisection
from .models import Bisection, BisectionStatus

POLL_SECONDS = 10


@shared_task(ignore_result=True)
def advance_bisection(bisection_id):
    bisection = Bisection.objects.filter(pk=bisection_id).first()
    if bisection is None:
        return
    if do_advance_bisection(bisection, acting_user=None).status == BisectionStatus.RUNNING:
        advance_bisection.apply_async(args=[bisection_id], countdown=POLL_SECONDS)
