from functools import cache, lru_cache

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import ValidationError
from django.db.models import Count, Prefetch
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST
from django_filters.views import FilterView
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_for_filename
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

from core.caching import cached, digest, kept_for_rows, shown_on
from core.models import AuditEvent

from .actions import do_hold_out_bug, do_publish_bug
from .exports import catalog_bugs
from .filters import BugFilter
from .models import Bug, Reproducer, ReproducerVersion
from .permissions import APPROVE_PERMISSION
from .selectors import held_out_labels, visible_bugs, visible_reproducers, visible_versions

CATALOG_TABLES = (Bug, Reproducer, ReproducerVersion)  # what the catalog's own part of its pages reads


class BugListView(FilterView):
    filterset_class = BugFilter
    template_name = "bugs/bug_list_content.html"
    paginate_by = 50
    # the fields its rows show: the rows are rendered once for the same such values (bug_list_content.html)
    shown = ("bug_id", "title", "framework", "fault_location", "reproduction", "needs_cuda_original", "multi_rank",
             "status", "held_out", "held_out_number")

    def get(self, request, *args, **kwargs):
        """The content is rendered once for the same rows of the catalog's tables and of what the other apps' template
        tags render on it (its stability column, "caught by" and leaderboard box: ``core.caching.shown_on``), query
        string and reader, unless a part of it may still change (a leaderboard over an open campaign)."""
        content = kept_for_rows(request, "catalog", (*CATALOG_TABLES, *shown_on("catalog")),
                                lambda: super(BugListView, self).get(request, *args, **kwargs).rendered_content)
        return render(request, "bugs/bug_list.html", {"content": content})

    def get_queryset(self):
        return catalog_bugs(self.request.user).only(*self.shown)

    def get_context_data(self, **kwargs):
        """The filter's fields are rendered once per query string (their choices are fixed: bugs.filters), as
        Django renders each widget and option through a template."""
        context = super().get_context_data(**kwargs)
        key = f"catalog-filter:{digest(self.request.GET.urlencode())}"
        context["filter_fields"] = cached(key, lambda: render_to_string("bugs/bug_filter_fields.html",
                                                                        {"filter": context["filter"]}))
        context["held_out_labels"] = held_out_labels()
        return context


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
    # Numbers inline, in the line they number: in a column of their own they fell out of step with code lines
    # that wrap, and a two-digit number broke across lines on a phone.
    return highlight(text, lexer, HtmlFormatter(cssclass="code", linenos="inline"))


def reproducer_cards(reproducers, user):
    """What a reproducer card shows: the files of its latest approved version, or, while none is approved,
    of its latest version that ``user`` may see (their own submission, or any for a maintainer), highlighted,
    and how many versions ``user`` may see (the runs and the stability checks are added by runners'
    ``execution_of`` template tag).

    Four queries whatever the number of reproducers (a bug page must not grow with its history).
    """
    reproducers = list(reproducers)
    ids = [reproducer.pk for reproducer in reproducers]
    versions_of = visible_versions(user).filter(reproducer__in=ids)
    latest_ids = {**versions_of.latest_ids(), **versions_of.approved().latest_ids()}
    version_counts = dict(versions_of.order_by().values_list("reproducer").annotate(n=Count("id")))
    versions = ReproducerVersion.objects.in_bulk(latest_ids.values())
    cards = []
    for reproducer in reproducers:
        version = versions.get(latest_ids.get(reproducer.pk))
        files = [(name, highlighted(name, text)) for name, text in sorted(version.files.items())] if version else []
        cards.append({"reproducer": reproducer, "version": version, "files": files,
                      "version_count": version_counts.get(reproducer.pk, 0)})
    return cards


@cache
def pygments_css():
    return HtmlFormatter(cssclass="code").get_style_defs(".code")


def bug_page_rows(bug):
    """The rows ``bug``'s page shows, as ``core.caching.rows_state`` takes them: the catalog's tables, what the other
    apps' template tags render on it (its runs, detections, stability checks and bisections: ``shown_on``, which
    reads the bug's runs that may still change) and the events about it."""
    return (*CATALOG_TABLES, *shown_on("bug", bug), AuditEvent.objects.about(bug))


# What a plot leaves in a page's HTML (templates/evaluation/chart.html): its figure, for static/js/charts.js to draw.
PLOT_MARK = 'class="plot" data-figure='


def bug_detail(request, bug_id):
    """A bug's page; its content is rendered once for the same rows it shows (``bug_page_rows``: its tables, the
    bug's runs and its history), query string and reader, unless a part of it may still change."""
    bug = get_object_or_404(visible_bugs(request.user), bug_id=bug_id)
    content = kept_for_rows(request, f"bug-page:{bug.pk}", bug_page_rows(bug), lambda: render_to_string(
        "bugs/bug_detail_content.html",
        {"bug": bug, "reproducers": reproducer_cards(visible_reproducers(request.user).filter(bug=bug), request.user)},
        request))
    return render(request, "bugs/bug_detail.html", {"bug": bug, "content": content, "pygments_css": pygments_css(),
                                                     "has_plot": PLOT_MARK in content})


HOLD_OUT_CHOICES = {"true": (do_hold_out_bug, "held out"), "false": (do_publish_bug, "published")}


@require_POST
@permission_required(APPROVE_PERMISSION, raise_exception=True)
def bug_held_out(request, bug_id):
    """A maintainer moves a bug into the held-out split (``held_out=true``) or back to the public (``false``)."""
    bug = get_object_or_404(visible_bugs(request.user), bug_id=bug_id)
    choice = HOLD_OUT_CHOICES.get(request.POST.get("held_out", ""))
    if choice is None:
        return HttpResponseBadRequest("Say held_out=true (hold the bug out) or held_out=false (publish it).",
                                      content_type="text/plain")
    action, done = choice
    try:
        bug = action(bug, acting_user=request.user)
    except ValidationError as error:
        messages.warning(request, " ".join(error.messages))
        return redirect(bug)
    messages.success(request, f"{bug.bug_id} is {done}" + (f" as {bug.held_out_label}." if bug.held_out else "."))
    return redirect(bug)


def pipeline_list(request):
    pipelines = (visible_reproducers(request.user).reference_pipelines()
                 .prefetch_related(Prefetch("versions", visible_versions(request.user).defer("files", "manifest")))
                 .order_by("name"))
    return render(request, "bugs/pipeline_list.html", {"pipelines": pipelines})


def pipeline_detail(request, name):
    pipeline = get_object_or_404(visible_reproducers(request.user).reference_pipelines(), name=name)
    return render(request, "bugs/pipeline_detail.html", {
        "pipeline": pipeline, "reproducers": reproducer_cards([pipeline], request.user), "pygments_css": pygments_css(),
    })
