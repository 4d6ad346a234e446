import hashlib
import json

from django.db import models
from django.urls import reverse

from runners.models import Campaign


class Evaluation(models.Model):
    """One full evaluation (corpus x detectors x variants x seeds, plus overhead pairs), with its tables.

    The tables are stored as computed when the evaluation finished, so the dashboard, the exports and
    docs/results.md show the same numbers even after more runs land.
    """

    campaign = models.ForeignKey(Campaign, on_delete=models.PROTECT, related_name="evaluations")
    overhead_campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.PROTECT,
                                          related_name="overhead_evaluations")
    created_at = models.DateTimeField(auto_now_add=True)
    parameters = models.JSONField(default=dict)
    tables = models.JSONField(default=dict, help_text="{table name: [records]}")
    tables_digest = models.CharField(max_length=32, editable=False, default="",
                                     help_text="MD5 of the tables, set by save(): names them in cache keys")
    wall_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"evaluation {self.pk} ({self.created_at:%Y-%m-%d})"

    def save(self, *args, update_fields=None, **kwargs):
        """Saved with the digest of its tables (``tables_digest_of``), so that a page names the tables it shows
        without reading them (evaluation.results.cached_for); a save that leaves the tables out keeps it."""
        if update_fields is None or "tables" in update_fields:
            self.tables_digest = tables_digest_of(self.tables)
            update_fields = update_fields and {*update_fields, "tables_digest"}
        super().save(*args, update_fields=update_fields, **kwargs)

    def get_absolute_url(self):
        return reverse("evaluation:results") + f"?evaluation={self.pk}"


def tables_digest_of(tables):
    """The MD5 of ``tables`` as canonical JSON: any change to a stored table changes it."""
    return hashlib.md5(json.dumps(tables, sort_keys=True).encode()).hexdigest()
