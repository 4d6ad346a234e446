from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import render

from core.exports import EXPORT_FORMATS, download, table_download
from runners.selectors import visible_campaigns

from .charts import detection_heatmap, false_positive_chart, latency_chart, overhead_chart
from .compare import compare_query, comparison_frame
from .exports import EXPORT_TABLES, InvalidFilter, results_export
from .leaderboard import build_leaderboard
from .methodology import CITATION, detectors, sections
from .results import TABLES, NotFound, Results, evaluations_for, latest_evaluation, results_viewer
from .tables import matrix


def selected_results(request):
    try:
        return Results(request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error


def results(request):
    """The result tables and plots of one selection, with what it holds (runs, seeds, environments) and which
    filter applies to which section."""
    results = selected_results(request)
    detection, false_positives = results.table("detection"), results.table("false-positives")
    latency, overhead = results.table("latency"), results.table("overhead")
    detectors, rows = matrix(detection)
    return render(request, "evaluation/results.html", {
        "detectors": detectors, "rows": rows, "evaluation": results.evaluation, "results": results,
        "summary": results.runs_summary(), "filter_form": results.form,
        "false_positives": false_positives.to_dict("records"), "latency": latency.to_dict("records"),
        "overhead": overhead.to_dict("records"), "fits": results.fits,
        "heatmap": detection_heatmap(detection), "false_positive_chart": false_positive_chart(false_positives),
        "latency_chart": latency_chart(results.run_latencies()), "overhead_chart": overhead_chart(overhead),
        "campaigns": visible_campaigns(results.viewer).order_by("-created_at")[:50],
        "evaluations": evaluations_for(results.viewer)[:20],
        "query": request.GET.urlencode(),
        "formats": list(EXPORT_FORMATS), "tables": list(TABLES),
    })


def export_table(request, table, fmt):
    if table not in EXPORT_TABLES or fmt not in EXPORT_FORMATS:
        raise Http404("Unknown table or format.")
    try:
        export = results_export(table, request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error
    except InvalidFilter as error:
        return HttpResponseBadRequest(f"Invalid filter: {error}", content_type="text/plain")
    return table_download(export, fmt)


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
        "evaluations": evaluations_for(board.results.viewer)[:20],
    })


def methodology(request):
    """The definitions, rendered from the code that applies them (evaluation.methodology), and how to cite the
    latest evaluation the reader may see."""
    evaluation = latest_evaluation(results_viewer(request.user))
    return render(request, "evaluation/methodology.html", {
        "sections": sections(), "detectors": detectors(), "citation": CITATION, "evaluation": evaluation,
    })
