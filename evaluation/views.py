from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import render

from core.exports import EXPORT_FORMATS, download
from runners.selectors import visible_campaigns

from .charts import detection_heatmap, false_positive_chart, latency_chart, overhead_chart
from .compare import compare_query, comparison_frame
from .leaderboard import build_leaderboard
from .methodology import CITATION, detectors, sections
from .models import Evaluation
from .results import TABLES, NotFound, Results, results_viewer
from .tables import matrix


def selected_results(request):
    try:
        return Results(request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error


def results(request):
    results = selected_results(request)
    detection, false_positives = results.table("detection"), results.table("false-positives")
    latency, overhead = results.table("latency"), results.table("overhead")
    detectors, rows = matrix(detection)
    return render(request, "evaluation/results.html", {
        "detectors": detectors, "rows": rows, "evaluation": results.evaluation, "results": results,
        "filter_form": results.form,
        "false_positives": false_positives.to_dict("records"), "latency": latency.to_dict("records"),
        "overhead": overhead.to_dict("records"), "fits": results.fits,
        "heatmap": detection_heatmap(detection), "false_positive_chart": false_positive_chart(false_positives),
        "latency_chart": latency_chart(results.run_latencies()), "overhead_chart": overhead_chart(overhead),
        "campaigns": visible_campaigns(results.viewer).order_by("-created_at")[:50],
        "evaluations": Evaluation.objects.filter(campaign__in=visible_campaigns(results.viewer))[:20],
        "query": request.GET.urlencode(),
        "formats": list(EXPORT_FORMATS), "tables": list(TABLES),
    })


def export_table(request, table, fmt):
    if table not in TABLES or fmt not in EXPORT_FORMATS:
        raise Http404("Unknown table or format.")
    results = selected_results(request)
    if results.errors:
        return HttpResponseBadRequest(f"Invalid filter: {results.errors.as_text()}", content_type="text/plain")
    return download(table, results.table(table), fmt)


def compare(request):
    form, filters, result = compare_query(request.GET, request.user)
    return render(request, "evaluation/compare.html", {
        "form": form, "filter_form": filters, "comparison": result, "query": request.GET.urlencode(),
        "formats": list(EXPORT_FORMATS),
    })


def compare_export(request, fmt):
    if fmt not in EXPORT_FORMATS:
        raise Http404("Unknown format.")
    form, filters, result = compare_query(request.GET, request.user)
    if result is None or filters.errors:
        errors = form.errors.as_text() or filters.errors.as_text() or "choose sides a and b"
        return HttpResponseBadRequest(f"Invalid comparison: {errors}", content_type="text/plain")
    return download("comparison", comparison_frame(result.shown), fmt)


def leaderboard(request):
    """One row per detector, ranked by the bugs caught beyond the fixed twin (evaluation.leaderboard)."""
    try:
        board = build_leaderboard(request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error
    return render(request, "evaluation/leaderboard.html", {
        "board": board, "summary": board.runs_summary(),
        "evaluations": Evaluation.objects.filter(campaign__in=visible_campaigns(board.results.viewer))[:20],
    })


def methodology(request):
    """The definitions, rendered from the code that applies them (evaluation.methodology), and how to cite the
    latest evaluation the reader may see."""
    evaluation = Evaluation.objects.filter(
        campaign__in=visible_campaigns(results_viewer(request.user))).select_related("campaign").first()
    return render(request, "evaluation/methodology.html", {
        "sections": sections(), "detectors": detectors(), "citation": CITATION, "evaluation": evaluation,
    })
