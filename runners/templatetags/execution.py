"""What the catalog's pages show of execution: a bug's or pipeline's runs, its stability checks and their
history, and the verification of each submitted version. Tags, so that the catalog app (bugs) renders
them without importing runners (the apps depend one way: bugs <- runners <- evaluation)."""
from dataclasses import dataclass

from django import template
from django.core.paginator import Paginator
from django.db.models import Count, F, Max, Window
from django.db.models.functions import RowNumber

from bugs.models import Reproducer
from bugs.selectors import visible_reproducers
from core.caching import cached, digest
from core.enums import VerificationVerdict

from ..charts import stability_chart
from ..models import Campaign, CampaignPurpose, Run, StabilityCheck, runs_for_listing
from ..run_rows import run_rows
from ..selectors import visible_runs

register = template.Library()
VERSION_CONTENT = ("reproducer_version__files", "reproducer_version__manifest")


@register.simple_tag(takes_context=True)
def execution_of(context, cards, bug=None):
    """One page of the runs of the cards' reproducers (newest first), and the stability history of ``bug``.
    Sets each card's ``stability`` to its reproducer's last check. Four queries, whatever the history, and one
    more when the stability chart is drawn: once for the same checks (they are only ever added, or replaced by
    new rows when a verification is retried, so their count and last ID name them)."""
    ids = [card["reproducer"].pk for card in cards]
    checks = {check.reproducer_version.reproducer_id: check
              for check in last_checks(Reproducer.objects.filter(pk__in=ids))}
    for card in cards:
        card["stability"] = checks.get(card["reproducer"].pk)
    runs = visible_runs(context["request"].user, Run.objects.filter(reproducer_version__reproducer__in=ids))
    runs = runs_for_listing(runs.order_by("-queued_at", "-id"))
    page = Paginator(runs, 50).get_page(context["request"].GET.get("page"))
    chart = None
    if bug is not None:
        checks = StabilityCheck.objects.filter(reproducer_version__reproducer__bug=bug)
        chart = cached(f"stability-chart:{bug.pk}:{digest(checks.aggregate(n=Count('id'), last=Max('id')))}",
                       lambda: stability_chart(checks.select_related("environment", "reproducer_version__reproducer")
                                               .defer(*VERSION_CONTENT)))
    return {"runs_html": run_rows(page.object_list, context["request"].user, show_bug=False), "page_obj": page,
            "stability_chart": chart}


def _newest_per_reproducer(reproducers):
    """The stability checks of ``reproducers``, each numbered ``newest`` from 1, its reproducer's last check, in one
    pass over their index (a window function: no subquery per reproducer)."""
    newest_first = [F("checked_at").desc(), F("id").desc()]
    return StabilityCheck.objects.filter(reproducer_version__reproducer__in=reproducers).annotate(newest=Window(
        RowNumber(), partition_by=F("reproducer_version__reproducer"), order_by=newest_first))


def last_checks(reproducers):
    """The last stability check of each of ``reproducers`` that has one, with its environment and version."""
    return (_newest_per_reproducer(reproducers).filter(newest=1)
            .select_related("environment", "reproducer_version__reproducer").defer(*VERSION_CONTENT))


@dataclass(frozen=True)
class LastCheck:
    """What the catalog shows of a reproducer's last stability check."""

    reproducer: str
    verdict: str
    seeds: int
    buggy_manifested: int
    fixed_manifested: int

    def get_verdict_display(self):
        return VerificationVerdict(self.verdict).label


@register.simple_tag(takes_context=True)
def attach_stability(context, bugs):
    """Set ``stability`` on one page of the catalog's bugs: the last stability check (``LastCheck``) of each of their
    reproducers that the reader may see, by reproducer name. One query of plain values, whatever the history."""
    by_bug = {bug.pk: [] for bug in bugs}
    reproducers = visible_reproducers(context["request"].user).filter(bug__in=list(by_bug))
    checks = _newest_per_reproducer(reproducers).filter(newest=1).values_list(
        "reproducer_version__reproducer__bug", "reproducer_version__reproducer__name", "verdict", "seeds",
        "buggy_manifested", "fixed_manifested")
    for bug_id, *check in sorted(checks, key=lambda check: check[1]):
        by_bug[bug_id].append(LastCheck(*check))
    for bug in bugs:
        bug.stability = by_bug[bug.pk]
    return ""


@register.simple_tag
def attach_verifications(versions):
    """Set ``version.verification`` to the latest verification campaign that ran each version (or None), and
    ``version.stability`` to its latest stability check (the verdict's figures), or None."""
    latest = dict(Run.objects.filter(reproducer_version__in=versions, campaign__purpose=CampaignPurpose.VERIFICATION)
                  .values_list("reproducer_version_id").annotate(campaign=Max("campaign_id")))
    campaigns = Campaign.objects.in_bulk(latest.values())
    checks = {}
    for check in StabilityCheck.objects.filter(reproducer_version__in=versions).order_by("checked_at", "id"):
        checks[check.reproducer_version_id] = check  # the newest wins
    for version in versions:
        version.verification = campaigns.get(latest.get(version.pk))
        version.stability = checks.get(version.pk)
    return ""
