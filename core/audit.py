"""Recording state changes in the audit trail (core.models.AuditEvent)."""
from django.contrib.contenttypes.models import ContentType

from .enums import AuditAction
from .models import AuditEvent

SYSTEM = "the system"


def actor_label(acting_user):
    """How an event names who acted: the user's name, or "the system" (workers, the reconciler and the
    operator's management commands act without a user)."""
    return acting_user.get_username() if acting_user is not None else SYSTEM


def record(acting_user, action: AuditAction, target, summary: str, **detail) -> AuditEvent:
    """Add one event about ``target``; call it inside the action's transaction, so both land or neither."""
    return AuditEvent.objects.create(
        actor=acting_user, actor_label=actor_label(acting_user), action=action,
        target_type=ContentType.objects.get_for_model(target), target_id=str(target.pk), target_label=str(target)[:300],
        summary=summary, detail=detail)
