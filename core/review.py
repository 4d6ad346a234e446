"""The review of submitted code, the same for reproducer versions and detector versions: a maintainer approves or
rejects one exact pending version, a rejection with a reason for the submitter."""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from django.core.exceptions import ValidationError
from django.utils import timezone

from .enums import ReviewState

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class Reviewable(Protocol):
    """What ``record_review`` needs of a reviewed record (bugs.ReproducerVersion, runners.DetectorVersion)."""

    objects: ClassVar[Any]  # the model's own manager
    pk: Any
    review_state: str
    reviewed_by: User | None
    reviewed_at: datetime | None
    review_note: str

    def get_review_state_display(self) -> str: ...

    def save(self, *args: Any, **kwargs: Any) -> None: ...


ReviewableT = TypeVar("ReviewableT", bound=Reviewable)


def record_review(version: ReviewableT, approve: bool, note: str, acting_user: User | None) -> ReviewableT:
    """Store a maintainer's decision on ``version`` (a record with ``review_state``, ``reviewed_by``,
    ``reviewed_at`` and ``review_note``), locked for the rest of the transaction, and return it. A rejection
    without a reason, or a version already reviewed, is refused with a ValidationError."""
    if not approve and not note.strip():
        raise ValidationError("A rejection needs a reason for the submitter.")
    version = type(version).objects.select_for_update().get(pk=version.pk)
    if version.review_state != ReviewState.PENDING:
        raise ValidationError(f"{version} was already reviewed ({version.get_review_state_display().lower()}).")
    version.review_state = ReviewState.APPROVED if approve else ReviewState.REJECTED
    version.reviewed_by, version.reviewed_at, version.review_note = acting_user, timezone.now(), note.strip()
    version.save(update_fields=["review_state", "reviewed_by", "reviewed_at", "review_note"])
    return version
