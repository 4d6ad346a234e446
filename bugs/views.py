from collections import Counter
from functools import cache, lru_cache

from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.shortcuts import get_object_or_404, render
from django_filters.views import FilterView
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_for_filename
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

from evaluation.charts import stability_chart
from runners.models import Run, runs_for_listing

from .exports import catalog_bugs
from .filters import BugFilter
from .models import Bug, Reproducer, ReproducerVersion, ReviewState, StabilityCheck

VERSION_CONTENT = ("reproducer_version__files", "reproducer_version__manifest")


class BugListView(FilterView):
    filterset_class = BugFilter
    template_name = "bugs/bug_list.html"
    paginate_by = 50

    def get_queryset(self):
        return catalog_bugs(self.request.user)


def highlighted(filename, text):
    """Pygments escapes the code itself, so hostile source is shown as text. Small files are cached
    (versions are immutable, and highlighting was a third of a bug page's time); a large one is not,
    so that uploads cannot fill a web process's memory."""
    if len(text) > HIGHLIGHT_CACHE_MAX_CHARS:
        return _highlight(filename, text)
    return _highlight_cached(filename, text)


HIGHLIGHT_CACHE_MAX_CHARS = 32 * 1024


@lru_cache(maxsize=128)
def _highlight_cached(filename, text):
    return _highlight(filename, text)


def _highlight(filename, text):
    try:
        lexer = get_lexer_for_filename(filename, stripnl=False)
    except ClassNotFound:
        lexer = TextLexer()
    return highlight(text, lexer, HtmlFormatter(cssclass="code", linenos="table"))


def reproducer_cards(reproducers):
    """What a reproducer card shows: its latest version's files, highlighted, and its last stability check.

    Four queries whatever the number of reproducers (a bug page must not grow with its history).
    """
    reproducers = list(reproducers)
    ids = [reproducer.pk for reproducer in reproducers]
    latest_ids, approved_ids, version_counts = {}, {}, Counter()
    for pk, reproducer_id, state in (ReproducerVersion.objects.filter(reproducer__in=ids)
                                     .order_by("reproducer_id", "-created_at", "-id")
                                     .values_list("pk", "reproducer_id", "review_state")):
        latest_ids.setdefault(reproducer_id, pk)
        if state == ReviewState.APPROVED:
            approved_ids.setdefault(reproducer_id, pk)
        version_counts[reproducer_id] += 1
    latest_ids.update(approved_ids)  # the code shown is the latest approved, while a newer one waits for review
    versions = ReproducerVersion.objects.in_bulk(latest_ids.values())
    last_check = (StabilityCheck.objects.filter(reproducer_version__reproducer=OuterRef("pk"))
                  .order_by("-checked_at", "-id").values("pk")[:1])
    checks = {check.reproducer_version.reproducer_id: check for check in StabilityCheck.objects.filter(
        pk__in=Reproducer.objects.filter(pk__in=ids).values(last=Subquery(last_check)))
        .select_related("environment", "reproducer_version").defer(*VERSION_CONTENT)}
    cards = []
    for reproducer in reproducers:
        version = versions.get(latest_ids.get(reproducer.pk))
        files = [(name, highlighted(name, text)) for name, text in sorted(version.files.items())] if version else []
        cards.append({"reproducer": reproducer, "version": version, "files": files,
                      "version_count": version_counts[reproducer.pk], "stability": checks.get(reproducer.pk)})
    return cards


def recent_runs(request, reproducers):
    """One page of the reproducers' runs, newest first (index on queued_at, id)."""
    runs = runs_for_listing(Run.objects.filter(reproducer_version__reproducer__in=reproducers)
                            .order_by("-queued_at", "-id"))
    return Paginator(runs, 50).get_page(request.GET.get("page"))


@cache
def pygments_css():
    return HtmlFormatter(cssclass="code").get_style_defs(".code")


def bug_detail(request, bug_id):
    bug = get_object_or_404(Bug.objects.visible_to(request.user), bug_id=bug_id)
    reproducers = Reproducer.objects.filter(bug=bug)
    runs = recent_runs(request, reproducers)
    return render(request, "bugs/bug_detail.html", {
        "bug": bug, "reproducers": reproducer_cards(reproducers), "runs": runs.object_list, "page_obj": runs,
        "pygments_css": pygments_css(),
        "stability_chart": stability_chart(StabilityCheck.objects.filter(reproducer_version__reproducer__bug=bug)
                                           .select_related("environment", "reproducer_version__reproducer")
                                           .defer(*VERSION_CONTENT)),
    })


def pipeline_list(request):
    pipelines = Reproducer.objects.filter(bug__isnull=True).prefetch_related("versions").order_by("name")
    return render(request, "bugs/pipeline_list.html", {"pipelines": pipelines})


def pipeline_detail(request, name):
    pipeline = get_object_or_404(Reproducer, bug__isnull=True, name=name)
    runs = recent_runs(request, [pipeline])
    return render(request, "bugs/pipeline_detail.html", {
        "pipeline": pipeline, "reproducers": reproducer_cards([pipeline]), "runs": runs.object_list, "page_obj": runs,
        "pygments_css": pygments_css(),
    })
