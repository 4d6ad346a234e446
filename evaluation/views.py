from django.http import Http404, HttpResponse
from django.shortcuts import render

from runners.models import Campaign, Run

from .tables import EXPORT_FORMATS, detection_table, export, false_positive_table, matrix

TABLES = {"detection": detection_table, "false-positives": false_positive_table}


def selected_runs(request):
    """Runs of the campaign in ?campaign=ID, or all runs."""
    campaign_id = request.GET.get("campaign")
    if campaign_id and campaign_id.isdigit():
        return Run.objects.filter(campaign_id=int(campaign_id))
    return Run.objects.all()


def results(request):
    runs = selected_runs(request)
    detection = detection_table(runs)
    detectors, rows = matrix(detection)
    return render(request, "evaluation/results.html", {
        "detectors": detectors, "rows": rows,
        "false_positives": false_positive_table(runs).to_dict("records"),
        "campaigns": Campaign.objects.order_by("-created_at")[:50],
        "selected_campaign": request.GET.get("campaign", ""),
        "formats": list(EXPORT_FORMATS), "tables": list(TABLES),
    })


def export_table(request, table, fmt):
    if table not in TABLES or fmt not in EXPORT_FORMATS:
        raise Http404("Unknown table or format.")
    text = export(TABLES[table](selected_runs(request)), fmt, caption=f"SilentBench {table.replace('-', ' ')}")
    response = HttpResponse(text, content_type=f"{EXPORT_FORMATS[fmt]}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="silentbench-{table}.{fmt}"'
    return response
