"""Who may do what to the catalog. Views, the API and the admin check these at the edge; the actions
themselves (bugs.actions) only enforce the domain's rules."""
from .models import BugStatus

APPROVE_PERMISSION = "bugs.approve_reproducerversion"


def can_review(user):
    return user.is_authenticated and user.has_perm(APPROVE_PERMISSION)


def can_resubmit(user, bug):
    """A bug's submitter, or a maintainer, may submit new versions of its reproducers."""
    return (user.is_authenticated and bug.status != BugStatus.DEPRECATED
            and (bug.submitted_by_id == user.pk or can_review(user)))
