"""``{% audit_trail obj %}``: the recorded changes of one object (core.models.AuditEvent), newest first."""
from django import template

from ..models import AuditEvent

register = template.Library()
SHOWN = 50


@register.inclusion_tag("core/audit_trail.html")
def audit_trail(target, title="History"):
    events = list(AuditEvent.objects.about(target).select_related("actor")[:SHOWN + 1])
    return {"events": events[:SHOWN], "more": len(events) > SHOWN, "title": title}
