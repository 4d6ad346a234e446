from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import render
from django.template.loader import render_to_string

from core.caching import cached, digest, rendered_blocks
from core.exports import EXPORT_FORMATS, download, table_download

from .charts import detection_heatmap, false_positive_chart, latency_chart, overhead_chart
from .compare import compare_query, comparison_frame
from .exports import EXPORT_TABLES, InvalidFilter, results_export
from .leaderboard import build_leaderboard
from .methodology import CITATION, detectors, sections
from .results import TABLES, NotFound, Results, latest_evaluation, results_viewer, shown_once
from .tables import by_integration, matrix


def selected_results(request):
    try:
        return Results(request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error


def results(request):
    """The result tables and plots of one selection, with what it holds (runs, seeds, environments) and which
    filter applies to which section. The tables and plots are rendered once while the selection cannot change
    (``Results.cache_key``), for the query string their links carry, and the whole content once for the same
    rows it shows (``shown_once``)."""
    return render(request, "evaluation/results.html", {"content": shown_once(request, "results-page", lambda: (
        render_to_string("evaluation/results_content.html", results_context(request), request)))})


def results_context(request):
    results = selected_results(request)
    query = request.GET.urlencode()
    tables_html = results.cached(f"page:{digest(query)}", lambda: render_to_string(
        "evaluation/results_tables.html", tables_context(results, query)))
    return {
        "evaluation": results.evaluation, "results": results, "summary": results.runs_summary(),
        "filter_form": results.form, "filter_fields": filter_fields(results.form, query), "tables_html": tables_html,
        "campaigns": results.campaigns.order_by("-created_at").only("id", "name")[:50],
        "evaluations": dropdown(results.evaluations),
    }


def dropdown(evaluations):
    """The newest 20 of ``evaluations``, with only what their dropdown shows (not their parameters or campaign)."""
    return evaluations.select_related(None).only("id", "created_at")[:20]


def filter_fields(form, query):
    """The filter's fields as HTML, rendered once for the same query string and choices (Django renders each
    widget and option through a template: tens of milliseconds for the detectors' and bugs' lists)."""
    choices = [list(form.fields[name].choices) for name in ("detector", "bug")]
    return cached(f"results-filter:{digest((query, choices))}", lambda: render_to_string(
        "evaluation/results_filter_fields.html", {"filter_form": form}))


def tables_context(results, query):
    """What the results page's tables, plots and downloads show (templates/evaluation/results_tables.html)."""
    detection, false_positives = results.table("detection"), results.table("false-positives")
    latency, overhead = results.table("latency"), results.table("overhead")
    detectors, rows = matrix(detection)
    return {
        "detectors": detectors, "rows": rows, "evaluation": results.evaluation, "results": results,
        "summary": results.runs_summary(), "query": query,
        "false_positives": false_positives.to_dict("records"), "latency": latency.to_dict("records"),
        "overhead": overhead.to_dict("records"), "fits": results.fits,
        "heatmap": detection_heatmap(detection), "false_positive_chart": false_positive_chart(false_positives),
        "latency_chart": latency_chart(results.run_latencies()), "overhead_chart": overhead_chart(overhead),
        "formats": list(EXPORT_FORMATS), "tables": list(TABLES), "integrations": by_integration(detectors),
        "flakiness": results.table("flakiness").to_dict("records"),
        "flakiness_computed_now": results.computed_now("flakiness"),
    }


def export_table(request, table, fmt):
    """A table as a download. While the selection cannot change (``Results.cache_key``) the file is made once for
    the query string (a LaTeX table through pandas' Styler costs far more than reading it back), and found again
    by the rows it shows (``shown_once``) without selecting the results anew."""
    if table not in EXPORT_TABLES or fmt not in EXPORT_FORMATS:
        raise Http404("Unknown table or format.")
    query = request.GET.urlencode()
    return shown_once(request, f"export:{table}:{fmt}", lambda: selected_results(request).cached(
        f"export:{table}:{fmt}:{digest(query)}", lambda: export_response(table, fmt, request.GET, request.user)))


def export_response(table, fmt, query, user):
    try:
        export = results_export(table, query, user)
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
    """One row per detector, ranked by the bugs caught beyond the fixed twin (evaluation.leaderboard), rendered once
    for the same rows it shows (``shown_once``)."""
    return render(request, "page.html", {"blocks": shown_once(request, "leaderboard-page", lambda: rendered_blocks(
        "evaluation/leaderboard.html", leaderboard_context(request), request))})


def leaderboard_context(request):
    try:
        board = build_leaderboard(request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error
    return {"board": board, "summary": board.runs_summary(), "evaluations": dropdown(board.results.evaluations)}


def methodology(request):
    """The definitions, rendered from the code that applies them (evaluation.methodology), and how to cite the
    latest evaluation the reader may see."""
    evaluation = latest_evaluation(results_viewer(request.user))
    return render(request, "evaluation/methodology.html", {
        "sections": sections(), "detectors": detectors(), "citation": CITATION, "evaluation": evaluation,
    })
