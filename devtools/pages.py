"""Pages of the dashboard picked from what the configured database holds, for `manage.py screenshots` and
`manage.py bench_paint`. Each returns a path, or None when the database has nothing to show."""
from django.db.models import Count
from django.urls import reverse

from bugs.models import ReproducerVersion
from core.enums import ReviewState
from evaluation.models import Evaluation
from runners.models import Campaign, Run, RunStatus
from runners.selectors import visible_runs


def busiest_bug():
    """(bug ID, its runs) of the bug with the most runs the public may see, or None when no such bug has run."""
    row = (visible_runs(None).filter(reproducer_version__reproducer__bug__isnull=False)
           .values("reproducer_version__reproducer__bug__bug_id").annotate(n=Count("id")).order_by("-n").first())
    return (row["reproducer_version__reproducer__bug__bug_id"], row["n"]) if row else None


def busiest_detector():
    """(name, its runs) of the detector with the most runs the public may see, or None when nothing has run."""
    row = visible_runs(None).values("detector__name").annotate(n=Count("id")).order_by("-n").first()
    return (row["detector__name"], row["n"]) if row else None


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


def first_visit_pages():
    """(label, path) of the pages `bench_paint` opens as a first visit: the bug page of the bug with the most runs,
    the detector page of the detector with the most, and a run page only when the database has a run to show."""
    listed = [("landing", "/"), ("catalog", "/catalog/"), ("leaderboard", "/leaderboard/"), ("results", "/results/"),
              ("methodology", "/methodology/")]
    bug, detector, run = busiest_bug(), busiest_detector(), example_run()
    if bug:
        listed.append((f"bug page ({bug[0]})", f"/bugs/{bug[0]}/"))
    if detector:
        listed.append((f"detector page ({detector[0]})", f"/detectors/{detector[0]}/"))
    if run:
        listed.append(("run (with alarms)", run))
    return listed
