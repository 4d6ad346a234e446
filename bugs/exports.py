"""The catalog as a table: /catalog.<fmt> downloads and ``manage.py export catalog``, filtered by the
catalog page's query string (BugFilter), in the formats of the results tables. In LaTeX it is the paper's
table of bugs, with titles and root causes as paragraphs and without the links, versions and flags (CSV and JSON
have every column)."""
import pandas as pd
from django.db.models import Count, Q
from django.http import Http404, HttpResponseBadRequest

from core.exports import EXPORT_FORMATS, Table, table_download

from .filters import BugFilter
from .selectors import visible_bugs, visible_reproducers

CATALOG_COLUMNS = [
    "bug", "title", "framework", "framework_versions", "fault_location", "root_cause_category", "reproduction",
    "status", "needs_cuda_original", "multi_rank", "reproducers", "upstream_issue_url", "fix_url",
]


def catalog_bugs(user=None):
    """The bugs the catalog page lists to ``user`` (None: the public), before its filter."""
    shown = Q(reproducers__in=visible_reproducers(user))
    return visible_bugs(user).annotate(reproducer_count=Count("reproducers", filter=shown)).order_by("bug_id")


def catalog_filter(query, user=None):
    return BugFilter(query, queryset=catalog_bugs(user))


def catalog_table(bugs):
    return pd.DataFrame([[
        bug.bug_id, bug.title, bug.get_framework_display(), bug.framework_versions,
        bug.get_fault_location_display(), bug.root_cause_category, bug.get_reproduction_display(),
        bug.get_status_display(), bug.needs_cuda_original, bug.multi_rank, bug.reproducer_count,
        bug.upstream_issue_url, bug.fix_url,
    ] for bug in bugs], columns=CATALOG_COLUMNS, dtype=object)


# column -> header of the LaTeX table, and the paragraph columns' widths (a bug ID breaks at its hyphens)
PAPER_HEADERS = {
    "bug": "bug", "title": "title", "framework": "framework", "fault_location": "fault in",
    "root_cause_category": "root cause", "reproduction": "reproduction", "status": "status",
}
PARAGRAPHS = {"bug": "p{2.6cm}", "title": "p{4cm}", "framework": "p{1.8cm}", "root cause": "p{2.6cm}"}


def catalog_export_table(bugs):
    """The catalog's rows as an export, with its LaTeX layout."""
    frame = catalog_table(bugs)
    return Table(
        "catalog", frame, paper=frame[list(PAPER_HEADERS)].rename(columns=PAPER_HEADERS), align=PARAGRAPHS,
        caption=f"The SilentBench catalog: {len(frame)} silent training bug{'s' if len(frame) != 1 else ''}, "
                "the framework and where its fault lives, its root cause, how its reproducer makes it happen "
                "(faithful: the original code path; injected: the fault put back into a working program) and "
                "its verification status.")


def catalog_export(request, fmt):
    if fmt not in EXPORT_FORMATS:
        raise Http404("Unknown format.")
    bugs = catalog_filter(request.GET, request.user)
    if not bugs.is_valid():
        return HttpResponseBadRequest(f"Invalid filter: {bugs.errors.as_text()}", content_type="text/plain")
    return table_download(catalog_export_table(bugs.qs), fmt)
