"""Execution records: detectors, campaigns, runs, their alarms and where they ran."""
from django.conf import settings
from django.db import models
from django.urls import reverse

from bugs.models import ReproducerVersion
from core.enums import Variant


class Detector(models.Model):
    """A detector plugin at one version with one config, recorded verbatim with every run."""

    name = models.SlugField(max_length=64)
    version = models.CharField(max_length=32)
    config = models.JSONField(default=dict)
    config_hash = models.CharField(max_length=64)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name", "version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version", "config_hash"], name="unique_detector_config")
        ]

    def __str__(self):
        return f"{self.name} {self.version}"


class Worker(models.Model):
    """A Celery worker (by node name, ``gpu@node1``) and what it can serve, as it registered on start.

    ``capabilities`` holds everything (its GPUs one by one, host facts); the columns repeat what
    routing and the pages ask about. The queues follow from the capabilities (runners.routing).
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


class CampaignPurpose(models.TextChoices):
    MANUAL = "manual", "Campaign"
    VERIFICATION = "verification", "Verification"
    EVALUATION = "evaluation", "Evaluation"
    # Timed one run at a time by the process that created it (manage.py evaluate), never enqueued.
    OVERHEAD = "overhead", "Overhead measurement"


class CampaignState(models.TextChoices):
    """Derived from a campaign's timestamps, never stored."""
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    CANCELLED = "cancelled", "cancelled"


class Campaign(models.Model):
    """A batch of runs a user triggered. Progress is derived from its runs.

    ``completed_at`` is set once, when its last run finishes (runners.actions.do_complete_campaign);
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

    # The program, as the sandbox saw it end (runners.sandbox, runners.execution).
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
    # (runners.actions.MAX_ATTEMPTS; before that it is queued again), an overhead run whose timing command stopped.
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
    queue = models.CharField(max_length=32, default="cpu")

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    failure_reason = models.TextField(blank=True)
    failure_kind = models.CharField(max_length=32, choices=RunFailureKind.choices, blank=True, db_index=True,
                                    help_text="Why it failed or was cancelled; empty for runs that did not.")
    attempts = models.PositiveIntegerField(default=0)
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.SET_NULL)
    environment = models.ForeignKey(Environment, null=True, blank=True, on_delete=models.SET_NULL)

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
            # (bugs.views.bug_page_rows), and reads only those rows.
            models.Index(fields=["reproducer_version", "campaign", "id"], name="run_version_campaign"),
        ]

    def __str__(self):
        return f"run {self.pk}: {self.reproducer_version.reproducer} {self.variant} seed {self.seed} / {self.detector}"

    def get_absolute_url(self):
        return reverse("runners:run", args=[self.pk])


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

    class Meta:
        ordering = ["step", "rank", "id"]
        # A run's alarms in their order; also serves every lookup by run (so no separate run index).
        indexes = [models.Index(fields=["run", "step", "rank", "id"], name="alarm_run_order")]

    def __str__(self):
        return f"{self.rule} at step {self.step} (rank {self.rank})"


class StabilityVerdict(models.TextChoices):
    VERIFIED = "verified", "Verified"
    FLAKY = "flaky", "Flaky"
    UNREPRODUCIBLE = "unreproducible", "Unreproducible"


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
    verdict = models.CharField(max_length=16, choices=StabilityVerdict.choices)
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
            return StabilityVerdict.VERIFIED
        if buggy_manifested == 0:
            return StabilityVerdict.UNREPRODUCIBLE
        return StabilityVerdict.FLAKY
