"""State changes of the catalog, as named actions."""
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from .catalog import content_hash, reproducer_fields, version_fields
from .models import Bug, BugStatus, Reproducer, ReproducerVersion, ReviewState
from .submissions import reproducer_problems


def do_deprecate_bug(bug: Bug, reason: str, user=None) -> Bug:
    if user is not None and not user.has_perm("bugs.deprecate_bug"):
        raise PermissionDenied("Only maintainers can deprecate bugs.")
    if not reason.strip():
        raise ValidationError("A deprecated bug needs a reason.")
    bug.status = BugStatus.DEPRECATED
    bug.deprecation_reason = reason.strip()
    bug.save(update_fields=["status", "deprecation_reason", "updated_at"])
    return bug


def can_resubmit(user, bug):
    """A bug's submitter, or a maintainer, may submit new versions of its reproducers."""
    return (user.is_authenticated and bug.status != BugStatus.DEPRECATED
            and (bug.submitted_by_id == user.pk or user.has_perm("bugs.approve_reproducerversion")))


@transaction.atomic
def do_submit_reproducer(user, files, reproducer_name="cpu", bug=None, bug_fields=None) -> ReproducerVersion:
    """A contributor's reproducer, stored as a version waiting for review. Nothing is queued or run.

    With ``bug_fields`` it files a new bug (its ID must be new: IDs are never reused); with ``bug``
    it is a new version of that bug's reproducer, for its submitter or a maintainer. Raises
    ValidationError with every problem found.
    """
    if not user.is_authenticated:
        raise PermissionDenied("Sign in to submit a bug.")
    manifest, problems = reproducer_problems(files)
    if bug is None:
        bug = Bug(**bug_fields, status=BugStatus.SUBMITTED, submitted_by=user)
        try:
            bug.full_clean()
        except ValidationError as error:
            problems = [f"{name}: {' '.join(messages)}" for name, messages in error.message_dict.items()] + problems
    elif not can_resubmit(user, bug):
        raise PermissionDenied(f"{bug.bug_id} was submitted by someone else; only they or a maintainer can "
                               f"submit new versions of it.")
    if problems:
        raise ValidationError(problems)
    if bug.pk is None:
        bug.save()
    # A new reproducer takes its manifest's needs now; an existing one only when a version is approved,
    # so that unreviewed code cannot re-route the runs of approved versions.
    reproducer, _ = Reproducer.objects.get_or_create(bug=bug, name=reproducer_name,
                                                     defaults=reproducer_fields(manifest))
    digest = content_hash(files, manifest)
    same = reproducer.versions.filter(content_hash=digest).first()
    if same is not None:
        raise ValidationError([f"These files are identical to version {same.short_hash} of {reproducer}: "
                               f"nothing new to review."])
    return ReproducerVersion.objects.create(
        reproducer=reproducer, content_hash=digest, files=files, manifest=manifest, submitted_by=user,
        review_state=ReviewState.PENDING, **version_fields(manifest))


@transaction.atomic
def do_review_version(version: ReproducerVersion, user, approve: bool, note: str = "",
                      verify: bool = True) -> ReproducerVersion:
    """A maintainer approves (or rejects) one exact version; only approved versions ever execute.

    Approving a bug's reproducer starts its verification (k seeds of buggy and fixed, no detector)
    once the transaction commits, unless ``verify`` is False.
    """
    if not user.has_perm("bugs.approve_reproducerversion"):
        raise PermissionDenied("Only maintainers can review reproducer code.")
    if not approve and not note.strip():
        raise ValidationError("A rejection needs a reason for the submitter.")
    version = ReproducerVersion.objects.select_for_update().get(pk=version.pk)
    if version.review_state != ReviewState.PENDING:
        raise ValidationError(f"{version} was already reviewed ({version.get_review_state_display().lower()}).")
    version.review_state = ReviewState.APPROVED if approve else ReviewState.REJECTED
    version.reviewed_by = user
    version.reviewed_at = timezone.now()
    version.review_note = note.strip()
    version.save(update_fields=["review_state", "reviewed_by", "reviewed_at", "review_note"])
    if approve and version.submitted_by_id is not None:
        Reproducer.objects.filter(pk=version.reproducer_id).update(**reproducer_fields(version.manifest))
    bug = version.reproducer.bug
    if approve and bug is not None and bug.status == BugStatus.SUBMITTED:
        bug.status = BugStatus.APPROVED
        bug.save(update_fields=["status", "updated_at"])
    if approve and bug is not None and verify:
        from runners.services import do_start_verification

        do_start_verification(user, [version], seeds=settings.SILENTBENCH_VERIFICATION_SEEDS)
    return version
