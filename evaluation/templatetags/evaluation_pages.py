"""What other apps' pages show of the evaluation: the catalog's leaderboard box and "caught by" column, a bug's
detections, a run's verdict and the verdict columns of run tables (the catalog and execution apps, bugs and
runners, must not import evaluation: the apps depend one way), and the methodology's Markdown blocks as HTML."""
from django import template

from core.markdown import markdown_inline_html
from runners.detectors.base import OPT_IN
from runners.permissions import TRIGGER_PERMISSION

from ..leaderboard import BASELINE, build_leaderboard
from ..methodology import to_html
from ..models import Device
from ..results import cached_for, latest_evaluation, results_viewer
from ..tables import integration_of
from ..verdicts import bug_detections, caught_by_in, headline_of, stored_bug_ids, table_verdicts
from ..versions import bug_version_rows

register = template.Library()


@register.filter
def marked_opt_in(detectors):
    """Detector names, an opt-in one marked so ("differential (opt-in)"): the reproducer helped it, and a bug it
    alone catches is caught by no drop-in detector."""
    return [f"{name} ({OPT_IN})" if integration_of(name) == OPT_IN else name for name in detectors]


@register.inclusion_tag("evaluation/leaderboard_box.html", takes_context=True)
def leaderboard_box(context, top=3):
    """The top rows of the latest stored evaluation's leaderboard that the reader may see. Only a stored one: the
    live tables over every run would judge the whole history on each view of the catalog."""
    return {"board": build_leaderboard({}, context["request"].user, stored_only=True), "top": top}


register.filter("as_html", to_html)
register.filter("as_inline_html", markdown_inline_html)


@register.simple_tag
def run_verdict(run, counterpart=None):
    """The one line that leads a run's page (``evaluation.verdicts.run_headline``)."""
    return headline_of(run, counterpart)


@register.simple_tag
def attach_run_verdicts(runs, member=""):
    """Set on each run of one page of runs, with one grouped query: ``alarm_count``, ``verdict`` (a ``RunVerdict``,
    None unless the run succeeded), ``detected_at`` (the first qualifying alarm's step, or None) and ``baseline``
    (no detector ran). ``runs`` must be the very list or page the table then iterates. ``member``: a list of one
    detector's runs judges a bundle's runs by that member's alarms only."""
    verdicts = table_verdicts(runs, member)
    for run in runs:
        run.alarm_count, run.verdict = verdicts[run.pk]
        detected = run.verdict is not None and run.verdict.detected
        run.detected_at = (run.trigger_step or 0) + run.verdict.latency_steps if detected else None
        run.baseline = run.detector.name == BASELINE
    return ""


@register.simple_tag(takes_context=True)
def detections_of(context, bug):
    """How each detector fares on ``bug`` (``evaluation.verdicts.BugDetections``), as the reader may see it."""
    return bug_detections(bug, context["request"].user)


@register.simple_tag(takes_context=True)
def attach_caught_by(context, bugs):
    """Set ``caught_by`` (detectors that detect the bug beyond its fixed twin) on one page of the catalog, from the
    latest stored CPU evaluation the reader may see, which it returns, and for a bug it did not run (one only GPUs
    run), from the latest GPU evaluation (``caught_on_gpu``), returned when there is no CPU one (None: neither).
    Only stored ones, as for the leaderboard box: judging every run on each view of the catalog would not scale."""
    viewer = results_viewer(context["request"].user)
    evaluation, gpu = latest_evaluation(viewer), latest_evaluation(viewer, Device.GPU)
    for shown in (evaluation, gpu):  # a bug the CPU evaluation did not run (one only GPUs run): the GPU one's
        if shown is not None:
            caught = cached_for(shown, "caught-by", lambda shown=shown: caught_by_in(shown, stored_bug_ids(shown)))
            for bug in bugs:
                if getattr(bug, "caught_by", None) is None:
                    bug.caught_by = caught.get(bug.bug_id)
                    bug.caught_on_gpu = shown is gpu and bug.caught_by is not None
    return evaluation or gpu


@register.inclusion_tag("evaluation/versions_bug.html", takes_context=True)
def versions_of(context, bug):
    """``bug``'s rows of the newest version matrix the reader may see, its latest bisections, and for maintainers
    the way to start one (evaluation.versions, evaluation.bisections)."""
    user = context["request"].user
    return {"bug": bug, "versions": bug_version_rows(bug, user), "bisections": bug.bisections.all()[:5],
            "can_bisect": user.has_perm(TRIGGER_PERMISSION)}
