from collections import defaultdict

from django.db import migrations, models

# How the failure reasons that runners wrote before this migration begin (runners/sandbox.py, execution.py,
# tasks.py, actions.py, routing.py), and the kind each stands for; the first match decides. Frozen here:
# the live sentences may change, these are the ones already stored. (prefix, suffix or "", kind)
PATTERNS = [
    ("Refused: this reproducer version is not approved", "", "unapproved"),  # runners.tasks
    ("Internal error before the reproducer ran:", "", "internal"),
    ("The detector's fit phase failed:", "", "fit_failed"),
    ("The detector's offline check failed:", "", "internal"),
    ("No oracle report:", "", "protocol"),
    ("Process limit exceeded:", "", "process_limit"),
    ("Process limit reached:", "", "process_limit"),
    ("Time limit exceeded:", "", "time_limit"),
    ("Output flood:", "", "output_flood"),
    ("Out of memory:", "", "memory"),
    ("Refused by the sandbox:", "", "sandbox_refusal"),
    ("Crashed:", "", "crash"),
    ("No worker can serve this run:", "", "unservable"),  # runners.routing.unservable_reason
    ("This worker cannot serve the run:", "", "unservable"),  # runners.routing.NotEnoughDevices
    ("Cancelled by ", "", "cancelled"),
    ("Lost:", "", "lost"),  # runners.failures.timer_interrupted
    # devtools.synthetic's made-up history (load tests) wrote sentences of its own until this migration
    ("time limit of ", "", "time_limit"),
    ("out of memory:", "", "memory"),
    ("output flood:", "", "output_flood"),
    ("exit code ", "(protocol error)", "protocol"),
    ("worker lost:", "", "lost"),
]
FALLBACK = {"failed": "crash", "cancelled": "cancelled"}
BATCH = 1000


def classify(status, reason):
    """The failure kind of a run stored before kinds existed, from its status and reason; '' for a run
    that neither failed nor was cancelled. Unrecognised reasons: crash when failed, cancelled when cancelled."""
    if status not in FALLBACK:
        return ""
    reason = (reason or "").strip()
    for prefix, suffix, kind in PATTERNS:
        if reason.startswith(prefix) and reason.endswith(suffix):
            return kind
    return FALLBACK[status]


def classify_stored_runs(apps, schema_editor):
    Run = apps.get_model("runners", "Run")
    by_kind = defaultdict(list)
    unclassified = Run.objects.filter(status__in=list(FALLBACK), failure_kind="").order_by()
    for run_id, status, reason in unclassified.values_list("id", "status", "failure_reason").iterator(chunk_size=BATCH):
        by_kind[classify(status, reason)].append(run_id)
    for kind, run_ids in by_kind.items():
        for start in range(0, len(run_ids), BATCH):
            Run.objects.filter(pk__in=run_ids[start:start + BATCH]).update(failure_kind=kind)


class Migration(migrations.Migration):

    dependencies = [
        ('runners', '0006_stabilitycheck_from_bugs_overhead_purpose'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='failure_kind',
            field=models.CharField(blank=True, choices=[('time_limit', 'Time limit'), ('memory', 'Out of memory'), ('output_flood', 'Output flood'), ('process_limit', 'Process limit'), ('sandbox_refusal', 'Refused by the sandbox'), ('crash', 'Crashed'), ('protocol', 'Protocol error'), ('fit_failed', 'Fit phase failed'), ('unapproved', 'Not approved'), ('internal', 'Internal error'), ('unservable', 'No worker can serve it'), ('cancelled', 'Cancelled'), ('lost', 'Lost')], db_index=True, help_text='Why it failed or was cancelled; empty for runs that did not.', max_length=32),
        ),
        migrations.RunPython(classify_stored_runs, migrations.RunPython.noop),
    ]
