"""What each user may see of the catalog (docs/accounts.md, "Who sees what"). Every read path (pages, API
and its nested serializers, filters, exports) takes bugs, reproducers and versions from here; runs and
campaigns follow the versions (runners.selectors).

Public: bugs past their first approval, and approved versions of them (or of clean pipelines). A bug
still waiting for its first approval and a version pending or rejected are seen only by whoever submitted
it and by the maintainers (``bugs.permissions.sees_unreviewed``)."""
from django.db.models import Q

from .models import Bug, BugStatus, Reproducer, ReproducerVersion, ReviewState
from .permissions import sees_unreviewed


def _submitted_by(user):
    return Q(submitted_by=user) if user is not None and user.is_authenticated else Q(pk__in=[])


def visible_bugs(user):
    """The bugs ``user`` may see (None: the public)."""
    if sees_unreviewed(user):
        return Bug.objects.all()
    return Bug.objects.filter(~Q(status=BugStatus.SUBMITTED) | _submitted_by(user))


def visible_versions(user):
    """The reproducer versions, files included, that ``user`` may see (None: the public)."""
    if sees_unreviewed(user):
        return ReproducerVersion.objects.all()
    public = Q(review_state=ReviewState.APPROVED) & (
        Q(reproducer__bug__isnull=True) | ~Q(reproducer__bug__status=BugStatus.SUBMITTED))
    return ReproducerVersion.objects.filter(public | _submitted_by(user))


def hidden_versions(user):
    """The versions ``user`` may not see, as a query to nest in another (their number grows with every
    rejection), or None when they see every version (runners.selectors)."""
    if sees_unreviewed(user):
        return None
    return ReproducerVersion.objects.exclude(pk__in=visible_versions(user).values("pk"))


def visible_reproducers(user):
    """Reproducers with at least one version ``user`` may see (a reproducer's fields come from its first
    version's manifest, so one added by an unreviewed submission stays hidden with it)."""
    return Reproducer.objects.filter(pk__in=visible_versions(user).values("reproducer"))
