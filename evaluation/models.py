import hashlib
import json

from django.conf import settings
from django.db import models
from django.urls import reverse

from runners.bisection import ReleaseOutcome
from runners.models import Campaign


class Device(models.TextChoices):
    """Where an evaluation's runs ran: the pages show each kind's evaluations apart, never one for the other."""

    CPU = "cpu", "CPU"
    GPU = "gpu", "GPU"


class Evaluation(models.Model):
    """One full evaluation (corpus x detectors x variants x seeds, plus overhead pairs), with its tables.

    The tables are stored as computed when the evaluation finished, so the dashboard, the exports and
    docs/results.md show the same numbers even after more runs land. A GPU evaluation (``manage.py evaluate --cuda``:
    the CUDA reproducers on a GPU node) is set apart from the CPU one by ``device``: "the latest evaluation" is the
    latest of a device, and its parameters name the GPU, driver, CUDA and torch.
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
    published_id = models.CharField(
        max_length=40, blank=True, default="",
        help_text="Set once it is published (evaluation.published): the name it is cited by, the same in every "
                  "database that loads its snapshot, e.g. 2026-11-28.3f2a9c1b (its date and its tables' digest).")
    published_at = models.DateTimeField(null=True, blank=True)
    device = models.CharField(max_length=8, choices=Device.choices, default=Device.CPU,
                              help_text="Where its runs ran; the pages show CPU and GPU evaluations apart.")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["published_id"], condition=~models.Q(published_id=""),
                                               name="unique_published_evaluation")]

    def __str__(self):
        return f"evaluation {self.label}"

    @property
    def label(self):
        """How pages name it: its published ID once published (the same everywhere), else its number here."""
        return self.published_id or f"#{self.pk}"

    def save(self, *args, update_fields=None, **kwargs):
        """Saved with the digest of its tables (``tables_digest_of``), so that a page names the tables it shows
        without reading them (evaluation.results.cached_for); a save that leaves the tables out keeps it."""
        if update_fields is None or "tables" in update_fields:
            self.tables_digest = tables_digest_of(self.tables)
            update_fields = update_fields and {*update_fields, "tables_digest"}
        super().save(*args, update_fields=update_fields, **kwargs)

    def get_absolute_url(self):
        return reverse("evaluation:results") + f"?evaluation={self.pk}"

    @property
    def hardware(self):
        """What its runs ran on, in words: "CPU", or the GPU with its driver and CUDA."""
        parameters = self.parameters or {}
        if self.device != Device.GPU:
            return "CPU"
        details = ", ".join(part for part in (parameters.get("gpu_driver") and f"driver {parameters['gpu_driver']}",
                                              parameters.get("cuda") and f"CUDA {parameters['cuda']}") if part)
        return f"{parameters.get('gpu') or 'GPU'}{f' ({details})' if details else ''}"

    @property
    def environment(self):
        """Where its runs ran, in words: ``hardware``, then torch."""
        torch = (self.parameters or {}).get("torch")
        return f"{self.hardware}{f', torch {torch}' if torch else ''}"


def tables_digest_of(tables):
    """The MD5 of ``tables`` as canonical JSON: any change to a stored table changes it."""
    return hashlib.md5(json.dumps(tables, sort_keys=True).encode()).hexdigest()


class BisectionStatus(models.TextChoices):
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"


class Bisection(models.Model):
    """A search for the first torch release where what a reproducer's oracle says changes (runners.bisection):
    rounds of probes, each probe the buggy variant's ``plain`` runs over ``seeds`` on one release. ``workers`` is
    how many probes a round may make at once (k-section); None: as many as there are free worker slots when the
    round starts. ``releases`` are the releases between ``good`` and ``bad``, good first, once resolved."""

    bug = models.ForeignKey("bugs.Bug", on_delete=models.CASCADE, related_name="bisections")
    reproducer_version = models.ForeignKey("bugs.ReproducerVersion", on_delete=models.PROTECT,
                                           related_name="bisections")
    good = models.CharField(max_length=32)
    bad = models.CharField(max_length=32)
    releases = models.JSONField(default=list, blank=True)
    seeds = models.JSONField(default=list)
    steps = models.PositiveIntegerField(null=True, blank=True)
    workers = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=BisectionStatus.choices, default=BisectionStatus.RUNNING)
    first_changed = models.CharField(max_length=32, blank=True)
    last_same = models.CharField(max_length=32, blank=True)
    reason = models.TextField(blank=True, help_text="The result in words, or why the bisection failed.")
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"bisection {self.pk} ({self.good} -> {self.bad})"

    def get_absolute_url(self):
        return reverse("evaluation:bisection", args=[self.pk])


class BisectionProbe(models.Model):
    """One release probed in one round: its runs are those of the round's campaign in the release's environment
    (None: the default one); the outcome is set once they have all finished."""

    bisection = models.ForeignKey(Bisection, on_delete=models.CASCADE, related_name="probes")
    round = models.PositiveIntegerField()
    release = models.CharField(max_length=32)
    environment = models.ForeignKey("runners.PythonEnvironment", null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="+")
    campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    outcome = models.CharField(max_length=16, blank=True, choices=ReleaseOutcome.choices)
    runs = models.PositiveIntegerField(default=0)
    manifested = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    seconds = models.FloatField(null=True, blank=True, help_text="The wall time of its runs, added up.")

    class Meta:
        ordering = ["round", "id"]
        constraints = [models.UniqueConstraint(fields=["bisection", "release"], name="one_probe_per_release")]

    def __str__(self):
        return f"{self.release}: {self.outcome or 'pending'}"


class SensitivityEvaluation(models.Model):
    """One run of the sensitivity track (manage.py evaluate_sensitivity): the mutants under every detector it ran,
    the clean twins, the calibration runs, and the tables computed from them when it finished
    (evaluation.sensitivity). Apart from ``Evaluation``: mutants are not real bugs, and no real-bug table counts
    them."""

    campaign = models.ForeignKey(Campaign, on_delete=models.PROTECT, related_name="sensitivity_evaluations")
    created_at = models.DateTimeField(auto_now_add=True)
    parameters = models.JSONField(default=dict)
    tables = models.JSONField(default=dict, help_text="{table name: [records]}")
    wall_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"sensitivity evaluation #{self.pk}"
