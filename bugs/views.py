from functools import cache

from django.db.models import Count
from django.shortcuts import get_object_or_404, render
from django_filters.views import FilterView
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_for_filename
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

from evaluation.charts import stability_chart
from runners.models import Run

from .filters import BugFilter
from .models import Bug, Reproducer, StabilityCheck


class BugListView(FilterView):
    filterset_class = BugFilter
    template_name = "bugs/bug_list.html"
    paginate_by = 50

    def get_queryset(self):
        return Bug.objects.annotate(reproducer_count=Count("reproducers")).order_by("bug_id")


def highlighted(filename, text):
    """Pygments escapes the code itself, so hostile source is shown as text."""
    try:
        lexer = get_lexer_for_filename(filename, stripnl=False)
    except ClassNotFound:
        lexer = TextLexer()
    return highlight(text, lexer, HtmlFormatter(cssclass="code", linenos="table"))


def reproducer_cards(reproducers):
    """What a reproducer card shows: its latest version's files, highlighted, and its last stability check."""
    cards = []
    for reproducer in reproducers:
        version = reproducer.latest_version()
        files = [(name, highlighted(name, text)) for name, text in sorted(version.files.items())] if version else []
        stability = (StabilityCheck.objects.filter(reproducer_version__reproducer=reproducer)
                     .select_related("environment", "reproducer_version").first())
        cards.append({"reproducer": reproducer, "version": version, "files": files,
                      "version_count": reproducer.versions.count(), "stability": stability})
    return cards


def recent_runs(reproducers):
    return (Run.objects.filter(reproducer_version__reproducer__in=reproducers)
            .select_related("detector", "reproducer_version__reproducer").order_by("-queued_at", "-id")[:50])


@cache
def pygments_css():
    return HtmlFormatter(cssclass="code").get_style_defs(".code")


def bug_detail(request, bug_id):
    bug = get_object_or_404(Bug, bug_id=bug_id)
    reproducers = Reproducer.objects.filter(bug=bug)
    return render(request, "bugs/bug_detail.html", {
        "bug": bug, "reproducers": reproducer_cards(reproducers), "runs": recent_runs(reproducers),
        "pygments_css": pygments_css(),
        "stability_chart": stability_chart(StabilityCheck.objects.filter(reproducer_version__reproducer__bug=bug)
                                           .select_related("environment", "reproducer_version__reproducer")),
    })


def pipeline_list(request):
    pipelines = Reproducer.objects.filter(bug__isnull=True).prefetch_related("versions").order_by("name")
    return render(request, "bugs/pipeline_list.html", {"pipelines": pipelines})


def pipeline_detail(request, name):
    pipeline = get_object_or_404(Reproducer, bug__isnull=True, name=name)
    return render(request, "bugs/pipeline_detail.html", {
        "pipeline": pipeline, "reproducers": reproducer_cards([pipeline]), "runs": recent_runs([pipeline]),
        "pygments_css": pygments_css(),
    })
