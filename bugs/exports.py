"""The catalog as a table: /catalog.<fmt> downloads and ``manage.py export catalog``, filtered by the
catalog page's query string (BugFilter), in the formats of the results tables."""
import pandas as pd
from django.db.models import Count, Q
from django.http import Http404, HttpResponseBadRequest

from core.exports import EXPORT_FORMATS, download

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


def catalog_export(request, fmt):
    if fmt not in EXPORT_FORMATS:
        raise Http404("Unknown format.")
    bugs = catalog_filter(request.GET, request.user)
    if not bugs.is_valid():
        return HttpResponseBadRequest(f"Invalid filter: {bugs.errors.as_text()}", content_type="text/plain")
    return download("catalog", catalog_table(bugs.qs), fmt)
