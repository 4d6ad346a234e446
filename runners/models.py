"""Execution records: detectors, campaigns, runs, their alarms and where they ran."""
import json

from django.conf import settings
from django.db import models
from django.urls import reverse

from bugs.models import ReproducerVersion
from core.enums import ReviewState, Variant, VerificationVerdict


class DetectorVersion(models.Model):
    """The code of one detector at one version: its plugin module's source, as submitted and reviewed.

    Submitted ones come from a researcher (``submitted_by``) and wait for a maintainer's review; built-in ones
    are the modules of ``runners/detectors/``, recorded by the system (``builtin``, no submitter) and approved as
    they are recorded. Immutable once stored: a change is a new version. ``interface`` holds what the worker needs
    to know of the plugin without importing it, read from the module's syntax tree at submission
    (runners.detector_versions.submissions.interface_of); ``config`` the overrides submitted with it."""

    name = models.SlugField(max_length=64)
    version = models.CharField(max_length=32)
    code = models.TextField(help_text="The plugin module's source.")
    code_hash = models.CharField(max_length=64, help_text="SHA-256 of the source, as UTF-8.")
    config = models.JSONField(default=dict, blank=True, help_text="Overrides of the plugin's default_config.")
    interface = models.JSONField(default=dict)
    description = models.TextField(blank=True)
    link = models.URLField(max_length=500, blank=True, help_text="A paper or repository describing the detector.")
    builtin = models.BooleanField(default=False)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="submitted_detector_versions", help_text="Empty for built-in detectors (the system).")
    review_state = models.CharField(max_length=16, choices=ReviewState.choices,
                                    default=ReviewState.PENDING)
    reviewed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["name", "version", "code_hash"],
                                               name="unique_detector_version_code")]

    def __str__(self):
        return f"{self.name} {self.version} ({self.code_hash[:12]})"

    @property
    def is_approved(self):
        return self.review_state == ReviewState.APPROVED

    @property
    def files(self):
        """The version as files (its module and its config), for the review page's diff (bugs.submission_views)."""
        return {f"{self.name}.py": self.code, "config.json": json.dumps(self.config, indent=2, sort_keys=True)}

    def approved_baseline(self):
        """The newest approved version of the same detector before this one: what a reviewer diffs against."""
        return (DetectorVersion.objects.filter(name=self.name, review_state=ReviewState.APPROVED)
                .exclude(pk=self.pk).filter(models.Q(created_at__lt=self.created_at)
                                            | models.Q(created_at=self.created_at, id__lt=self.pk))
                .order_by("-created_at", "-id").first())


class Detector(models.Model):
    """A detector plugin at one version with one config, recorded verbatim with every run. ``code`` is the exact
    module that ran (empty only on rows recorded before detector versions existed)."""

    name = models.SlugField(max_length=64)
    version = models.CharField(max_length=32)
    config = models.JSONField(default=dict)
    config_hash = models.CharField(max_length=64)
    description = models.TextField(blank=True)
    code = models.ForeignKey(DetectorVersion, null=True, blank=True, on_delete=models.PROTECT,
                             related_name="records")

    class Meta:
        ordering = ["name", "version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version", "config_hash", "code"], name="unique_detector_config")
        ]

    def __str__(self):
        return f"{self.name} {self.version}"

    # What the leaderboard shows of the code a record ran (None for rows older than detector versions).
    @property
    def submitter(self):
        return self.code and self.code.submitted_by

    @property
    def link(self):
        return self.code.link if self.code else ""

    @property
    def approved_at(self):
        return self.code and self.code.reviewed_at

    @property
    def code_hash(self):
        return self.code.code_hash if self.code else ""


class Worker(models.Model):
    """A Celery worker (by node name, ``gpu@node1``) and what it can serve, as it registered on start.

    ``capabilities`` holds everything (its GPUs one by one, host facts); the columns repeat what
    routing and the pages ask about. The queues follow from the capabilities (runners.environments.routing).
    """

    hostname = models.CharField(max_length=255, unique=True)
    queues = models.JSONField(default=list)
    capabilities = models.JSONField(default=dict)
    concurrency = models.PositiveIntegerField(default=1)
    gpu_count = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=255, blank=True)
    gpu_memory_mb = models.PositiveIntegerField(default=0, help_text="Memory of its smallest GPU.")
    memory_mb = models.PositiveIntegerField(default=0, help_text="Host memory (or the container's limit).")
    cuda = models.CharField(max_length=32, blank=True)
    torch = models.CharField(max_length=64, blank=True)
    gpu_checks = models.JSONField(default=list, blank=True,
                                  help_text="Its GPUs' self-check as it started; a GPU that failed is not offered.")
    registered_at = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField()

    def __str__(self):
        return self.hostname


class Environment(models.Model):
    """Where a run executed; identical environments share one row (keyed by a hash of ``facts``)."""

    fingerprint = models.CharField(max_length=64, unique=True)
    host = models.CharField(max_length=255)
    cpu = models.CharField(max_length=255, blank=True)
    gpu = models.CharField(max_length=255, blank=True)
    gpu_driver = models.CharField(max_length=64, blank=True)
    cuda = models.CharField(max_length=64, blank=True)
    python = models.CharField(max_length=64)
    torch = models.CharField(max_length=64, blank=True)
    facts = models.JSONField(default=dict)

    def __str__(self):
        return f"{self.host} · torch {self.torch or '?'} · {self.gpu or 'CPU'}"


class PythonEnvironment(models.Model):
    """A Python interpreter with pinned packages that runs can ask for (runners.environments builds it).

    Named by what it resolved to (``py3.11-torch2.11.0``), so two requirement lists that resolve alike share
    one record. ``is_default`` marks the workers' own interpreter (the torch the project pins): a run with
    no environment, or with the default one, runs there. Where each worker built it is in
    :class:`EnvironmentBuild`.
    """

    name = models.CharField(max_length=100, unique=True)
    requirements = models.JSONField(default=list, help_text='Pip requirement strings, e.g. ["torch==2.11.0"].')
    resolved = models.JSONField(default=dict, help_text="{package: version} as installed in the built environment.")
    python = models.CharField(max_length=32)
    torch = models.CharField(max_length=64, blank=True, help_text="The resolved torch version, e.g. 2.11.0.")
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-is_default", "name"]
        constraints = [models.UniqueConstraint(fields=["is_default"], condition=models.Q(is_default=True),
                                               name="one_default_python_environment")]

    def __str__(self):
        return self.name


class EnvironmentBuild(models.Model):
    """One build of an environment on one machine: where it is, how long it took and how large it is."""

    environment = models.ForeignKey(PythonEnvironment, on_delete=models.CASCADE, related_name="builds")
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="builds",
                               help_text="Empty for a build made by hand (manage.py build_environment).")
    host = models.CharField(max_length=255)
    path = models.CharField(max_length=1024)
    build_seconds = models.FloatField()
    size_bytes = models.BigIntegerField()
    built_at = models.DateTimeField()

    class Meta:
        ordering = ["-built_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["host", "path"], name="unique_environment_build")]

    def __str__(self):
        return f"{self.environment} on {self.host}"


class CampaignPurpose(models.TextChoices):
    MANUAL = "manual", "Campaign"
    VERIFICATION = "verification", "Verification"
    EVALUATION = "evaluation", "Evaluation"
    SCORING = "scoring", "Detector scoring"  # one approved detector version over the corpus (do_start_scoring)
    SENSITIVITY = "sensitivity", "Sensitivity evaluation"  # mutants, clean twins, calibration (evaluate_sensitivity)
    # Timed one run at a time by the process that created it (manage.py evaluate), never enqueued.
    OVERHEAD = "overhead", "Overhead measurement"


class CampaignState(models.TextChoices):
    """Derived from a campaign's timestamps, never stored."""
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    CANCELLED = "cancelled", "cancelled"


class Campaign(models.Model):
    """A batch of runs a user triggered. Progress is derived from its runs.

    ``completed_at`` is set once, when its last run finishes (runners.actions.campaigns.do_complete_campaign);
    a verification campaign then records the stability of what it ran.
    """

    name = models.CharField(max_length=200)
    purpose = models.CharField(max_length=16, choices=CampaignPurpose.choices, default=CampaignPurpose.MANUAL)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    parameters = models.JSONField(default=dict)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("trigger_campaign", "Can trigger a campaign of runs")]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("runners:campaign", args=[self.pk])

    @property
    def runs_through_broker(self):
        """False for an overhead measurement, whose runs the command that made it executes one at a time:
        the reconciler leaves them alone and they are never retried."""
        return self.purpose != CampaignPurpose.OVERHEAD

    @property
    def state(self):
        if self.cancelled_at:
            return CampaignState.CANCELLED
        return CampaignState.FINISHED if self.completed_at else CampaignState.RUNNING

    def progress(self, counts=None):
        """Runs by status, done and percent; ``counts`` ({status: runs}, from :func:`status_counts`)
        saves the query when a page of campaigns was counted at once."""
        if counts is None:
            counts = dict(self.runs.values_list("status").annotate(n=models.Count("id")))
        total = sum(counts.values())
        done = sum(counts.get(s, 0) for s in FINISHED_STATUSES)
        return {
            "total": total,
            "done": done,
            "counts": {status: counts.get(status, 0) for status in RunStatus.values},
            "percent": round(100 * done / total) if total else 100,
        }


def status_counts(campaigns):
    """{campaign id: {status: runs}} for several campaigns, in one query."""
    counts = {campaign.pk: {} for campaign in campaigns}
    for campaign_id, status, n in (Run.objects.filter(campaign__in=list(counts)).order_by()
                                   .values_list("campaign", "status").annotate(n=models.Count("id"))):
        counts[campaign_id][status] = n
    return counts


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FINISHED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
UNSUCCESSFUL_STATUSES = (RunStatus.FAILED, RunStatus.CANCELLED)  # the runs that have a failure kind


class RunFailureKind(models.TextChoices):
    """Why a run failed or was cancelled, as a kind to group, filter and retry by; ``Run.failure_reason``
    says the same for a person. Set where the reason is set (runners.failures lists which sentence
    belongs to which kind)."""

    # The program, as the sandbox saw it end (runners.executor, runners.execution).
    TIME_LIMIT = "time_limit", "Time limit"
    MEMORY = "memory", "Out of memory"
    OUTPUT_FLOOD = "output_flood", "Output flood"
    PROCESS_LIMIT = "process_limit", "Process limit"
    SANDBOX_REFUSAL = "sandbox_refusal", "Refused by the sandbox"
    CRASH = "crash", "Crashed"
    PROTOCOL = "protocol", "Protocol error"
    # Before or around the program (runners.tasks, runners.actions).
    FIT_FAILED = "fit_failed", "Fit phase failed"
    UNAPPROVED = "unapproved", "Not approved"
    INTERNAL = "internal", "Internal error"
    UNSERVABLE = "unservable", "No worker can serve it"
    CANCELLED = "cancelled", "Cancelled"
    # A run given up because what was executing it went away: a broker run lost after its last allowed attempt
    # (runners.actions.runs.MAX_ATTEMPTS; before that it is queued again), an overhead run whose timing command stopped.
    LOST = "lost", "Lost"


class FitArtifact(models.Model):
    """What a detector learned from clean reference pipelines (TrainCheck's invariants): cached, versioned.

    ``key`` hashes everything the result depends on: the detector, its version and config, the tool's
    version and the exact reference program versions, so a change to any of them fits anew.
    """

    detector = models.ForeignKey(Detector, on_delete=models.PROTECT, related_name="fit_artifacts")
    key = models.CharField(max_length=64, unique=True)
    tool_version = models.CharField(max_length=64, blank=True)
    reference_versions = models.ManyToManyField(ReproducerVersion, related_name="fit_artifacts")
    content = models.TextField(help_text="The artifact itself, e.g. TrainCheck's invariants file (JSON lines).")
    summary = models.JSONField(default=dict, blank=True)
    fit_seconds = models.FloatField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.detector} fit {self.key[:12]}"


class Run(models.Model):
    """One execution of (reproducer version, variant, seed, detector + config)."""

    campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.CASCADE, related_name="runs",
                                 db_index=False)  # see Meta: indexes that start with it
    reproducer_version = models.ForeignKey(ReproducerVersion, on_delete=models.PROTECT, related_name="runs")
    detector = models.ForeignKey(Detector, on_delete=models.PROTECT, related_name="runs")
    variant = models.CharField(max_length=8, choices=Variant.choices)
    seed = models.IntegerField(default=0)
    steps = models.PositiveIntegerField()
    queue = models.CharField(max_length=160, default="cpu",
                             help_text="Its needs (runners.routing), then . and its environment's name if not default.")

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    failure_reason = models.TextField(blank=True)
    failure_kind = models.CharField(max_length=32, choices=RunFailureKind.choices, blank=True, db_index=True,
                                    help_text="Why it failed or was cancelled; empty for runs that did not.")
    attempts = models.PositiveIntegerField(default=0)
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.SET_NULL)
    environment = models.ForeignKey(Environment, null=True, blank=True, on_delete=models.SET_NULL)
    python_environment = models.ForeignKey(PythonEnvironment, null=True, blank=True, on_delete=models.PROTECT,
                                           related_name="runs",
                                           help_text="The interpreter it asked for; empty = the workers' own.")

    queued_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    wall_seconds = models.FloatField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)

    stdout = models.TextField(blank=True)
    stderr = models.TextField(blank=True)
    output_truncated = models.BooleanField(default=False)

    manifested = models.BooleanField(null=True, blank=True, help_text="The symptom oracle's verdict.")
    oracle_summary = models.TextField(blank=True)
    oracle_evidence = models.JSONField(default=dict, blank=True)
    trigger_step = models.IntegerField(null=True, blank=True)
    trigger_time = models.FloatField(null=True, blank=True, help_text="Unix time at which the trigger step began.")
    step_records = models.JSONField(default=list, blank=True, help_text="[{step, rank, loss, time, metrics}]")
    protocol_errors = models.JSONField(default=list, blank=True)

    fit_artifact = models.ForeignKey(FitArtifact, null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    analysis_seconds = models.FloatField(null=True, blank=True, help_text="Offline checking after the run.")
    detector_summary = models.JSONField(default=dict, blank=True,
                                        help_text="The detector's summary of the whole run.")
    execution = models.JSONField(default=dict, blank=True,
                                 help_text="How it ran: start (warm or cold, and why cold), the sandbox's layers, "
                                           "notes (a teardown hang, refused alarm records).")

    class Meta:
        ordering = ["-queued_at", "-id"]
        indexes = [
            models.Index(fields=["campaign", "status"]),
            models.Index(fields=["reproducer_version", "detector", "variant"]),
            # Run lists newest first (a bug's runs read 50 index entries instead of sorting all of them).
            models.Index(fields=["-queued_at", "-id"], name="run_newest_first"),
            # A campaign's runs by ID, either way: a page of the runs API filtered by campaign (newest first) and of
            # the campaign page (oldest first) reads its own index entries, not those of every newer run.
            models.Index(fields=["campaign", "id"], name="run_campaign_by_id"),
            # A bug page names its runs that may still change, those of campaigns still open, from this index alone
            # (runners.selectors.runs_that_may_change), and reads only those rows.
            models.Index(fields=["reproducer_version", "campaign", "id"], name="run_version_campaign"),
        ]

    def __str__(self):
        return f"run {self.pk}: {self.reproducer_version.reproducer} {self.variant} seed {self.seed} / {self.detector}"

    def get_absolute_url(self):
        return reverse("runners:run", args=[self.pk])


# A run's own record, without its keys or its logs (a published snapshot and a run's JSON download), and an
# alarm's.
RUN_RECORD_FIELDS = ("variant", "seed", "steps", "queue", "status", "failure_reason", "failure_kind", "attempts",
                     "queued_at", "started_at", "finished_at", "wall_seconds", "exit_code", "output_truncated",
                     "manifested", "oracle_summary", "oracle_evidence", "trigger_step", "trigger_time", "step_records",
                     "protocol_errors", "analysis_seconds", "detector_summary", "execution")
ALARM_FIELDS = ("step", "rank", "rule", "message", "evidence", "time", "arrival_step")

# Columns that lists of runs never show, some of them large (logs, step records, the reproducer's files).
LISTING_DEFERRED = ("stdout", "stderr", "step_records", "oracle_evidence", "protocol_errors", "detector_summary",
                    "execution", "reproducer_version__files", "reproducer_version__manifest")


def runs_for_listing(runs):
    """Runs as the run tables show them: with reproducer, bug and detector, without the large columns."""
    return runs.select_related("reproducer_version__reproducer__bug", "detector").defer(*LISTING_DEFERRED)


class Alarm(models.Model):
    """A detector's report that something is wrong at a step of a run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alarms", db_index=False)  # see Meta
    step = models.IntegerField()
    rank = models.IntegerField(default=0)
    rule = models.CharField(max_length=200)
    message = models.TextField()
    evidence = models.JSONField(default=dict, blank=True)
    time = models.FloatField(null=True, blank=True, help_text="Unix time of the alarm.")
    detector = models.CharField(
        max_length=64, blank=True, default="", db_default="",
        help_text="The member of a bundle that raised it (runners.detectors.bundle); empty: the run's own detector.")
    arrival_step = models.IntegerField(
        null=True, blank=True,
        help_text="The step the program had completed when the worker received the alarm (-1: before its first); "
                  "empty for an alarm of an offline check, made after the run.")

    class Meta:
        ordering = ["step", "rank", "id"]
        # A run's alarms in their order; also serves every lookup by run (so no separate run index).
        indexes = [models.Index(fields=["run", "step", "rank", "id"], name="alarm_run_order")]

    def __str__(self):
        return f"{self.rule} at step {self.step} (rank {self.rank})"


class StabilityCheck(models.Model):
    """One verification of a reproducer version: over k seeds, buggy manifested a/k, fixed b/k.

    Verified means a = k and b = 0; no buggy manifestation is unreproducible; anything
    else, including a run that crashed, is flaky.
    """

    reproducer_version = models.ForeignKey(ReproducerVersion, on_delete=models.PROTECT, related_name="stability_checks")
    campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.SET_NULL)
    environment = models.ForeignKey(Environment, null=True, blank=True, on_delete=models.SET_NULL)
    seeds = models.PositiveIntegerField()
    buggy_manifested = models.PositiveIntegerField()
    fixed_manifested = models.PositiveIntegerField()
    failed_runs = models.PositiveIntegerField(default=0)
    verdict = models.CharField(max_length=16, choices=VerificationVerdict.choices)
    checked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-checked_at", "-id"]
        indexes = [models.Index(fields=["reproducer_version", "-checked_at", "-id"], name="stability_latest_first")]

    def __str__(self):
        return (f"{self.reproducer_version}: buggy {self.buggy_manifested}/{self.seeds}, "
                f"fixed {self.fixed_manifested}/{self.seeds}")

    @staticmethod
    def verdict_for(seeds, buggy_manifested, fixed_manifested, failed_runs):
        if buggy_manifested == seeds and fixed_manifested == 0 and failed_runs == 0:
            return VerificationVerdict.VERIFIED
        if buggy_manifested == 0:
            return VerificationVerdict.UNREPRODUCIBLE
        return VerificationVerdict.FLAKY
