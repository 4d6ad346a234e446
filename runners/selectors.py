"""Read-only questions about runs, workers and what can run; the pages, the API, the commands and the
actions share them (runners.actions writes)."""
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from bugs.models import BugStatus, ReproducerVersion

from .models import CampaignPurpose, Run, Worker


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
