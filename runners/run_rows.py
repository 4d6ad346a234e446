"""The tables of runs on the campaign, bug and pipeline pages (templates/runners/run_rows.html), rendered once for
the same rows: a page of runs is read by its index and its rows named by every field the table shows. A run's
alarms change only with its status and attempt (``do_finish_run`` stores them as it sets ``finished_at``, a retry
deletes them as it queues the run again), so those fields name its verdict too."""
from django.contrib.auth.context_processors import PermWrapper
from django.template.loader import render_to_string

from core.caching import cached, digest

from .permissions import TRIGGER_PERMISSION

SHOWN = ("pk", "status", "failure_kind", "failure_reason", "manifested", "trigger_step", "wall_seconds", "attempts",
         "finished_at", "variant", "seed", "detector", "reproducer_version")


def run_rows(runs, user, show_bug, status="", kind=""):
    """The table of ``runs`` (a page of ``runners.models.runs_for_listing``) as ``user`` sees it; ``status`` and
    ``kind``: the filter that chose them, named when no run matches. The fields that name the rows are read
    first (plain values, no model instances); the runs themselves only to render a table not rendered yet."""
    rows = list(runs.values_list(*SHOWN))
    key = f"run-rows:{show_bug}:{user.has_perm(TRIGGER_PERMISSION)}:{status}:{kind}:{digest(rows)}"
    return cached(key, lambda: render_to_string("runners/run_rows.html", {
        "runs": list(runs), "show_bug": show_bug, "status": status, "kind": kind, "perms": PermWrapper(user)}))
