"""Recording state changes in the audit trail (core.models.AuditEvent)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.contenttypes.models import ContentType

from .enums import AuditAction
from .models import AuditEvent

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, User
    from django.db.models import Model

SYSTEM = "the system"


def actor_label(acting_user: AbstractBaseUser | None) -> str:
    """How an event names who acted: the user's name, or "the system" (workers, the reconciler and the
    operator's management commands act without a user)."""
    return acting_user.get_username() if acting_user is not None else SYSTEM


def record(acting_user: User | None, action: AuditAction, target: Model, summary: str, **detail: object) -> AuditEvent:
    """Add one event about ``target``; call it inside the action's transaction, so both land or neither."""
    return AuditEvent.objects.create(
        actor=acting_user, actor_label=actor_label(acting_user), action=action,
        target_type=ContentType.objects.get_for_model(target), target_id=str(target.pk), target_label=str(target)[:300],
        summary=summary, detail=detail)
