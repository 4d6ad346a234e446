"""Read-only questions about runs, workers and what can run, and what each user may see of runs, their
alarms and campaigns; the pages, the API, the commands and the actions share them (runners.actions writes)."""
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from bugs.models import BugStatus, ReproducerVersion
from bugs.selectors import hidden_versions
from core.caching import per_request

from .models import Alarm, Campaign, CampaignPurpose, Run, Worker


def runnable_versions(bug_ids=None, cuda=False, pipelines=False):
    """The latest approved version of each reproducer (CPU ones unless ``cuda``), of the given
    bugs or of every bug that is not deprecated; of the clean reference pipelines if ``pipelines``."""
    versions = ReproducerVersion.objects.approved().filter(
        reproducer__needs_cuda=cuda, reproducer__bug__isnull=pipelines,
    ).exclude(reproducer__bug__status=BugStatus.DEPRECATED)
    if bug_ids is not None:
        versions = versions.filter(reproducer__bug__bug_id__in=bug_ids)
    return list(ReproducerVersion.objects.filter(pk__in=versions.latest_ids().values())
                .select_related("reproducer__bug").order_by("reproducer__bug__bug_id", "reproducer__name"))


def live_workers(now=None):
    """Workers seen within SILENTBENCH_WORKER_SEEN_MINUTES (their heartbeat keeps ``last_seen`` fresh)."""
    now = now or timezone.now()
    return Worker.objects.filter(last_seen__gte=now - timedelta(minutes=settings.SILENTBENCH_WORKER_SEEN_MINUTES))


def dispatched_runs():
    """The runs that go through the broker, which the reconciler looks after: all but those an overhead
    measurement creates and executes itself, one at a time (evaluation.overhead)."""
    return Run.objects.exclude(campaign__purpose=CampaignPurpose.OVERHEAD)


@per_request
def _hidden_versions_that_ran(user):
    """The hidden versions (bugs.selectors), as a subquery, when one of them has runs; else None. Code is hidden
    after it ran only rarely, and then nothing is filtered: one EXISTS query instead of an exclusion that scans
    every run or alarm counted, asked once per request (a page asks it for its runs, campaigns and evaluations)."""
    hidden = hidden_versions(user)
    if hidden is None or not hidden.filter(Exists(Run.objects.filter(reproducer_version=OuterRef("pk")))).exists():
        return None
    return hidden.values("pk")


def visible_runs(user, runs=None):
    """The runs (of ``runs``, default all) whose reproducer version ``user`` may see."""
    runs = Run.objects.all() if runs is None else runs
    hidden = _hidden_versions_that_ran(user)
    return runs if hidden is None else runs.exclude(reproducer_version__in=hidden)


def visible_alarms(user):
    """The alarms of the runs ``user`` may see."""
    hidden = _hidden_versions_that_ran(user)
    alarms = Alarm.objects.all()
    return alarms if hidden is None else alarms.exclude(run__reproducer_version__in=hidden)


def visible_campaigns(user):
    """The campaigns all of whose runs ``user`` may see (a campaign's name and counts speak of every run)."""
    hidden = _hidden_versions_that_ran(user)
    campaigns = Campaign.objects.all()
    return campaigns if hidden is None else campaigns.exclude(runs__reproducer_version__in=hidden)
