"""The sensitivity track's mutants, as the catalog holds them: each is a reproducer of the sensitivity track
(bugs.models.Track), whose versions are its code, with the fields that say which fault it injects."""
from django.core.validators import RegexValidator
from django.db import models
from django.urls import reverse

from bugs.models import Reproducer

from .mutants import FAULT_CLASSES, MUTANT_ID


class FaultClass(models.TextChoices):
    SOFTWARE = FAULT_CLASSES[0], "Software"
    HARDWARE = FAULT_CLASSES[1], "Hardware"


class Mutant(models.Model):
    """A clean pipeline with one fault operator armed at a severity from a trigger step (sensitivity/spec.yaml). Its
    ID is stable: the same operator, severity, pipeline, trigger and persistence always make the same ID."""

    mutant_id = models.CharField("ID", max_length=64, unique=True, validators=[
        RegexValidator(MUTANT_ID, "A mutant's ID is lower-case words after MUT-, joined by dashes.")])
    reproducer = models.OneToOneField(Reproducer, on_delete=models.PROTECT, related_name="mutant",
                                      help_text="Its code: a reproducer of the sensitivity track.")
    pipeline = models.ForeignKey(Reproducer, on_delete=models.PROTECT, related_name="mutants",
                                 help_text="The clean reference pipeline it mutates.")
    operator = models.CharField(max_length=64, db_index=True)
    fault_class = models.CharField(max_length=16, choices=FaultClass.choices, db_index=True)
    mirrors = models.CharField(max_length=100, help_text="The catalog's root-cause class the operator mirrors.")
    severity = models.CharField(max_length=32, help_text="The severity's label, such as exp-hi or every-4.")
    severity_level = models.PositiveSmallIntegerField(help_text="1 for the operator's mildest severity.")
    persistence = models.CharField(max_length=16, blank=True, help_text="transient or sticky, where the operator "
                                                                        "has one.")
    trigger_step = models.PositiveIntegerField()
    rank = models.PositiveSmallIntegerField(default=0, help_text="The rank the fault strikes.")
    parameters = models.JSONField(default=dict, help_text="The severity's parameters, as the operator reads them.")
    steps = models.PositiveIntegerField(help_text="The steps a run of it trains.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operator", "pipeline__name", "severity_level", "persistence", "trigger_step"]

    def __str__(self):
        return self.mutant_id

    def get_absolute_url(self):
        return reverse("sensitivity:mutant", args=[self.mutant_id])
