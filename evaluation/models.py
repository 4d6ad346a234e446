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
    wall_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"evaluation {self.pk} ({self.created_at:%Y-%m-%d})"

    def get_absolute_url(self):
        return reverse("evaluation:results") + f"?evaluation={self.pk}"
