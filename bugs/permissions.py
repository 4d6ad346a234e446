"""Who may do what to the catalog, and who may see what of it. Views, the API and the admin check these at
the edge; the actions themselves (bugs.actions) only enforce the domain's rules, and the read paths take
what they show from bugs.selectors, which asks ``sees_unreviewed``."""
from rest_framework import permissions

from .models import BugStatus

APPROVE_PERMISSION = "bugs.approve_reproducerversion"  # a maintainer's (BugsConfig.maintainer_permissions)


def can_review(user):
    return user.is_authenticated and user.has_perm(APPROVE_PERMISSION)


def sees_unreviewed(user):
    """Whoever reviews code also sees what waits for review: every submitted bug and every version,
    pending or rejected, whoever submitted it. Others see the public catalog and their own submissions."""
    return user is not None and can_review(user)


def can_resubmit(user, bug):
    """A bug's submitter, or a maintainer, may submit new versions of its reproducers."""
    return (user.is_authenticated and bug.status != BugStatus.DEPRECATED
            and (bug.submitted_by_id == user.pk or can_review(user)))


class CanReview(permissions.BasePermission):
    """The API's edge for approving and rejecting code (maintainers)."""

    message = "Only maintainers can review reproducer code."

    def has_permission(self, request, view):
        return can_review(request.user)
