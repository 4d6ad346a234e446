"""State changes of stored evaluations, as named actions (the acting user is None for the operator's
``manage.py evaluate``)."""
import json

from django.db import transaction

from core import audit
from runners.models import RunStatus

from .models import Evaluation
from .tables import detection_table, false_positive_table, flakiness_table, judged_runs, latency_table


def records(frame):
    return json.loads(frame.to_json(orient="records"))


def run_counts(runs):
    return {"runs": runs.count(), "failed_runs": runs.filter(status=RunStatus.FAILED).count(),
            "retried_runs": runs.filter(attempts__gt=1).count()}


def run_tables(runs):
    """The tables computed from an evaluation's runs (overhead and fits are measured apart)."""
    judged = judged_runs(runs)
    return {name: records(table(judged=judged)) for name, table in (
        ("detection", detection_table), ("false_positives", false_positive_table), ("latency", latency_table),
        ("flakiness", flakiness_table))}


@transaction.atomic
def do_store_evaluation(campaign, overhead_campaign, overhead, fits, parameters, wall_seconds, *, acting_user):
    """Store a finished evaluation: its tables computed from its campaign's runs, with the overhead and
    fit tables measured apart."""
    runs = campaign.runs.all()
    evaluation = Evaluation.objects.create(
        campaign=campaign, overhead_campaign=overhead_campaign, parameters={**parameters, **run_counts(runs)},
        tables={**run_tables(runs), "overhead": overhead, "fits": fits}, wall_seconds=wall_seconds)
    audit.record(acting_user, "create", evaluation, f"stored evaluation #{evaluation.pk} of {campaign}")
    return evaluation


@transaction.atomic
def do_retabulate_evaluation(evaluation, *, acting_user):
    """Recompute a stored evaluation's run tables from its runs (after retried runs finished)."""
    runs = evaluation.campaign.runs.all()
    previous = evaluation.parameters.copy()
    evaluation.tables = {**evaluation.tables, **run_tables(runs)}
    evaluation.parameters = {**evaluation.parameters, **run_counts(runs)}
    evaluation.save(update_fields=["tables", "parameters"])
    audit.record(acting_user, "retabulate", evaluation, f"recomputed the tables of evaluation #{evaluation.pk}",
                 previous_counts={key: previous.get(key) for key in ("runs", "failed_runs", "retried_runs")})
    return evaluation
