from functools import cache

from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.cache import cache_control

from .charts import loss_figure
from .models import FINISHED_STATUSES, Campaign, Run


def run_detail(request, pk):
    run = get_object_or_404(
        Run.objects.select_related("reproducer_version__reproducer__bug", "detector", "environment", "worker",
                                   "campaign", "fit_artifact").defer("fit_artifact__content"), pk=pk)
    counterpart = (Run.objects.filter(
        reproducer_version=run.reproducer_version, detector=run.detector, seed=run.seed, steps=run.steps,
        campaign=run.campaign, status="succeeded").exclude(variant=run.variant).order_by("-id").first())
    pair = sorted([r for r in (run, counterpart) if r is not None], key=lambda r: r.variant)
    alarms = list(run.alarms.all()[:500])
    figure = loss_figure([(r, alarms if r == run else list(r.alarms.all()[:500])) for r in pair])
    return render(request, "runners/run_detail.html", {
        "run": run, "counterpart": counterpart, "alarms": alarms, "alarm_count": run.alarms.count(),
        "figure": figure,
    })


def campaign_list(request):
    campaigns = Campaign.objects.select_related("created_by").order_by("-created_at", "-id").annotate(
        run_count=Count("runs"), finished_count=Count("runs", filter=Q(runs__status__in=FINISHED_STATUSES)))
    page = Paginator(campaigns, 25).get_page(request.GET.get("page"))
    return render(request, "runners/campaign_list.html", {"page_obj": page, "campaigns": page.object_list})


def campaign_detail(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    runs = campaign.runs.select_related("reproducer_version__reproducer__bug", "detector").order_by("id")
    page = Paginator(runs, 100).get_page(request.GET.get("page"))
    progress = campaign.progress()
    return render(request, "runners/campaign_detail.html", {
        "campaign": campaign, "progress": progress, "page_obj": page, "runs": page.object_list,
        "live": progress["done"] < progress["total"],
    })


@cache
def _plotly_js():
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


@cache_control(public=True, max_age=86400)
def plotly_js(request):
    """plotly.js from the installed plotly package: nothing is fetched from a CDN."""
    return HttpResponse(_plotly_js(), content_type="application/javascript")
