"""Read-only questions about runs, workers and what can run, and what each user may see of runs, their
alarms and campaigns; the pages, the API, the commands and the actions share them (runners.actions writes)."""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from bugs.models import Bug, BugStatus, ReproducerVersion, Track
from bugs.selectors import held_out_bug_ids, hidden_versions, sees_held_out
from core.caching import per_request

from .detectors.bundle import Bundle, members_of
from .models import Alarm, Campaign, CampaignPurpose, Detector, Run, Worker

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


def runnable_versions(bug_ids: Iterable[str] | None = None, cuda: bool = False,
                      pipelines: bool = False) -> list[ReproducerVersion]:
    """The latest approved version of each reproducer (CPU ones unless ``cuda``), of the given
    bugs or of every bug that is not deprecated; of the clean reference pipelines if ``pipelines``. Never a
    historical reproducer: no environment today has the build that showed its bug."""
    versions = ReproducerVersion.objects.approved().filter(
        reproducer__needs_cuda=cuda, reproducer__bug__isnull=pipelines, reproducer__track=Track.CATALOG,
        reproducer__historical_reason="",
    ).exclude(reproducer__bug__status=BugStatus.DEPRECATED)
    if bug_ids is not None:
        versions = versions.filter(reproducer__bug__bug_id__in=bug_ids)
    return list(ReproducerVersion.objects.filter(pk__in=versions.latest_ids().values())
                .select_related("reproducer__bug").order_by("reproducer__bug__bug_id", "reproducer__name"))


def runs_that_may_change(bug: Bug) -> QuerySet[Run]:
    """The runs of ``bug`` that may still change, as the cache of its page reads them (core.caching.shown_on). A run is
    created with its campaign, and a completed campaign's runs change only by a retry, which reopens it
    (runners.completed): both change a Campaign row, so only the runs of open campaigns (and of none) are read, by
    their IDs from an index. A run's alarms are stored and deleted only with a change to the run (runners.run_rows)."""
    may_change = Run.objects.filter(reproducer_version__reproducer__bug=bug, campaign__completed_at=None)
    return Run.objects.filter(pk__in=may_change.values("pk"))


def live_workers(now: datetime | None = None) -> QuerySet[Worker]:
    """Workers seen within SILENTBENCH_WORKER_SEEN_MINUTES (their heartbeat keeps ``last_seen`` fresh)."""
    now = now or timezone.now()
    return Worker.objects.filter(last_seen__gte=now - timedelta(minutes=settings.SILENTBENCH_WORKER_SEEN_MINUTES))


def dispatched_runs() -> QuerySet[Run]:
    """The runs that go through the broker, which the reconciler looks after: all but those an overhead
    measurement creates and executes itself, one at a time (evaluation.overhead)."""
    return Run.objects.exclude(campaign__purpose=CampaignPurpose.OVERHEAD)


@per_request
def _hidden_versions_that_ran(user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[ReproducerVersion, Any] | None:
    """The hidden versions (bugs.selectors), as a subquery, when one of them has runs; else None. Code is hidden
    after it ran only rarely, and then nothing is filtered: one EXISTS query instead of an exclusion that scans
    every run or alarm counted, asked once per request (a page asks it for its runs, campaigns and evaluations)."""
    hidden = hidden_versions(user)
    if hidden is None or not hidden.filter(Exists(Run.objects.filter(reproducer_version=OuterRef("pk")))).exists():
        return None
    return hidden.values("pk")


def watched_by(names: Iterable[str]) -> Q:
    """The runs any of the detectors ``names`` watched: their own, and those of a bundle (runners.detectors.bundle)
    with one of them among its members."""
    names = set(names)
    bundles = [detector.pk for detector in Detector.objects.filter(name=Bundle.name).only("pk", "name", "config")
               if names & set(members_of(detector.name, detector.config))]
    return Q(detector__name__in=names) | Q(detector__in=bundles)


def watcher_names() -> list[str]:
    """The names of every detector recorded, a bundle's members in place of the bundle (one without members stays
    itself), sorted."""
    names: set[str] = set()
    for name, config in Detector.objects.values_list("name", "config"):
        names.update(members_of(name, config) or [name])
    return sorted(names)


def visible_runs(user: AbstractBaseUser | AnonymousUser | None, runs: QuerySet[Run] | None = None) -> QuerySet[Run]:
    """The runs (of ``runs``, default all) whose reproducer version ``user`` may see."""
    runs = Run.objects.all() if runs is None else runs
    hidden = _hidden_versions_that_ran(user)
    return runs if hidden is None else runs.exclude(reproducer_version__in=hidden)


def outside_sensitivity_track(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` but those of sensitivity campaigns (mutants, and clean pipelines at the track's own steps), which
    count only in the track's own tables (evaluation.sensitivity), never in the live tables of real bugs."""
    return runs.exclude(campaign__purpose=CampaignPurpose.SENSITIVITY)


def visible_alarms(user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[Alarm]:
    """The alarms of the runs ``user`` may see."""
    hidden = _hidden_versions_that_ran(user)
    alarms = Alarm.objects.all()
    return alarms if hidden is None else alarms.exclude(run__reproducer_version__in=hidden)


def counted_runs(user: AbstractBaseUser | AnonymousUser | None, runs: QuerySet[Run] | None = None) -> QuerySet[Run]:
    """The runs (of ``runs``, default all) whose results count in the aggregate tables ``user`` sees: the visible
    ones and those of held-out bugs, which a false-positive rate or a held-out score counts while their rows stay
    hidden (evaluation.results); never a run of unreviewed code, nor one of the sensitivity track."""
    runs = outside_sensitivity_track(Run.objects.all() if runs is None else runs)
    hidden = _hidden_versions_that_ran(user)
    return runs if hidden is None else runs.exclude(reproducer_version__in=_unreviewed(hidden))


def _unreviewed(hidden: QuerySet[ReproducerVersion, Any]) -> QuerySet[ReproducerVersion, Any]:
    """Of the hidden versions that ran, those hidden because their code is unreviewed, not because their bug is
    held out."""
    return hidden.exclude(reproducer__bug__held_out=True)


def visible_campaigns(user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[Campaign]:
    """The campaigns ``user`` may see: all of whose runs ran code that ``user`` may see (a campaign's name and
    counts speak of every run), except runs of held-out bugs, which their tables leave out (runners.views); but not
    a campaign that ran only held-out bugs (a verification of one), whose counts and tables would be that bug's."""
    hidden = _hidden_versions_that_ran(user)
    campaigns = Campaign.objects.all()
    if hidden is None:
        return campaigns
    # from the few runs of held-out bugs (the runs' index by version) to their campaigns, then one run of another bug
    # in each: no scan of a campaign that never ran a held-out bug
    held_out = "reproducer_version__reproducer__bug__held_out"
    other = Run.objects.filter(campaign=OuterRef("pk")).exclude(**{held_out: True})
    only_held_out = Campaign.objects.filter(pk__in=Run.objects.filter(**{held_out: True}).values("campaign")).exclude(
        Exists(other))
    return campaigns.exclude(runs__reproducer_version__in=_unreviewed(hidden)).exclude(pk__in=only_held_out)


def names_held_out_bug(text: str) -> bool:
    """Whether ``text`` holds the ID of a held-out bug, in any case."""
    folded = text.casefold()
    return any(bug_id.casefold() in folded for bug_id in held_out_bug_ids())


def shown_words(text: str, user: AbstractBaseUser | AnonymousUser | None, withheld: str) -> str:
    """Words a person or a command wrote (a campaign's name, an evaluation's command line) as ``user`` may read them:
    ``withheld`` instead when they hold a held-out bug's ID, unless a maintainer. The whole text is replaced, not the
    ID in it: what is left around a cut would say how the ID is spelled."""
    return text if sees_held_out(user) or not names_held_out_bug(text) else withheld


def shown_name(campaign: Campaign, user: AbstractBaseUser | AnonymousUser | None) -> str:
    """A campaign's name as ``user`` may read it (shown_words), wherever it is shown: pages (the ``campaign_name``
    filter), the API, the comparison's captions, the admin. The names the system gives hold no bug ID
    (runners.actions), but a maintainer may have typed one."""
    return shown_words(campaign.name, user, f"campaign #{campaign.pk} (name withheld)")


def shown_command(command: str, user: AbstractBaseUser | AnonymousUser | None) -> str:
    """An evaluation's recorded command line (``Evaluation.parameters["command"]``, which may name bugs:
    ``evaluate --bugs ...``) as ``user`` may read it (shown_words)."""
    return shown_words(command, user, "manage.py evaluate (its options are withheld: they name a held-out bug)")


def shows_every_run(campaign: Campaign, user: AbstractBaseUser | AnonymousUser | None) -> bool:
    """Whether ``user`` sees every run of ``campaign``, one they may see (visible_campaigns): all but the runs of
    held-out bugs, which only the maintainers see."""
    if sees_held_out(user) or not held_out_bug_ids():  # no bug held out: no need to look through its runs
        return True
    return not campaign.runs.filter(reproducer_version__reproducer__bug__held_out=True).exists()


def shown_parameters(campaign: Campaign, user: AbstractBaseUser | AnonymousUser | None) -> dict[str, Any]:
    """What ``user`` may read of a campaign's recorded plan (``CampaignPlan.parameters``): without the reproducers
    of held-out bugs (each recorded as "BUG-ID/name @ hash"), unless a maintainer."""
    parameters = campaign.parameters
    if sees_held_out(user) or not parameters.get("reproducers"):
        return parameters
    held_out = held_out_bug_ids()
    return {**parameters, "reproducers": [name for name in parameters["reproducers"]
                                          if name.split("/", 1)[0] not in held_out]}
