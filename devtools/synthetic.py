"""A synthetic but realistic run history, for measuring the dashboard at scale (and load tests).

Everything made here is marked: campaign names start with ``synthetic``, their parameters and the
environments' facts say ``"synthetic": true``, alarm messages start with ``synthetic``. It is never
measured data. Runs cover the real (loaded) reproducer versions x detectors x variants x seeds in
several environments, with mostly succeeded runs, some failures with the sentences and kinds the real
sandbox and worker write (runners.failures), small step records,
trigger steps, oracle verdicts and alarms; plus stability checks of every bug reproducer across
environments and one stored evaluation over a small campaign.

Rows go in with ``bulk_create`` in batches (runs, whose ids are needed) and ``executemany``
(alarms); on PostgreSQL 100k runs and 1M alarms take a few minutes.
"""
import contextlib
import hashlib
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from bugs.models import ReproducerVersion, Track
from core.audit import actor_label
from runners import failures
from runners.actions.detectors import do_sync_detectors
from runners.execution import run_limits
from runners.failures import cancelled_before_start, kind_of, no_oracle_report
from runners.models import Alarm, Campaign, Environment, Run, RunFailureKind, RunStatus, StabilityCheck

PREFIX = "synthetic"
STEPS = 20
RUN_BATCH = 2000
ALARM_BATCH = 20000

# (host, cpu, gpu, driver, cuda, python, torch): the environments runs are spread over.
ENVIRONMENTS = [
    ("synthetic-a100-01", "AMD EPYC 7763 64-Core Processor", "NVIDIA A100-SXM4-80GB", "535.104.05", "12.2",
     "3.11.7", "2.1.2"),
    ("synthetic-h100-02", "Intel(R) Xeon(R) Platinum 8480+", "NVIDIA H100 80GB HBM3", "550.54.15", "12.4",
     "3.11.9", "2.3.1"),
    ("synthetic-v100-03", "Intel(R) Xeon(R) Gold 6248", "Tesla V100-SXM2-32GB", "470.182.03", "11.8",
     "3.10.13", "2.0.1"),
    ("synthetic-l4-04", "AMD EPYC 7B13", "NVIDIA L4", "550.90.07", "12.4", "3.12.4", "2.4.0"),
    ("synthetic-cpu-05", "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "", "", "", "3.11.7", "2.5.1"),
    ("synthetic-cpu-06", "AMD EPYC 9654 96-Core Processor", "", "", "", "3.11.7", "2.13.0"),
]

# (share of failures, exit code, the real builder of the reason, its arguments given the run's sandbox
# Limits): the kind follows from the builder (runners.failures.kind_of), as it does for a real run.
FAILURES = [
    (0.35, -9, failures.time_limit_exceeded, lambda limits: (limits,)),
    (0.25, 1, failures.crashed, lambda limits: (1, "RuntimeError: Expected all tensors to be on the same device")),
    (0.15, 1, failures.out_of_memory, lambda limits: (limits, "MemoryError")),
    (0.10, -9, failures.output_flood, lambda limits: (limits,)),
    (0.10, 0, no_oracle_report, lambda limits: ()),
    (0.05, 1, failures.write_refused,
     lambda limits: ("PermissionError: [Errno 13] Permission denied: '/usr/lib/python3/dist-packages/x.pth'",)),
]

RULES = {
    "nan_inf": ["non_finite_loss", "non_finite_grad"],
    "param_not_updated": ["no_parameter_updated"],
    "grad_health": ["vanishing_gradient", "exploding_gradient", "weight_update_ratio"],
    "loss_spike_megatron": ["loss_spike"],
    "loss_spike_zscore": ["loss_zscore"],
    "cross_rank_consistency": ["param_mismatch_across_ranks", "grad_mismatch_across_ranks"],
    "differential": ["mismatch:loss", "mismatch:grad_norm"],
    "detect_anomaly": ["autograd_anomaly"],
    "traincheck": ["Consistent: torch.optim.Optimizer.step changes parameters",
                   "EventContain: zero_grad before backward", "APIContainRelation: all_reduce in step"],
}


@dataclass
class Made:
    """What a call to :func:`seed_history` created, and how long each part took."""

    campaigns: int = 0
    environments: int = 0
    runs: int = 0
    alarms: int = 0
    stability_checks: int = 0
    evaluations: int = 0
    statuses: Counter = field(default_factory=Counter)
    seconds: dict = field(default_factory=dict)

    def lines(self):
        yield (f"{self.campaigns} campaigns, {self.environments} environments, {self.runs} runs "
               f"({', '.join(f'{n} {s}' for s, n in sorted(self.statuses.items()))}), {self.alarms} alarms, "
               f"{self.stability_checks} stability checks, {self.evaluations} evaluation(s)")
        yield "time: " + ", ".join(f"{part} {s:.1f} s" for part, s in self.seconds.items())


@contextlib.contextmanager
def explicit_timestamps(*fields):
    """Let bulk_create keep the given ``auto_now_add`` fields' values (history happened in the past)."""
    saved = [(f, f.auto_now_add) for f in fields]
    for f in fields:
        f.auto_now_add = False
    try:
        yield
    finally:
        for f, value in saved:
            f.auto_now_add = value


@contextlib.contextmanager
def timed(made, part):
    started = time.perf_counter()
    yield
    made.seconds[part] = time.perf_counter() - started


def synthetic_environments():
    rows = []
    for host, cpu, gpu, driver, cuda, python, torch in ENVIRONMENTS:
        facts = {"synthetic": True, "host": host, "cpu": cpu, "gpu": gpu, "gpu_driver": driver, "cuda": cuda,
                 "python": python, "packages": {"torch": torch}}
        fingerprint = hashlib.sha256(f"{PREFIX}:{host}:{torch}".encode()).hexdigest()
        environment, _ = Environment.objects.get_or_create(
            fingerprint=fingerprint, defaults={"host": host, "cpu": cpu, "gpu": gpu, "gpu_driver": driver,
                                               "cuda": cuda, "python": python, "torch": torch, "facts": facts})
        rows.append(environment)
    return rows


def latest_versions():
    """The latest approved version of every loaded reproducer, bug reproducers first (runs only ever
    name approved versions)."""
    approved = ReproducerVersion.objects.approved().filter(reproducer__track=Track.CATALOG)
    latest = (ReproducerVersion.objects.filter(pk__in=approved.latest_ids().values())
              .select_related("reproducer__bug").defer("files"))
    return sorted(latest, key=lambda v: (v.reproducer.is_reference_pipeline, str(v.reproducer)))


def campaign_sizes(runs, campaigns, rng):
    """Uneven campaign sizes summing to ``runs``: the first is the largest (a quarter of all runs)."""
    if campaigns == 1:
        return [runs]
    largest = max(1, runs // 4)
    weights = [rng.uniform(0.2, 1.0) for _ in range(campaigns - 1)]
    rest = runs - largest
    sizes = [math.floor(rest * w / sum(weights)) for w in weights]
    sizes[0] += rest - sum(sizes)
    return [largest] + sizes


def step_records(rng, buggy_manifests, trigger_step, start, step_seconds):
    loss, records = rng.uniform(2.0, 3.0), []
    for step in range(STEPS):
        if buggy_manifests and step >= trigger_step:
            loss *= rng.uniform(1.0, 1.15)
        else:
            loss *= rng.uniform(0.85, 0.99)
        records.append({"step": step, "rank": 0, "loss": round(loss, 5), "time": round(start + step * step_seconds, 3),
                        "metrics": {}})
    return records


def make_run(rng, campaign, environment, version, detector, variant, seed, live, now):
    queued = campaign.created_at + timedelta(seconds=rng.uniform(0, 3600))
    is_bug = version.reproducer.bug_id is not None
    trigger_step = (version.pk * 7) % 8 + 1 if is_bug else None
    roll = rng.random()
    if live and roll < 0.3:
        status = RunStatus.QUEUED if roll < 0.25 else RunStatus.RUNNING
    elif roll < 0.93:
        status = RunStatus.SUCCEEDED
    elif roll < 0.99:
        status = RunStatus.FAILED
    else:
        status = RunStatus.CANCELLED
    run = Run(campaign=campaign, reproducer_version=version, detector=detector, variant=variant, seed=seed,
              steps=STEPS, queue="gpu" if version.reproducer.needs_cuda else "cpu", status=status,
              queued_at=min(queued, now), environment=environment if status != RunStatus.QUEUED else None,
              attempts=0 if status == RunStatus.QUEUED else (2 if rng.random() < 0.02 else 1))
    if status == RunStatus.CANCELLED:  # as do_cancel_campaign leaves it
        run.failure_kind, run.failure_reason = RunFailureKind.CANCELLED, cancelled_before_start(actor_label(None))
    if status in (RunStatus.QUEUED, RunStatus.CANCELLED):
        return run
    started = run.queued_at + timedelta(seconds=rng.expovariate(1 / 20))
    run.started_at = started
    if status == RunStatus.RUNNING:
        return run
    wall = rng.lognormvariate(2.2, 0.5) * (4 if detector.name.startswith("traincheck") else 1)
    run.wall_seconds = round(wall, 3)
    run.finished_at = started + timedelta(seconds=wall)
    if status == RunStatus.FAILED:
        share, exit_code, builder, arguments = rng.choices(FAILURES, weights=[f[0] for f in FAILURES])[0]
        run.exit_code = exit_code
        run.failure_reason = builder(*arguments(run_limits(version)))
        run.failure_kind = kind_of(builder)
        run.stderr = f"{PREFIX} stderr: {run.failure_reason}\n"
        return run
    manifests = is_bug and variant == "buggy" and rng.random() < 0.95 or variant == "fixed" and rng.random() < 0.01
    start_unix = started.timestamp() + 1.5
    step_seconds = (wall - 1.5) / STEPS
    run.exit_code = 0
    run.manifested = manifests
    run.trigger_step = trigger_step
    run.trigger_time = start_unix + trigger_step * step_seconds if trigger_step is not None else None
    run.oracle_summary = f"{PREFIX} oracle: {'symptom manifested' if manifests else 'no symptom'}"
    run.step_records = step_records(rng, manifests, trigger_step or STEPS, start_unix, step_seconds)
    run.stdout = f"{PREFIX} run of {version.reproducer} ({variant}, seed {seed})\n"
    if detector.name.startswith("traincheck"):
        run.analysis_seconds = round(rng.uniform(5, 40), 2)
        run.detector_summary = {"rules_deployed": 300, "rules_failed": rng.randint(0, 6)}
    return run


def plan_campaigns(versions, detectors, sizes, environments, rng):
    """(name, parameters, environment, [(version, detector, variant, seed)]) per campaign."""
    combos = [(version, detector, variant) for version in versions for detector in detectors
              for variant in version.reproducer.variants]
    plans = []
    for index, size in enumerate(sizes):
        environment = environments[index % len(environments)]
        order = combos[:]
        rng.shuffle(order)
        items = [(*order[i % len(order)], i // len(order)) for i in range(size)]
        kind = "nightly sweep" if index == 0 else rng.choice(["re-verification", "detector comparison",
                                                              "seed sweep", "new release check"])
        name = f"{PREFIX} #{index + 1}: {kind} on {environment.host} (torch {environment.torch})"
        parameters = {"synthetic": True, "seeds": sorted({item[3] for item in items})[:100], "kind": kind}
        plans.append((name, parameters, environment, items))
    return plans


@dataclass
class AlarmTarget:
    """What alarms need of a succeeded detector run (the runs themselves would hold their step records)."""

    pk: int
    detector: str
    after_trigger: bool
    first_step: int
    start: float
    step_seconds: float

    @classmethod
    def of(cls, run):
        after_trigger = bool(run.variant == "buggy" and run.manifested and run.trigger_step)
        start = run.step_records[0]["time"]
        return cls(run.pk, run.detector.name, after_trigger, run.trigger_step if after_trigger else 0, start,
                   run.step_records[1]["time"] - start)


def insert_alarms(rng, alarm_runs, total, made):
    """``total`` alarms spread over succeeded detector runs: buggy runs fire mostly after the trigger."""
    if not alarm_runs or not total:
        return
    weights = [3.0 if run.after_trigger else 0.3 for run in alarm_runs]
    counts = Counter(rng.choices(range(len(alarm_runs)), weights=weights, k=total))
    evidence = Alarm._meta.get_field("evidence").get_db_prep_save({"synthetic": True}, connection)
    table = Alarm._meta.db_table
    sql = (f"INSERT INTO {table} (run_id, step, rank, rule, message, evidence, time) "
           "VALUES (%s, %s, %s, %s, %s, %s, %s)")
    rows = []
    with connection.cursor() as cursor:
        for index, count in sorted(counts.items()):
            run = alarm_runs[index]
            rules = RULES.get(run.detector, ["anomaly"])
            for _ in range(count):
                step = rng.randint(run.first_step, STEPS - 1) if rng.random() < 0.9 else rng.randint(0, STEPS - 1)
                rule = rng.choice(rules)
                rows.append((run.pk, step, 0, rule, f"{PREFIX} alarm: {rule} at step {step}", evidence,
                             run.start + step * run.step_seconds))
            if len(rows) >= ALARM_BATCH:
                cursor.executemany(sql, rows)
                made.alarms += len(rows)
                rows = []
        if rows:
            cursor.executemany(sql, rows)
            made.alarms += len(rows)


def insert_stability_checks(rng, versions, environments, now, made):
    """Three checks of every bug reproducer in every environment over the past year, mostly verified."""
    checks = []
    for version in versions:
        if version.reproducer.is_reference_pipeline:
            continue
        for environment in environments:
            for repeat in range(3):
                seeds = 5
                roll = rng.random()
                buggy = seeds if roll < 0.85 else (rng.randint(1, seeds - 1) if roll < 0.95 else 0)
                fixed = 0 if rng.random() < 0.97 else 1
                failed = 0 if rng.random() < 0.95 else 1
                checks.append(StabilityCheck(
                    reproducer_version=version, environment=environment, seeds=seeds,
                    buggy_manifested=buggy, fixed_manifested=fixed, failed_runs=failed,
                    verdict=StabilityCheck.verdict_for(seeds, buggy, fixed, failed),
                    checked_at=now - timedelta(days=365 - 120 * repeat, minutes=rng.randint(0, 600))))
    with explicit_timestamps(StabilityCheck._meta.get_field("checked_at")):
        StabilityCheck.objects.bulk_create(checks, batch_size=RUN_BATCH)
    made.stability_checks = len(checks)


def store_evaluation(campaign, made):
    """One stored evaluation over a campaign, so the results page has a default to show."""
    from evaluation.models import Evaluation
    from evaluation.tables import detection_table, false_positive_table, latency_table

    def records(frame):  # as manage.py evaluate stores them
        return json.loads(frame.to_json(orient="records"))

    runs = campaign.runs.all()
    Evaluation.objects.create(
        campaign=campaign, parameters={"synthetic": True, "campaign": campaign.pk},
        tables={"detection": records(detection_table(runs)), "false_positives": records(false_positive_table(runs)),
                "latency": records(latency_table(runs)), "overhead": [], "fits": []})
    made.evaluations = 1


def seed_history(runs=100_000, alarms=1_000_000, campaigns=None, seed=0, evaluation=True, log=print):
    """Fill the database with a synthetic history on top of the loaded catalog; return what was made."""
    rng = random.Random(seed)
    made = Made()
    versions = latest_versions()
    if not versions:
        raise ValueError("no reproducer versions: load the catalog first (manage.py load_catalog)")
    detectors = list(do_sync_detectors().values())
    campaigns = campaigns or max(1, round(runs / 2500))
    now = timezone.now()
    with timed(made, "setup"):
        environments = synthetic_environments()
        made.environments = len(environments)
        sizes = campaign_sizes(runs, campaigns, rng)
        plans = plan_campaigns(versions, detectors, sizes, environments, rng)
    alarm_runs, created_campaigns = [], []
    run_fields = [Run._meta.get_field("queued_at"), Campaign._meta.get_field("created_at")]
    with transaction.atomic(), explicit_timestamps(*run_fields):
        with timed(made, "runs"):
            for index, (name, parameters, environment, items) in enumerate(plans):
                created = now - timedelta(days=360 * (len(plans) - index) / len(plans), hours=2)
                campaign = Campaign.objects.create(name=name, parameters=parameters, created_at=created)
                created_campaigns.append((len(items), campaign))
                made.campaigns += 1
                live = index == len(plans) - 1 and len(plans) > 1
                if not live:  # finished campaigns are completed, as do_complete_campaign would mark them
                    Campaign.objects.filter(pk=campaign.pk).update(completed_at=created + timedelta(hours=1))
                for start in range(0, len(items), RUN_BATCH):
                    batch = [make_run(rng, campaign, environment, version, detector, variant, s, live, now)
                             for version, detector, variant, s in items[start:start + RUN_BATCH]]
                    Run.objects.bulk_create(batch)
                    made.runs += len(batch)
                    made.statuses.update(run.status for run in batch)
                    alarm_runs.extend(AlarmTarget.of(r) for r in batch
                                      if r.status == RunStatus.SUCCEEDED and r.detector.name != "plain")
                log(f"  {name}: {len(items)} runs")
        with timed(made, "alarms"):
            insert_alarms(rng, alarm_runs, alarms, made)
        with timed(made, "stability checks"):
            insert_stability_checks(rng, versions, environments, now, made)
    if evaluation and len(created_campaigns) > 1:
        with timed(made, "evaluation"):  # over the smallest finished campaign (the newest one is still live)
            store_evaluation(min(created_campaigns[:-1], key=lambda item: item[0])[1], made)
    made.seconds["total"] = sum(made.seconds.values())
    return made
