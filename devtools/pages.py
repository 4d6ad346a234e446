"""Pages of the dashboard picked from what the configured database holds, for `manage.py screenshots` and
`manage.py bench_paint`. Each returns a path, or None when the database has nothing to show."""
from django.urls import reverse

from bugs.models import ReproducerVersion
from core.enums import ReviewState
from evaluation.models import Evaluation
from runners.models import Campaign, Run, RunStatus


def example_run():
    """A finished buggy run whose detector alarmed, preferably of PT-115607: the loss chart with alarms."""
    runs = Run.objects.filter(status=RunStatus.SUCCEEDED, variant="buggy", alarms__isnull=False).order_by("pk")
    run = runs.filter(reproducer_version__reproducer__bug__bug_id="PT-115607").first() or runs.first()
    return run.get_absolute_url() if run else None


def example_campaign():
    evaluation = Evaluation.objects.first()
    campaign = evaluation.campaign if evaluation else Campaign.objects.order_by("-created_at").first()
    return campaign.get_absolute_url() if campaign else None


def example_review():
    """The review page of the oldest version waiting for a maintainer."""
    version = ReproducerVersion.objects.filter(review_state=ReviewState.PENDING).order_by("created_at").first()
    return reverse("bugs:review", args=[version.pk]) if version else None
