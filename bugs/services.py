"""State changes of the catalog, as named actions."""
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from .models import Bug, BugStatus, ReproducerVersion, ReviewState


def do_deprecate_bug(bug: Bug, reason: str, user=None) -> Bug:
    if user is not None and not user.has_perm("bugs.deprecate_bug"):
        raise PermissionDenied("Only maintainers can deprecate bugs.")
    if not reason.strip():
        raise ValidationError("A deprecated bug needs a reason.")
    bug.status = BugStatus.DEPRECATED
    bug.deprecation_reason = reason.strip()
    bug.save(update_fields=["status", "deprecation_reason", "updated_at"])
    return bug


@transaction.atomic
def do_review_version(version: ReproducerVersion, user, approve: bool, note: str = "") -> ReproducerVersion:
    """A maintainer approves (or rejects) one exact version; only approved versions ever execute."""
    if not user.has_perm("bugs.approve_reproducerversion"):
        raise PermissionDenied("Only maintainers can review reproducer code.")
    if not approve and not note.strip():
        raise ValidationError("A rejection needs a reason for the submitter.")
    version = ReproducerVersion.objects.select_for_update().get(pk=version.pk)
    version.review_state = ReviewState.APPROVED if approve else ReviewState.REJECTED
    version.reviewed_by = user
    version.reviewed_at = timezone.now()
    version.review_note = note.strip()
    version.save(update_fields=["review_state", "reviewed_by", "reviewed_at", "review_note"])
    bug = version.reproducer.bug
    if approve and bug.status == BugStatus.SUBMITTED:
        bug.status = BugStatus.APPROVED
        bug.save(update_fields=["status", "updated_at"])
    return version
