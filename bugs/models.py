"""The catalog: bugs and their immutable, content-hashed reproducer versions."""
import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.urls import reverse

from core.enums import ReviewState, Variant, VerificationVerdict

BUG_ID_PATTERN = r"^[A-Z][A-Z0-9]*(-[A-Z0-9]+)+$"


def validate_bug_id(value):
    if not re.fullmatch(BUG_ID_PATTERN, value):
        raise ValidationError(
            f"{value!r} is not a bug ID: use upper-case words joined by dashes, such as PT-115607 or DS-1801."
        )


class Framework(models.TextChoices):
    PYTORCH = "pytorch", "PyTorch"
    DEEPSPEED = "deepspeed", "DeepSpeed"
    MEGATRON = "megatron-lm", "Megatron-LM"
    TRANSFORMER_ENGINE = "transformer-engine", "Transformer Engine"
    TENSORFLOW = "tensorflow", "TensorFlow"
    NNSCALER = "nnscaler", "nnScaler"
    TRANSFORMERS = "transformers", "HuggingFace Transformers"
    OPENMMLAB = "openmmlab", "OpenMMLab"
    LIGHTNING = "lightning", "Lightning"
    JAX = "jax", "JAX"


# The first words of a bug ID that name one framework's own tracker: only that framework's bugs take them, so
# that TF- always means TensorFlow. Any other first word (SO for Stack Overflow, GH for a GitHub project, a
# paper's or a model's name) says where a bug was found and suits every framework.
RESERVED_ID_PREFIXES = {
    Framework.PYTORCH: ("PT",),
    Framework.DEEPSPEED: ("DS",),
    Framework.MEGATRON: ("MLM", "MEGATRON"),
    Framework.TRANSFORMER_ENGINE: ("TE",),
    Framework.TENSORFLOW: ("TF",),
    Framework.NNSCALER: ("NNSCALER",),
    Framework.TRANSFORMERS: ("HF",),
    Framework.OPENMMLAB: ("MM", "MMCV", "MMENGINE", "MMDET"),
    Framework.LIGHTNING: ("PL", "LIGHTNING"),
    Framework.JAX: ("JAX",),
}
FRAMEWORK_OF_ID_PREFIX = {prefix: framework for framework, prefixes in RESERVED_ID_PREFIXES.items()
                          for prefix in prefixes}


def id_prefix_problem(bug_id, framework):
    """Why a bug of ``framework`` may not have the ID ``bug_id`` because its prefix is another framework's, or ''."""
    prefix = str(bug_id).split("-", 1)[0]
    owner = FRAMEWORK_OF_ID_PREFIX.get(prefix)
    if owner is None or owner == framework or framework not in Framework.values:
        return ""
    own = [f"{word}-" for word in RESERVED_ID_PREFIXES[Framework(framework)]]
    return (f"{bug_id}: the prefix {prefix}- is reserved for {owner.label} bugs. For {Framework(framework).label} "
            f"use {', '.join(own)} (such as {own[0]}12345), or a prefix that says where the bug was reported, "
            f"such as GH- or SO-.")


class FaultLocation(models.TextChoices):
    USER = "user", "User code"
    FRAMEWORK = "framework", "Framework"
    COMPILER = "compiler", "Compiler"
    HW_DRIVER = "hw_driver", "Hardware / driver"
    COMMUNICATION = "communication", "Communication"


class Reproduction(models.TextChoices):
    """How a bug is reproduced: by real library code hitting the real bug (faithful), by its faulty logic rebuilt in a
    small loop (injected), or not at all (catalog only). A reproducer's ``strategy`` is one of the first two
    (``STRATEGIES``)."""
    FAITHFUL = "faithful", "Faithful"
    INJECTED = "injected", "Injected"
    CATALOG_ONLY = "catalog_only", "Catalog only"


STRATEGIES = (Reproduction.FAITHFUL, Reproduction.INJECTED)  # the ways a reproducer can reproduce its bug


class BugStatus(models.TextChoices):
    """Where a bug stands: submitted, approved, then what its verification said (a VerificationVerdict), or
    deprecated."""
    SUBMITTED = "submitted", "Submitted"
    APPROVED = "approved", "Approved"
    VERIFIED = VerificationVerdict.VERIFIED.value, VerificationVerdict.VERIFIED.label
    FLAKY = VerificationVerdict.FLAKY.value, VerificationVerdict.FLAKY.label
    UNREPRODUCIBLE = VerificationVerdict.UNREPRODUCIBLE.value, VerificationVerdict.UNREPRODUCIBLE.label
    DEPRECATED = "deprecated", "Deprecated"


class Bug(models.Model):
    """A silent training error. Its ID is never renumbered or reused; retire it by deprecation."""

    bug_id = models.CharField("ID", max_length=64, unique=True, validators=[validate_bug_id])
    title = models.CharField(max_length=200)
    framework = models.CharField(max_length=32, choices=Framework.choices, db_index=True)
    framework_versions = models.TextField(blank=True, help_text="Affected versions, in words.")
    fault_location = models.CharField(max_length=32, choices=FaultLocation.choices, db_index=True)
    root_cause_category = models.CharField(max_length=100, blank=True)
    root_cause = models.TextField()
    symptom = models.TextField()
    fix = models.TextField(blank=True)
    detection_signal = models.TextField(blank=True)
    upstream_issue_url = models.URLField(max_length=500, blank=True)
    fix_url = models.URLField(max_length=500, blank=True)
    links = models.JSONField(default=list, blank=True)
    reproduction = models.CharField(max_length=16, choices=Reproduction.choices, default=Reproduction.FAITHFUL)
    catalog_only_reason = models.TextField(blank=True)
    reference_pipelines = models.JSONField(default=list, blank=True)
    needs_cuda_original = models.BooleanField(default=False)
    multi_rank = models.BooleanField(default=False, db_index=True)
    source = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=16, choices=BugStatus.choices, default=BugStatus.SUBMITTED, db_index=True)
    deprecation_reason = models.TextField(blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="submitted_bugs"
    )
    # The held-out split (docs/methodology.md, "Held-out bugs"): set only by bugs.actions.do_hold_out_bug and
    # do_publish_bug, whose audit records say who moved it and when.
    held_out = models.BooleanField(default=False, db_index=True,
                                   help_text="Seen only by maintainers; scored only by campaigns created after "
                                             "held_out_at.")
    held_out_at = models.DateTimeField(null=True, blank=True, help_text="When it was last held out.")
    held_out_number = models.PositiveIntegerField(
        null=True, blank=True, unique=True, editable=False,
        help_text="Its public label's number (\"held-out #3\"): given in the order bugs are held out, never reused.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["bug_id"]
        permissions = [("deprecate_bug", "Can deprecate a bug")]

    def __str__(self):
        return self.bug_id

    @property
    def held_out_label(self):
        """The opaque name everyone but the maintainers sees for it: "held-out #N", N in the order bugs were held
        out, so that it says nothing of the bug's ID, title or fields."""
        return f"held-out #{self.held_out_number}" if self.held_out_number else ""

    def get_absolute_url(self):
        return reverse("bugs:detail", args=[self.bug_id])

    def clean(self):
        if problem := id_prefix_problem(self.bug_id, self.framework):
            raise ValidationError({"bug_id": problem})

    def delete(self, *args, **kwargs):
        raise ValidationError("Bugs are never deleted: deprecate them with a reason (bugs.actions.do_deprecate_bug).")


class OracleSymptom(models.TextChoices):
    """What a reproducer's oracle judges: a symptom a user of the faulty program would see, never the cause."""
    LOSS = "loss", "Loss: diverges, stops improving or climbs back"
    ACCURACY = "accuracy", "Accuracy stays low"
    RANK_DIVERGENCE = "rank_divergence", "Replicas differ between ranks"
    FROZEN_PARAMETERS = "frozen_parameters", "Parameters that never move"
    REFERENCE_MISMATCH = "reference_mismatch", "Differs from a reference computation"


class Track(models.TextChoices):
    """Which part of the benchmark a reproducer belongs to: the catalog (real bugs and the clean reference pipelines
    they are measured against), or the sensitivity track (mutants: a clean pipeline with an injected fault, which
    never count among the real bugs)."""
    CATALOG = "catalog", "Catalog"
    SENSITIVITY = "sensitivity", "Sensitivity track"


class ReproducerQuerySet(models.QuerySet):
    def reference_pipelines(self):
        """The clean reference pipelines: no bug, in the catalog's track."""
        return self.filter(bug__isnull=True, track=Track.CATALOG)


class Reproducer(models.Model):
    """A named way to reproduce a bug (``cpu``, ``cuda``...), or, without a bug, a clean reference
    pipeline (no fault; only its ``fixed`` variant exists) or a mutant of one (the sensitivity track: ``buggy`` arms
    the fault, ``fixed`` is the clean twin). Its code lives in versions."""
    objects = ReproducerQuerySet.as_manager()

    bug = models.ForeignKey(Bug, null=True, blank=True, on_delete=models.PROTECT, related_name="reproducers")
    name = models.SlugField(max_length=64)
    track = models.CharField(max_length=16, choices=Track.choices, default=Track.CATALOG, db_index=True)
    strategy = models.CharField(max_length=16, choices=[(strategy.value, strategy.label) for strategy in STRATEGIES])
    strategy_note = models.TextField(blank=True)
    oracle_symptom = models.CharField(max_length=32, choices=OracleSymptom.choices, blank=True,
                                      help_text="What the oracle judges; empty for a clean reference pipeline.")
    oracle_check = models.TextField(blank=True, help_text="What the oracle compares, with its threshold.")
    fidelity_note = models.TextField(
        blank=True, help_text="What differs from the upstream report's setup (model, optimizer, loss, data, steps, "
                              "hardware) and why; empty for a clean reference pipeline.")
    simulated = models.BooleanField(default=False, help_text="A CPU analogue of a bug that needs other hardware.")
    historical_reason = models.TextField(
        blank=True, help_text="Why no environment today can show the bug (only builds long gone had it): the "
                              "reproducer is kept as the record of how it showed, and never run; empty for the rest.")
    needs_cuda = models.BooleanField(default=False, db_index=True)
    world_size = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["bug__bug_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["bug", "name"], name="unique_reproducer_name_per_bug"),
            models.UniqueConstraint(fields=["name"], condition=models.Q(bug__isnull=True),
                                    name="unique_reference_pipeline_name"),
        ]

    def __str__(self):
        if self.bug_id:
            return f"{self.bug.bug_id}/{self.name}"
        return f"pipeline/{self.name}" if self.track == Track.CATALOG else self.name

    @property
    def is_reference_pipeline(self):
        return self.bug_id is None and self.track == Track.CATALOG

    @property
    def variants(self):
        """The variants it can run: buggy and fixed, or only fixed for a clean reference pipeline."""
        return (Variant.FIXED,) if self.is_reference_pipeline else (Variant.BUGGY, Variant.FIXED)

    def latest_version(self):
        return self.versions.newest_first().first()


NEWEST_FIRST = ("-created_at", "-id")


class ReproducerVersionQuerySet(models.QuerySet):
    def approved(self):
        return self.filter(review_state=ReviewState.APPROVED)

    def newest_first(self):
        return self.order_by(*NEWEST_FIRST)

    def latest_ids(self):
        """{reproducer id: id of its newest version among these}: "the latest version of a reproducer",
        for any number of reproducers in one query, without loading their files."""
        latest = {}
        for pk, reproducer_id in self.order_by("reproducer_id", *NEWEST_FIRST).values_list("pk", "reproducer_id"):
            latest.setdefault(reproducer_id, pk)
        return latest


class ReproducerVersion(models.Model):
    """Immutable: one exact content of a reproducer, named by the hash of its files and manifest."""
    objects = ReproducerVersionQuerySet.as_manager()

    reproducer = models.ForeignKey(Reproducer, on_delete=models.PROTECT, related_name="versions")
    content_hash = models.CharField(max_length=64, db_index=True)
    files = models.JSONField(help_text="Relative path -> file text.")
    manifest = models.JSONField(help_text="The parsed reproducer.yaml.")
    entrypoint = models.CharField(max_length=200)
    default_steps = models.PositiveIntegerField(default=20)
    time_limit_seconds = models.PositiveIntegerField(default=60)
    memory_mb = models.PositiveIntegerField(default=4096)
    review_state = models.CharField(max_length=16, choices=ReviewState.choices, default=ReviewState.PENDING)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_note = models.TextField(blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="submitted_versions",
        help_text="Empty for catalog-as-code versions, which arrive through code review.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = list(NEWEST_FIRST)
        indexes = [models.Index(fields=["review_state", "created_at"])]
        constraints = [
            models.UniqueConstraint(fields=["reproducer", "content_hash"], name="unique_version_per_content")
        ]
        permissions = [("approve_reproducerversion", "Can approve reproducer code for execution")]

    def __str__(self):
        return f"{self.reproducer} @ {self.short_hash}"

    @property
    def short_hash(self):
        return self.content_hash[:12]

    @property
    def is_approved(self):
        return self.review_state == ReviewState.APPROVED

    def approved_baseline(self):
        """The latest approved version of the same reproducer created before this one: what a reviewer
        diffs against (not merely the previous version, which may itself be unreviewed or rejected)."""
        return (ReproducerVersion.objects.approved().filter(reproducer_id=self.reproducer_id)
                .filter(models.Q(created_at__lt=self.created_at) | models.Q(created_at=self.created_at, id__lt=self.id))
                .newest_first().first())

    def save(self, *args, **kwargs):
        if self.pk is not None:
            original = ReproducerVersion.objects.filter(pk=self.pk).values("content_hash", "files", "manifest").first()
            if original and (
                original["content_hash"] != self.content_hash
                or original["files"] != self.files
                or original["manifest"] != self.manifest
            ):
                raise ValidationError("Reproducer versions are immutable: load the new content as a new version.")
        super().save(*args, **kwargs)
