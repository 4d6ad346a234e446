import pandas as pd
from django.http import Http404, HttpResponse
from django.shortcuts import render

from runners.models import Campaign, Run

from .models import Evaluation
from .overhead import OVERHEAD_COLUMNS
from .tables import (
    DETECTION_COLUMNS,
    EXPORT_FORMATS,
    FALSE_POSITIVE_COLUMNS,
    LATENCY_COLUMNS,
    detection_table,
    export,
    false_positive_table,
    latency_table,
    matrix,
)

# table name in URLs -> (key in Evaluation.tables, function over runs or None, columns). The columns are
# explicit because PostgreSQL's jsonb does not keep the key order of stored records.
TABLES = {
    "detection": ("detection", detection_table, DETECTION_COLUMNS),
    "false-positives": ("false_positives", false_positive_table, FALSE_POSITIVE_COLUMNS),
    "latency": ("latency", latency_table, LATENCY_COLUMNS),
    "overhead": ("overhead", None, OVERHEAD_COLUMNS),
}


def _id(request, name):
    value = request.GET.get(name, "")
    return int(value) if value.isdigit() else None


def selection(request):
    """(evaluation, runs): ?evaluation=ID shows an evaluation's stored tables, ?campaign=ID the live
    tables of a campaign's runs; with neither, the latest evaluation, or all runs if there is none."""
    evaluation_id, campaign_id = _id(request, "evaluation"), _id(request, "campaign")
    if campaign_id is not None:
        return None, Run.objects.filter(campaign_id=campaign_id)
    evaluations = Evaluation.objects.all()
    evaluation = (evaluations.filter(pk=evaluation_id) if evaluation_id is not None else evaluations).first()
    if evaluation_id is not None and evaluation is None:
        raise Http404("No such evaluation.")
    return evaluation, (evaluation.campaign.runs.all() if evaluation else Run.objects.all())


def selected_runs(request):
    return selection(request)[1]


def table_frame(name, evaluation, runs):
    """The table as a DataFrame whose missing values are None (pandas' NaN would print as "nan")."""
    key, compute, columns = TABLES[name]
    if evaluation is not None:
        frame = pd.DataFrame.from_records(evaluation.tables.get(key, []), columns=columns)
    elif compute is None:
        frame = pd.DataFrame.from_records([], columns=columns)  # overhead exists only for a full evaluation
    else:
        frame = compute(runs)
    return frame.astype(object).where(frame.notna(), None)


def results(request):
    evaluation, runs = selection(request)
    detection = table_frame("detection", evaluation, runs)
    detectors, rows = matrix(detection)
    return render(request, "evaluation/results.html", {
        "detectors": detectors, "rows": rows, "evaluation": evaluation,
        "false_positives": table_frame("false-positives", evaluation, runs).to_dict("records"),
        "latency": table_frame("latency", evaluation, runs).to_dict("records"),
        "overhead": table_frame("overhead", evaluation, runs).to_dict("records"),
        "fits": evaluation.tables.get("fits", []) if evaluation else [],
        "campaigns": Campaign.objects.order_by("-created_at")[:50],
        "evaluations": Evaluation.objects.all()[:20],
        "query": request.GET.urlencode(),
        "formats": list(EXPORT_FORMATS), "tables": list(TABLES),
    })


def export_table(request, table, fmt):
    if table not in TABLES or fmt not in EXPORT_FORMATS:
        raise Http404("Unknown table or format.")
    evaluation, runs = selection(request)
    text = export(table_frame(table, evaluation, runs), fmt, caption=f"SilentBench {table.replace('-', ' ')}")
    response = HttpResponse(text, content_type=f"{EXPORT_FORMATS[fmt]}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="silentbench-{table}.{fmt}"'
    return response
