import gzip
import math
import re
from functools import cache

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, Max, Min
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from bugs.selectors import held_out_view
from core.caching import cached, digest, kept_for_rows

from .actions.campaigns import do_cancel_campaign, do_create_campaign, do_retry_failed_runs
from .charts import loss_figure
from .completed import cached_status_counts, completed_key
from .detectors import campaign_plugins
from .environments.routing import describe_worker
from .failures import breakdown, failure_counts
from .forms import CampaignForm, RetryForm
from .models import (
    ALARM_FIELDS,
    FINISHED_STATUSES,
    RUN_RECORD_FIELDS,
    Alarm,
    Campaign,
    CampaignState,
    Environment,
    EnvironmentBuild,
    Run,
    RunFailureKind,
    RunStatus,
    Worker,
    runs_for_listing,
)
from .permissions import TRIGGER_PERMISSION
from .run_rows import run_rows
from .selectors import live_workers, visible_campaigns, visible_runs


def run_detail(request, pk):
    run = get_object_or_404(
        visible_runs(request.user).select_related("reproducer_version__reproducer__bug", "detector", "environment",
                                                  "worker", "campaign", "fit_artifact", "python_environment")
        .defer("fit_artifact__content"),
        pk=pk)
    counterpart = (Run.objects.filter(
        reproducer_version=run.reproducer_version, detector=run.detector, seed=run.seed, steps=run.steps,
        campaign=run.campaign, status=RunStatus.SUCCEEDED).exclude(variant=run.variant).order_by("-id").first())
    pair = sorted([r for r in (run, counterpart) if r is not None], key=lambda r: r.variant)
    alarms = list(run.alarms.all()[:500])
    figure = loss_figure([(r, alarms if r == run else list(r.alarms.all()[:500])) for r in pair])
    # where the worker that ran it built its environment, and what that cost (none for the workers' own)
    build = (EnvironmentBuild.objects.filter(environment=run.python_environment, worker=run.worker_id).first()
             if run.python_environment_id and run.worker_id else None)
    return render(request, "runners/run_detail.html", {
        "run": run, "counterpart": counterpart, "alarms": alarms, "alarm_count": run.alarms.count(),
        "alarm_groups": alarm_groups(run), "figure": figure, "build": build,
    })


def alarm_groups(run):
    """A run's alarms grouped by rule, in the order each first fired: how many, over which steps and ranks, and the
    first message (60 identical ``replicas_diverged`` alarms took 4,000 px of the page, one row each); in a bundle's
    run, by the member that raised them too."""
    groups = (run.alarms.order_by().values("detector", "rule")
              .annotate(count=Count("id"), first_step=Min("step"), last_step=Max("step"), first_rank=Min("rank"),
                        last_rank=Max("rank"), first_id=Min("id")).order_by("first_step", "first_id"))
    groups = list(groups)
    messages_by_id = dict(Alarm.objects.filter(pk__in=[group["first_id"] for group in groups])
                          .values_list("pk", "message"))
    for group in groups:
        group["message"] = messages_by_id[group["first_id"]]
    return groups


def run_record(request, pk):
    """One run as a JSON download: what ran (reproducer version, detector and config, environment), its records,
    oracle verdict, alarms and logs."""
    run = get_object_or_404(visible_runs(request.user).select_related(
        "reproducer_version__reproducer__bug", "detector__code", "environment", "campaign"), pk=pk)
    reproducer = run.reproducer_version.reproducer
    record = {
        "run": run.pk, "campaign": run.campaign_id,
        "reproducer": {"bug": reproducer.bug.bug_id if reproducer.bug else None, "name": reproducer.name,
                       "content_hash": run.reproducer_version.content_hash},
        "detector": {"name": run.detector.name, "version": run.detector.version, "config": run.detector.config,
                     "code_hash": run.detector.code_hash},
        "environment": run.environment and {"host": run.environment.host, "torch": run.environment.torch,
                                            "python": run.environment.python, "gpu": run.environment.gpu},
        **{name: getattr(run, name) for name in (*RUN_RECORD_FIELDS, "stdout", "stderr")},
        "alarms": list(run.alarms.values(*ALARM_FIELDS, "detector")),
    }
    response = JsonResponse(record, json_dumps_params={"indent": 1})
    response["Content-Disposition"] = f'attachment; filename="silentbench-run-{run.pk}.json"'
    return response


def campaign_list(request):
    """A page of campaigns; its content is rendered once for the same campaigns, run counts, campaigns in all (the
    page links), users who created them, query string and reader: a live campaign's counts change as it runs, and
    are in the key rather than in what is kept."""
    campaigns = visible_campaigns(request.user).select_related("created_by").order_by("-created_at", "-id")
    page = Paginator(campaigns, 25).get_page(request.GET.get("page"))
    shown = count_runs(page.object_list)
    counts = [(campaign.pk, campaign.run_count, campaign.finished_count) for campaign in shown]
    rows = (Campaign.objects.filter(pk__in=[campaign.pk for campaign in shown]),
            get_user_model().objects.filter(pk__in={campaign.created_by_id for campaign in shown}))
    content = kept_for_rows(request, f"campaign-list:{digest([counts, page.paginator.count])}", rows, lambda: (
        render_to_string("runners/campaign_list_content.html", {"page_obj": page, "campaigns": shown}, request)))
    return render(request, "runners/campaign_list.html", {"content": content})


def count_runs(campaigns):
    """Set ``run_count`` and ``finished_count`` on one page of campaigns: the completed ones' from the cache, the
    others with one grouped query (an annotation on the paginated queryset counted the runs of every campaign
    before paginating)."""
    campaigns = list(campaigns)
    counts = cached_status_counts(campaigns)
    for campaign in campaigns:
        by_status = counts[campaign.pk]
        campaign.run_count = sum(by_status.values())
        campaign.finished_count = sum(by_status.get(status, 0) for status in FINISHED_STATUSES)
    return campaigns


def campaign_context(request, campaign):
    """What the campaign page shows, and what its live part refreshes: progress, failures and their kinds,
    one page of runs (``?status=`` and ``?kind=`` filter them). The counts of a completed campaign come from the
    cache (``runners.completed``), and so does the part with its failures and page of runs (``runs_part``), rendered
    once for the query string and for whether the reader may queue campaigns (the runs table offers it); the page
    of runs is read by the index, whatever the campaign's size."""
    status = request.GET.get("status", "")
    status = status if status in RunStatus.values else ""
    kind = request.GET.get("kind", "")
    kind = kind if kind in RunFailureKind.values else ""
    progress = campaign.progress(cached_status_counts([campaign])[campaign.pk])
    failure_kinds = cached(completed_key(campaign, "failure-kinds"), lambda: failure_counts(campaign.runs.all()))
    context = {"campaign": campaign, "progress": progress, "status": status, "statuses": RunStatus.choices,
               "kind": kind, "kind_label": RunFailureKind(kind).label if kind else "",
               "failure_kinds": breakdown(failure_kinds),
               "live": campaign.state == CampaignState.RUNNING and progress["done"] < progress["total"]}
    may_queue = request.user.has_perm(TRIGGER_PERMISSION)
    part = f"runs-part:{may_queue}:{held_out_view(request.user)}:{digest(request.GET.urlencode())}"
    context["runs_part"] = cached(
        completed_key(campaign, part),
        lambda: render_to_string("runners/campaign_runs.html", {
            **context, **page_of_runs(request, campaign, status, kind), "request": request}))
    return context


def page_of_runs(request, campaign, status, kind):
    """The page of the campaign's runs that ``request`` asks for, of this status and failure kind, as a table, and
    the first 20 failures: of the runs the reader may see (not those of held-out bugs, unless a maintainer)."""
    shown = visible_runs(request.user, campaign.runs.all())
    runs = runs_for_listing(shown.order_by("id"))
    if status:
        runs = runs.filter(status=status)
    if kind:
        runs = runs.filter(failure_kind=kind)
    paginator = Paginator(runs, 100)
    paginator.count = cached(completed_key(campaign, f"runs:{status}:{kind}:{held_out_view(request.user)}"),
                             runs.count)
    page = paginator.get_page(request.GET.get("page"))
    return {"page_obj": page,
            "runs_html": run_rows(page.object_list, request.user, show_bug=True, status=status, kind=kind),
            "failures": runs_for_listing(shown.filter(status=RunStatus.FAILED).order_by("id"))[:20]}


def campaign_detail(request, pk):
    campaign = get_object_or_404(visible_campaigns(request.user).select_related("created_by", "cancelled_by"), pk=pk)
    context = campaign_context(request, campaign)
    context["retry_form"] = RetryForm(present=context["failure_kinds"])
    environments = cached(completed_key(campaign, "environments"), lambda: list(
        Environment.objects.filter(pk__in=campaign.runs.values("environment"))
        .order_by("host", "torch")[:ENVIRONMENTS_SHOWN + 1]))
    context.update(environments=environments[:ENVIRONMENTS_SHOWN],
                   more_environments=len(environments) > ENVIRONMENTS_SHOWN)
    return render(request, "runners/campaign_detail.html", context)


ENVIRONMENTS_SHOWN = 5  # named on a campaign's page; more are counted as "and more"


def campaign_live(request, pk):
    """The live part of the campaign page, polled by the page while runs are queued or running."""
    campaign = get_object_or_404(visible_campaigns(request.user).select_related("created_by", "cancelled_by"), pk=pk)
    return render(request, "runners/campaign_live.html", campaign_context(request, campaign))


@permission_required(TRIGGER_PERMISSION, raise_exception=True)
def workers(request):
    """The workers, latest seen first: what each offers, its queues and concurrency, and its GPUs' self-check."""
    rows = Worker.objects.order_by("-last_seen", "hostname")
    live = set(live_workers().values_list("pk", flat=True))
    return render(request, "runners/workers.html", {
        "workers": [(worker, worker.pk in live, describe_worker(worker)) for worker in rows[:200]],
        "window": settings.SILENTBENCH_WORKER_SEEN_MINUTES})


@permission_required(TRIGGER_PERMISSION, raise_exception=True)
def campaign_new(request):
    """Pick bugs, detectors, variants and seeds; see the run count and estimated time; then confirm."""
    form = CampaignForm(request.POST or None)
    preview = None
    if request.method == "POST" and form.is_valid():
        plan = form.plan
        plan_digest = plan.digest()
        if "confirm" in request.POST and request.POST.get("plan") == plan_digest:
            campaign = do_create_campaign(form.cleaned_data["name"], plan, acting_user=request.user)
            messages.success(request, f"Campaign queued: {len(plan.runs)} runs.")
            return redirect(campaign)
        if "confirm" in request.POST:
            messages.warning(request, "The choices changed since the preview: check the new count, then confirm.")
        preview = {**plan.estimate(), "versions": plan.versions, "plan": plan_digest,
                   "workers": live_workers().count(), "window": settings.SILENTBENCH_WORKER_SEEN_MINUTES}
        preview["minutes"] = math.ceil(preview["seconds"] / 60)
        preview["minutes_spread"] = math.ceil(preview["seconds"] / 60 / max(1, preview["workers"]))
    return render(request, "runners/campaign_new.html", {
        "form": form, "preview": preview,
        "detector_descriptions": [(name, plugin.description) for name, plugin in campaign_plugins().items()]})


@require_POST
@permission_required(TRIGGER_PERMISSION, raise_exception=True)
def campaign_cancel(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    cancelled = do_cancel_campaign(campaign, acting_user=request.user)
    messages.info(request, f"Cancelled {len(cancelled)} queued run(s); runs already executing finish.")
    return redirect(campaign)


@require_POST
@permission_required(TRIGGER_PERMISSION, raise_exception=True)
def campaign_retry(request, pk):
    """Retry the failed and cancelled runs of the kinds ticked (a form without the boxes: all of them)."""
    campaign = get_object_or_404(Campaign, pk=pk)
    form = RetryForm(request.POST, present=breakdown(failure_counts(campaign.runs.all())))
    if not form.is_valid():
        messages.warning(request, " ".join(form.errors.get("kind", form.non_field_errors())))
        return redirect(campaign)
    kinds = form.kinds()
    try:
        queued = do_retry_failed_runs(campaign, kinds=kinds, acting_user=request.user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect(campaign)
    which = f" ({', '.join(kind.label.lower() for kind in kinds)})" if kinds is not None else ""
    messages.info(request, f"Queued {len(queued)} failed or cancelled run(s) again{which}.")
    return redirect(campaign)


# The plotly.js version is in the URL, so a browser may keep the file for a year and never ask again.
PLOTLY_JS_PATH = f"vendor/plotly-{get_plotlyjs_version()}.min.js"
ACCEPTS_GZIP = re.compile(r"\bgzip\b")


@cache
def _plotly_js():
    """plotly.min.js from the installed plotly package, plain and gzipped, made once per process."""
    script = get_plotlyjs().encode()
    return script, gzip.compress(script, mtime=0)


@cache_control(public=True, max_age=365 * 24 * 3600, immutable=True)
@vary_on_headers("Accept-Encoding")
def plotly_js(request):
    """plotly.js from the installed plotly package: nothing is fetched from a CDN. Gzipped to clients that
    accept it (1.5 MB instead of 4.8 MB)."""
    script, gzipped = _plotly_js()
    if not ACCEPTS_GZIP.search(request.headers.get("Accept-Encoding", "")):
        return HttpResponse(script, content_type="application/javascript")
    response = HttpResponse(gzipped, content_type="application/javascript")
    response["Content-Encoding"] = "gzip"
    return response
