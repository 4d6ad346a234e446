"""What each user may see of the catalog (docs/accounts.md, "Who sees what"). Every read path (pages, API
and its nested serializers, filters, exports) takes bugs, reproducers and versions from here; runs and
campaigns follow the versions (runners.selectors).

Public: bugs past their first approval, and approved versions of them (or of clean pipelines). A bug
still waiting for its first approval and a version pending or rejected are seen only by whoever submitted
it and by the maintainers (``bugs.permissions.sees_unreviewed``).

Held out (docs/methodology.md, "Held-out bugs"): a bug a maintainer held out (``Bug.held_out``), its versions
and so its runs are seen by the maintainers only, its submitter included among those who may not; everyone
else sees only its opaque label (``Bug.held_out_label``) and aggregate scores that count it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import Q, QuerySet

from core.caching import digest, per_request
from core.enums import ReviewState

from .models import Bug, BugStatus, Reproducer, ReproducerVersion
from .permissions import sees_unreviewed

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


def _submitted_by(user: AbstractBaseUser | AnonymousUser | None) -> Q:
    return Q(submitted_by=user) if user is not None and user.is_authenticated else Q(pk__in=[])


def sees_held_out(user: AbstractBaseUser | AnonymousUser | None) -> bool:
    """Whoever reviews code (the maintainers) also sees the held-out bugs; nobody else does."""
    return sees_unreviewed(user)


def visible_bugs(user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[Bug]:
    """The bugs ``user`` may see (None: the public)."""
    if sees_held_out(user):
        return Bug.objects.all()
    return Bug.objects.filter(~Q(status=BugStatus.SUBMITTED) | _submitted_by(user)).exclude(held_out=True)


def visible_versions(user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[ReproducerVersion]:
    """The reproducer versions, files included, that ``user`` may see (None: the public)."""
    if sees_unreviewed(user):
        return ReproducerVersion.objects.all()
    public = Q(review_state=ReviewState.APPROVED) & (
        Q(reproducer__bug__isnull=True) | ~Q(reproducer__bug__status=BugStatus.SUBMITTED))
    return ReproducerVersion.objects.filter(public | _submitted_by(user)).exclude(reproducer__bug__held_out=True)


def hidden_versions(user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[ReproducerVersion] | None:
    """The versions ``user`` may not see (unreviewed ones and those of held-out bugs), as a query to nest in another
    (their number grows with every rejection), or None when they see every version (runners.selectors)."""
    if sees_unreviewed(user):
        return None
    return ReproducerVersion.objects.exclude(pk__in=visible_versions(user).values("pk"))


def visible_reproducers(user: AbstractBaseUser | AnonymousUser | None) -> QuerySet[Reproducer]:
    """Reproducers with at least one version ``user`` may see (a reproducer's fields come from its first
    version's manifest, so one added by an unreviewed submission stays hidden with it)."""
    return Reproducer.objects.filter(pk__in=visible_versions(user).values("reproducer"))


def held_out_labels() -> list[str]:
    """The public labels of the held-out bugs, in the order they were held out: all the public sees of them."""
    return [bug.held_out_label for bug in Bug.objects.filter(held_out=True).only("held_out_number")
            .order_by("held_out_number")]


@per_request
def held_out_bug_ids() -> frozenset[str]:
    """The IDs of the held-out bugs, as a frozenset (asked once per request)."""
    return frozenset(Bug.objects.filter(held_out=True).values_list("bug_id", flat=True))


@per_request
def held_out_state() -> str:
    """Which bugs are held out and since when, as a short digest: a value computed for a reader who may not see them
    is kept under a key that names it, so that holding a bug out (or publishing it) is a new key."""
    return digest(list(Bug.objects.filter(held_out=True).order_by("pk").values_list("pk", "held_out_at")))


def held_out_view(user: AbstractBaseUser | AnonymousUser | None) -> str:
    """Whose view of the held-out bugs ``user`` has, in a cache key: every bug ("all"), or the public's of the bugs
    held out now."""
    return "all" if sees_held_out(user) else f"public-{held_out_state()}"
