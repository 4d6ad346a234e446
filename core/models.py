"""The audit trail: who changed what, and what it was before. Written by the ``do_*`` actions only."""
from django.conf import settings
from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from .enums import AuditAction


class AuditEventQuerySet(models.QuerySet):
    def about(self, target):
        """The events about one object (a campaign, a reproducer version, a bug), newest first."""
        return self.filter(target_type=ContentType.objects.get_for_model(target), target_id=str(target.pk))


class AuditEvent(models.Model):
    """One state change made by a person or by the system on their behalf.

    ``actor`` is the acting user; None for the system (a worker, the reconciler) or the operator's
    management commands, which ``actor_label`` names. ``detail`` keeps what the change replaced (a
    retried run's previous result, a rejection's reason), so that nothing is lost without a record.
    """
    objects = AuditEventQuerySet.as_manager()

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    actor_label = models.CharField(max_length=150)
    action = models.SlugField(max_length=64, choices=AuditAction.choices)
    target_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    target_id = models.CharField(max_length=64)
    target = GenericForeignKey("target_type", "target_id")
    target_label = models.CharField(max_length=300)
    summary = models.TextField()
    detail = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id", "-at"], name="audit_by_target")]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor_label}: {self.summary}"
