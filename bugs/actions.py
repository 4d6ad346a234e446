"""State changes of the catalog, as named actions. Each takes the acting user (None: the system or the
operator's own command) and leaves an audit record; permissions are checked by the callers
(bugs.permissions), so an action only enforces the domain's rules."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from core import audit
from core.enums import AuditAction, ReviewState, VerificationVerdict
from core.review import record_review

from .catalog import content_hash, reproducer_fields, version_fields
from .models import Bug, BugStatus, Reproducer, ReproducerVersion
from .signals import version_approved
from .submissions import reproducer_problems

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.db.models import Model


@transaction.atomic
def do_deprecate_bug(bug: Bug, reason: str, *, acting_user: User | None) -> Bug:
    """Retire a bug (never deleted; its ID is never reused)."""
    if not reason.strip():
        raise ValidationError("A deprecated bug needs a reason.")
    previous = bug.status
    bug.status = BugStatus.DEPRECATED
    bug.deprecation_reason = reason.strip()
    bug.save(update_fields=["status", "deprecation_reason", "updated_at"])
    audit.record(acting_user, AuditAction.DEPRECATE, bug, f"deprecated {bug.bug_id}: {bug.deprecation_reason}",
                 previous_status=previous)
    return bug


def do_set_verification_verdict(bug: Bug, verdict: str, *, acting_user: User | None = None,
                                campaign: Model | None = None) -> bool:
    """A verification's verdict becomes the bug's status (verified, flaky or unreproducible); a deprecated
    bug keeps its status. True if the status was set."""
    if verdict not in VerificationVerdict.values:
        raise ValueError(f"{verdict!r} is not a verification verdict")
    with transaction.atomic():
        bug = Bug.objects.select_for_update().get(pk=bug.pk)
        if bug.status == BugStatus.DEPRECATED:
            return False
        previous = bug.status
        Bug.objects.filter(pk=bug.pk).update(status=verdict, updated_at=timezone.now())
        if previous != verdict:
            audit.record(acting_user, AuditAction.VERDICT, bug, f"{bug.bug_id} is {BugStatus(verdict).label.lower()}"
                         + (f" after {campaign}" if campaign else ""), previous_status=previous,
                         campaign=campaign.pk if campaign else None)
    return True


@transaction.atomic
def do_hold_out_bug(bug: Bug, *, acting_user: User | None) -> Bug:
    """Move a bug into the held-out split (docs/methodology.md, "Held-out bugs"): from now on only maintainers see
    its ID, fields, code and per-bug results; everyone else sees its label, "held-out #N" (a number never given
    before), and aggregate scores. Its held-out score counts only campaigns created after this moment
    (evaluation.held_out), so nothing a detector was tuned on while the bug was public is scored."""
    bug = Bug.objects.select_for_update().get(pk=bug.pk)
    if bug.held_out:
        raise ValidationError(f"{bug.bug_id} is already held out ({bug.held_out_label}).")
    # numbers are never reused, even those of bugs published since: the lock on the bug does not cover the other
    # rows, and the unique constraint refuses a number another hold-out took at the same time
    bug.held_out_number = (Bug.objects.aggregate(last=Max("held_out_number"))["last"] or 0) + 1
    bug.held_out, bug.held_out_at = True, timezone.now()
    bug.save(update_fields=["held_out", "held_out_at", "held_out_number", "updated_at"])
    audit.record(acting_user, AuditAction.HOLD_OUT, bug, f"held out {bug.bug_id} as {bug.held_out_label}",
                 label=bug.held_out_label, held_out_at=bug.held_out_at)
    return bug


@transaction.atomic
def do_publish_bug(bug: Bug, *, acting_user: User | None) -> Bug:
    """Move a held-out bug back to the public catalog: everything about it is public again, its per-bug results of
    every campaign included. Its label's number is kept (and never given again)."""
    bug = Bug.objects.select_for_update().get(pk=bug.pk)
    if not bug.held_out:
        raise ValidationError(f"{bug.bug_id} is not held out.")
    held_out_at = bug.held_out_at
    bug.held_out, bug.held_out_at = False, None
    bug.save(update_fields=["held_out", "held_out_at", "updated_at"])
    audit.record(acting_user, AuditAction.PUBLISH, bug,
                 f"published {bug.bug_id}, held out as {bug.held_out_label} since {held_out_at:%Y-%m-%d %H:%M} UTC",
                 label=bug.held_out_label, held_out_at=held_out_at)
    return bug


@transaction.atomic
def do_submit_reproducer(files: dict[str, str], reproducer_name: str = "cpu", bug: Bug | None = None,
                         bug_fields: dict[str, Any] | None = None, *, acting_user: User | None,
                         checked: tuple[dict[str, Any], list[str]] | None = None) -> ReproducerVersion:
    """A contributor's reproducer, stored as a version waiting for review. Nothing is queued or run.

    With ``bug_fields`` it files a new bug (its ID must be new: IDs are never reused); with ``bug``
    it is a new version of that bug's reproducer (the caller checked bugs.permissions.can_resubmit).
    ``checked`` is the ``(manifest, problems)`` that ``reproducer_problems(files)`` already gave for these
    same files, when the caller checked them first: the code is then not parsed a second time.
    Raises ValidationError with every problem found.
    """
    manifest, problems = checked if checked is not None else reproducer_problems(files)
    problems = list(problems)
    if bug is None:
        assert bug_fields is not None  # a new bug: its fields are given
        bug = Bug(**bug_fields, status=BugStatus.SUBMITTED, submitted_by=acting_user)
        try:
            bug.full_clean()
        except ValidationError as error:
            problems = [f"{name}: {' '.join(messages)}" for name, messages in error.message_dict.items()] + problems
    elif bug.status == BugStatus.DEPRECATED:
        problems = [f"{bug.bug_id} is deprecated: it takes no new versions."] + problems
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
    version = ReproducerVersion.objects.create(
        reproducer=reproducer, content_hash=digest, files=files, manifest=manifest, submitted_by=acting_user,
        review_state=ReviewState.PENDING, **version_fields(manifest))
    audit.record(acting_user, AuditAction.SUBMIT, version, f"submitted {version} for review")
    return version


@transaction.atomic
def do_review_version(version: ReproducerVersion, approve: bool, note: str = "", verify: bool = True, *,
                      acting_user: User | None) -> ReproducerVersion:
    """A maintainer approves (or rejects) one exact version; only approved versions ever execute.

    Approving a bug's reproducer starts its verification (k seeds of buggy and fixed, no detector;
    bugs.signals.version_approved, which runners receives) unless ``verify`` is False.
    """
    version = record_review(version, approve, note, acting_user)
    if approve and version.submitted_by_id is not None:
        Reproducer.objects.filter(pk=version.reproducer_id).update(**reproducer_fields(version.manifest))
    bug = version.reproducer.bug
    if approve and bug is not None and bug.status == BugStatus.SUBMITTED:
        bug.status = BugStatus.APPROVED
        bug.save(update_fields=["status", "updated_at"])
    summary = f"{'approved' if approve else 'rejected'} {version}" + (f": {version.review_note}" * bool(note.strip()))
    audit.record(acting_user, AuditAction.APPROVE if approve else AuditAction.REJECT, version, summary)
    if approve and bug is not None and verify:
        version_approved.send(sender=ReproducerVersion, version=version, acting_user=acting_user,
                              seeds=settings.SILENTBENCH_VERIFICATION_SEEDS)
    return version
