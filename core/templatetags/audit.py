"""``{% audit_trail obj %}``: the recorded changes of one object (core.models.AuditEvent), newest first."""
from django import template

from ..models import AuditEvent

register = template.Library()
SHOWN = 50


@register.inclusion_tag("core/audit_trail.html")
def audit_trail(target, title="History", run_details=True):
    """``run_details``: whether a retry's record lists what each run had been (its failure reason names the run's
    bug): false for a reader who may not see every run of the target."""
    events = list(AuditEvent.objects.about(target).select_related("actor")[:SHOWN + 1])
    return {"events": events[:SHOWN], "more": len(events) > SHOWN, "title": title, "run_details": run_details}
