"""The reconciler: PostgreSQL says what still has to run; the broker is only transport. One pass
repairs every difference, and repeating it is harmless (a run is claimed only while queued, so an
extra message for it does nothing):

- runs ``running`` on a worker whose heartbeat stopped are queued again (a new attempt), and the
  time-limit reaper catches any left (``do_requeue_stale_runs``); a run lost on its second attempt fails as
  lost instead (``runners.actions.runs.MAX_ATTEMPTS``); an overhead run, which its command times in-process
  and nobody queues again, fails as lost past its allowance (``do_give_up_stale_timed_runs``);
- runs ``queued`` for a while with no message in the broker (Redis lost it) are enqueued again;
- runs nobody can serve are failed with the reason (``do_flag_unservable_runs``);
- campaigns whose runs all finished but were never marked complete are completed.

Run by ``manage.py reconcile`` (periodically) and once by each worker as it starts.
"""
import base64
import json
import logging
from datetime import timedelta
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.utils import timezone

from .actions.campaigns import EXECUTE_RUN, do_complete_campaign, enqueue_runs
from .actions.runs import (
    do_flag_unservable_runs,
    do_give_up_stale_timed_runs,
    do_requeue_lost_runs,
    do_requeue_stale_runs,
)
from .models import Campaign, RunStatus
from .selectors import dispatched_runs

logger = logging.getLogger(__name__)


def reconcile(now=None):
    """One pass; returns {what was repaired: [IDs]} for the log."""
    now = now or timezone.now()
    silent, stale = do_requeue_runs_of_silent_workers(now), do_requeue_stale_runs(now)
    repaired = {
        "requeued_from_silent_workers": silent.requeued,
        "requeued_past_time_limit": stale.requeued,
        "lost_runs_given_up": silent.given_up + stale.given_up,
        "overhead_runs_given_up": do_give_up_stale_timed_runs(now),
        "reenqueued_lost_messages": do_reenqueue_lost_runs(now),
        "failed_unservable": do_flag_unservable_runs(now),
    }
    repaired["completed_campaigns"] = do_complete_finished_campaigns()
    for what, ids in repaired.items():
        if ids:
            logger.warning("reconcile: %s: %s", what.replace("_", " "), ids)
    return repaired


def do_requeue_runs_of_silent_workers(now=None):
    """Queue again, as new attempts, the runs ``running`` on a worker not heard from for
    SILENTBENCH_WORKER_STALE_SECONDS (killed, or its host gone), or give them up (do_requeue_lost_runs). A
    late result of the old attempt is ignored (do_finish_run checks the attempt). Returns LostRuns."""
    now = now or timezone.now()
    silent_since = now - timedelta(seconds=settings.SILENTBENCH_WORKER_STALE_SECONDS)
    return _requeue_running(dispatched_runs().filter(worker__last_seen__lt=silent_since), now)


def do_requeue_runs_of_restarted_worker(name):
    """As worker ``name`` starts: the runs still ``running`` under its name were cut short by its
    previous life (killed, or its host rebooted); queue them again as new attempts, or give them up
    (do_requeue_lost_runs). Returns LostRuns."""
    lost = _requeue_running(dispatched_runs().filter(worker__hostname=name))
    if lost.requeued or lost.given_up:
        logger.warning("runs that %s was running before it restarted: requeued %s, given up %s", name,
                       lost.requeued, lost.given_up)
    return lost


def _requeue_running(runs, now=None):
    """Queue again (or give up) the runs among ``runs`` that are running now."""
    return do_requeue_lost_runs(dict(runs.filter(status=RunStatus.RUNNING).values_list("id", "attempts")), now)


def do_reenqueue_lost_runs(now=None):
    """Enqueue again the runs queued for longer than SILENTBENCH_REQUEUE_QUEUED_AFTER_SECONDS whose
    message is not in the broker. Where the broker cannot be read, all of them (duplicates are harmless)."""
    now = now or timezone.now()
    waiting = dict(dispatched_runs().filter(
        status=RunStatus.QUEUED,
        queued_at__lt=now - timedelta(seconds=settings.SILENTBENCH_REQUEUE_QUEUED_AFTER_SECONDS),
    ).values_list("id", "queue"))
    if not waiting:
        return []
    lost = missing_from_broker(waiting)
    if lost:
        enqueue_runs(lost)
    return lost


def do_complete_finished_campaigns():
    """Complete the open campaigns with nothing queued or running (a worker died between its run's
    result and the campaign's completion, or the database was away then)."""
    open_campaigns = Campaign.objects.filter(completed_at__isnull=True).exclude(
        runs__status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
    return [campaign.pk for campaign in open_campaigns if do_complete_campaign(campaign, acting_user=None)]


# --- What the broker holds ---

def missing_from_broker(waiting):
    """Of ``waiting`` ({run ID: queue}), the runs with no message in the broker, waiting in their queue
    or delivered but not yet acknowledged, sorted. Where the broker cannot be read: all of them.

    Redis: when it holds at least as many messages as there are waiting runs, nothing is taken as
    missing (a loss shows once the queue drains); otherwise its messages are read. Filesystem broker
    (the embedded default): its message files are read."""
    app = current_app  # the project's Celery app (benchmark_site.celery), without importing the wiring package

    url, queues = app.conf.broker_url or "", set(waiting.values())
    if url.startswith("redis"):
        with app.connection_for_read() as connection:
            client = connection.default_channel.client
            if sum(client.llen(queue) for queue in queues) + client.hlen("unacked") >= len(waiting):
                return []
            payloads = [raw for queue in queues for raw in client.lrange(queue, 0, -1)]
            payloads += [json.loads(raw)[0] for raw in client.hvals("unacked")]
    elif url.startswith("filesystem"):
        folder = Path(app.conf.broker_transport_options.get("data_folder_in", "."))
        payloads = [path.read_bytes() for path in folder.glob("*.msg") if path.name.rsplit(".", 2)[-2] in queues]
    else:
        return sorted(waiting)
    return sorted(set(waiting) - {_run_id(payload) for payload in payloads})


def _run_id(payload):
    """The run ID an ``execute_run`` message carries (protocol 2: the body is [args, kwargs, embed])."""
    try:
        message = json.loads(payload) if isinstance(payload, (bytes, str)) else payload
        if message.get("headers", {}).get("task") != EXECUTE_RUN:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return int(args[0])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
