from functools import cache, lru_cache

from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django_filters.views import FilterView
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_for_filename
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

from core.caching import cached, digest

from .exports import catalog_bugs
from .filters import BugFilter
from .models import ReproducerVersion
from .selectors import visible_bugs, visible_reproducers, visible_versions


class BugListView(FilterView):
    filterset_class = BugFilter
    template_name = "bugs/bug_list.html"
    paginate_by = 50

    def get_queryset(self):
        return catalog_bugs(self.request.user)

    def get_context_data(self, **kwargs):
        """The filter's fields are rendered once per query string (their choices are fixed: bugs.filters), as
        Django renders each widget and option through a template."""
        context = super().get_context_data(**kwargs)
        key = f"catalog-filter:{digest(self.request.GET.urlencode())}"
        context["filter_fields"] = cached(key, lambda: render_to_string("bugs/bug_filter_fields.html",
                                                                        {"filter": context["filter"]}))
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
    return highlight(text, lexer, HtmlFormatter(cssclass="code", linenos="table"))


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


def bug_detail(request, bug_id):
    bug = get_object_or_404(visible_bugs(request.user), bug_id=bug_id)
    return render(request, "bugs/bug_detail.html", {
        "bug": bug, "reproducers": reproducer_cards(visible_reproducers(request.user).filter(bug=bug), request.user),
        "pygments_css": pygments_css(),
    })


def pipeline_list(request):
    pipelines = (visible_reproducers(request.user).filter(bug__isnull=True)
                 .prefetch_related(Prefetch("versions", visible_versions(request.user).defer("files", "manifest")))
                 .order_by("name"))
    return render(request, "bugs/pipeline_list.html", {"pipelines": pipelines})


def pipeline_detail(request, name):
    pipeline = get_object_or_404(visible_reproducers(request.user), bug__isnull=True, name=name)
    return render(request, "bugs/pipeline_detail.html", {
        "pipeline": pipeline, "reproducers": reproducer_cards([pipeline], request.user), "pygments_css": pygments_css(),
    })
