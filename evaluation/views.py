from django.contrib.auth.decorators import permission_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpResponse, HttpResponseBadRequest, HttpResponseNotFound
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST

from bugs.models import BugStatus
from bugs.selectors import visible_bugs
from core.caching import cached, digest, rendered_blocks
from core.exports import EXPORT_FORMATS, download, table_download
from runners.detectors import all_plugins, campaign_plugins
from runners.detectors.bundle import Bundle
from runners.models import CampaignPurpose, Detector, DetectorVersion
from runners.permissions import TRIGGER_PERMISSION

from . import charts
from . import sensitivity as sensitivity_page
from .actions import do_start_bisection
from .bisections import BisectionForm, bisection_path
from .charts import (
    detection_against_false_positives,
    detection_heatmap,
    false_positive_chart,
    latency_chart,
    overhead_chart,
)
from .citation import benchmark_bibtex, evaluation_bibtex
from .compare import compare_query, comparison_frame
from .detector_pages import detector_page
from .entries import entries_export, entry_of, open_entries, scored_versions
from .exports import EXPORT_TABLES, InvalidFilter, results_export
from .integrity import alarmed_under_every_detector
from .leaderboard import build_leaderboard, selection_query
from .methodology import CITATION, detectors, sections
from .models import Bisection, Device, SensitivityEvaluation
from .results import TABLES, NotFound, Results, environment_tabs, latest_evaluation, results_viewer, shown_once
from .run_lists import InvalidRunList, run_list
from .tables import by_integration, matrix
from .tasks import advance_bisection
from .versions import matrix_campaigns, selected_matrix, versions_export


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
        # a sensitivity campaign's tables are at /results/sensitivity/
        "campaigns": results.campaigns.exclude(purpose=CampaignPurpose.SENSITIVITY)
        .order_by("-created_at").only("id", "name")[:50],
        "evaluations": dropdown(results.evaluations),
        "environments": environment_tabs(results.viewer, results.evaluation),
    }


def dropdown(evaluations):
    """The newest 20 of ``evaluations``, with only what their dropdown shows (not their parameters or campaign)."""
    return evaluations.select_related(None).only("id", "created_at", "published_id", "device")[:20]


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
        "alarmed_everywhere": alarmed_under_every_detector(
            detection.to_dict("records"), {name for name, plugin in all_plugins().items() if plugin.instruments}),
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


def run_list_page(request):
    """The runs behind a count (evaluation.run_lists), 50 to a page. While the selection cannot change
    (``Results.cache_key``), each page of the list is rendered once for the same rows it shows (``shown_once``)."""
    try:
        listed = run_list(request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error
    except InvalidRunList as error:
        return HttpResponseBadRequest(f"Invalid run list: {error}.", content_type="text/plain; charset=utf-8")

    def blocks():
        page = Paginator(listed.runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
        return rendered_blocks("evaluation/run_list.html", {
            "listed": listed, "page_obj": page, "runs": list(page.object_list), "show_bug": True,
            "member": "" if listed.narrowed.get("detector") == Bundle.name else listed.narrowed.get("detector", "")},
            request)

    selection = listed.results.cache_key
    return render(request, "page.html", {"blocks": shown_once(request, f"run-list:{selection}", blocks)
                                         if selection else blocks()})


RUNS_PER_PAGE = 50


def home(request):
    """The front door: what SilentBench measures, the top of the latest stored evaluation's leaderboard with
    intervals, detection against false alarms in one plot, and where to go next. Rendered once for the same rows
    (``shown_once``)."""
    # its citation names the address it was read at: kept per scheme and host
    part = f"home-page:{digest([request.scheme, request.get_host()])}"
    return render(request, "evaluation/home.html", {"content": shown_once(request, part, lambda: (
        render_to_string("evaluation/home_content.html", home_context(request), request)))})


def home_context(request):
    board = build_leaderboard({}, request.user, stored_only=True)
    evaluation = board and board.evaluation
    return {"board": board, "evaluation": evaluation,
            "chart": board and board.ranked and detection_against_false_positives(board),
            "bugs": visible_bugs(request.user).filter(status__in=IN_THE_BENCHMARK).count(),
            "evaluated_bugs": board and max((standing.bugs for standing in board.ranked), default=0),
            "detectors": (len(board.ranked) + len(board.opt_in)) if board else len(campaign_plugins()) - 1,
            "top": HOME_TOP,
            "evaluation_bibtex": evaluation and evaluation_bibtex(evaluation, evaluation_url(request, evaluation))}


HOME_TOP = 5  # leaderboard rows on the front door
# The bugs the front door counts: approved by a maintainer and not retired (not those waiting for review)
IN_THE_BENCHMARK = (BugStatus.APPROVED, BugStatus.VERIFIED, BugStatus.FLAKY, BugStatus.UNREPRODUCIBLE)


def leaderboard(request):
    """One row per detector, ranked by the bugs caught beyond the fixed twin (evaluation.leaderboard), rendered once
    for the same rows it shows (``shown_once``)."""
    return render(request, "page.html", {"blocks": shown_once(request, "leaderboard-page", lambda: rendered_blocks(
        "evaluation/leaderboard.html", leaderboard_context(request), request))})


def leaderboard_context(request):
    """The selection's ranking; with no selection asked for, the open leaderboard of detector versions above it."""
    try:
        board = build_leaderboard(request.GET, request.user)
    except NotFound as error:
        raise Http404(str(error)) from error
    selection = selection_query(request.GET)
    # the open leaderboard comes with the default selection (the latest CPU evaluation) only
    entries = None if selection and selection != {"device": Device.CPU} else open_entries(request.user)
    return {"board": board, "summary": board.runs_summary(), "evaluations": dropdown(board.results.evaluations),
            "entries": entries, "environments": environment_tabs(board.results.viewer, board.evaluation)}


def leaderboard_entry(request, pk):
    """One entry of the open leaderboard: its numbers, its citation and exactly what it was scored on."""
    entry = shown_once(request, f"leaderboard-entry:{pk}", lambda: entry_of(pk, request.user))
    if entry is None:
        raise Http404("No scored entry for this detector version (not approved, or its scoring has not completed).")
    versions, others = scored_versions(entry, request.user)
    return render(request, "evaluation/leaderboard_entry.html", {"entry": entry, "versions": versions,
                                                                "others": others})


def leaderboard_detector(request, name):
    """The versions of a detector were listed here before detectors had pages of their own: the page has them."""
    return redirect("detector", name=name, permanent=True)


def detector(request, name):
    """A detector's page (evaluation.detector_pages), rendered once for the same rows it shows. A name that no
    detector has is a 404 at once, before anything is judged or kept."""
    if name not in all_plugins() and not Detector.objects.filter(name=name).exists() \
            and not DetectorVersion.objects.filter(name=name).exists():
        raise Http404(f"No detector named {name!r}.")

    def content():
        page = detector_page(name, request.user)
        return page and render_to_string("evaluation/detector_content.html", {"page": page}, request)

    html = shown_once(request, f"detector-page:{name}", content)
    if html is None:
        raise Http404(f"No detector named {name!r}.")
    return render(request, "evaluation/detector.html", {"content": html, "name": name})


def leaderboard_entries_download(request, fmt):
    """The open leaderboard as a download (``manage.py export entries`` prints the same)."""
    if fmt not in EXPORT_FORMATS:
        raise Http404("Unknown format.")
    return shown_once(request, f"entries-export:{fmt}",
                      lambda: table_download(entries_export(request.user), fmt))


def methodology(request):
    """The definitions, rendered from the code that applies them (evaluation.methodology), and how to cite the
    latest evaluation the reader may see."""
    evaluation = latest_evaluation(results_viewer(request.user))
    return render(request, "evaluation/methodology.html", {
        "sections": sections(), "detectors": detectors(), "citation": CITATION, "evaluation": evaluation,
        "benchmark_bibtex": benchmark_bibtex(),
        "evaluation_bibtex": evaluation and evaluation_bibtex(evaluation, evaluation_url(request, evaluation)),
    })


def evaluation_url(request, evaluation):
    return request.build_absolute_uri(evaluation.get_absolute_url())


def citation_bib(request):
    """BibTeX of the latest evaluation the reader may see (when there is one), then of the benchmark."""
    evaluation = latest_evaluation(results_viewer(request.user))
    entries = [*([evaluation_bibtex(evaluation, evaluation_url(request, evaluation))] if evaluation else []),
               benchmark_bibtex()]
    response = HttpResponse("\n".join(entries), content_type="application/x-bibtex; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="silentbench.bib"'
    return response


def versions(request):
    """The bug x torch release matrix of the newest version-matrix campaign, or of those ``?campaign=`` names."""
    context = {"campaigns": matrix_campaigns(request.user)[:20], "formats": list(EXPORT_FORMATS),
               "query": request.GET.urlencode()}
    try:
        context["matrix"] = selected_matrix(request.GET, request.user)
    except NotFound as error:
        context["error"] = str(error)
        return render(request, "evaluation/versions.html", context, status=404 if "campaign" in request.GET else 200)
    return render(request, "evaluation/versions.html", context)


def versions_download(request, fmt):
    if fmt not in EXPORT_FORMATS:
        raise Http404("Unknown format.")
    try:
        export = versions_export(request.GET, request.user)
    except NotFound as error:
        return HttpResponseNotFound(str(error), content_type="text/plain; charset=utf-8")
    return table_download(export, fmt)


def visible_bisections(user):
    """The bisections of the bugs ``user`` may see."""
    return Bisection.objects.filter(bug__in=visible_bugs(user)).select_related("bug", "reproducer_version__reproducer")


def bisections(request, form=None, status=200):
    """The bisections (of one bug with ``?bug=``), and for maintainers the form that starts one."""
    shown = visible_bisections(request.user)
    bug = request.GET.get("bug") or (form.data.get("bug") if form is not None else None)
    if bug:
        shown = shown.filter(bug__bug_id=bug)
    if form is None and request.user.has_perm(TRIGGER_PERMISSION):
        form = BisectionForm(initial={"bug": bug})
    return render(request, "evaluation/bisections.html", {"bisections": shown[:100], "bug": bug, "form": form},
                  status=status)


@require_POST
@permission_required(TRIGGER_PERMISSION, raise_exception=True)
def bisection_start(request):
    """Start a bisection; its driver runs on the workers (evaluation.tasks.advance_bisection), not here."""
    form = BisectionForm(request.POST)
    if not form.is_valid():
        return bisections(request, form, status=400)
    bug = visible_bugs(request.user).filter(bug_id=form.cleaned_data["bug"]).first()
    if bug is None:
        form.add_error("bug", "No such bug.")
        return bisections(request, form, status=400)
    data = form.cleaned_data
    try:
        bisection = do_start_bisection(bug, data["good"], data["bad"], seeds=range(data["seeds"]),
                                       releases=data["releases"], workers=data["workers"], acting_user=request.user)
    except ValidationError as error:
        form.add_error(None, error)
        return bisections(request, form, status=400)
    transaction.on_commit(lambda: advance_bisection.delay(bisection.pk))
    return redirect(bisection)


def bisection_detail(request, pk):
    bisection = get_object_or_404(visible_bisections(request.user), pk=pk)
    return render(request, "evaluation/bisection_detail.html", {"bisection": bisection,
                                                                "path": bisection_path(bisection)})


def sensitivity(request):
    """The latest sensitivity evaluation: its dose-response curves and tables, apart from the real-bug results."""
    evaluation = SensitivityEvaluation.objects.select_related("campaign").first()
    context = {"evaluation": evaluation, "tables": sensitivity_page.EXPORTED}
    if evaluation is not None:
        tables = {name: evaluation.tables.get(name) or [] for name in sensitivity_page.TABLES}
        context.update(
            charts=[(fault_class, charts.dose_response_chart(tables["dose_response"], fault_class))
                    for fault_class in ("software", "hardware")],
            thresholds=tables["thresholds"], by_operator=tables["by_operator"], calibration=tables["calibration"],
            clean_false_alarms=tables["clean_false_alarms"], labelled=len(tables["labels"]),
            benign=sum(not label["manifested"] for label in tables["labels"]))
    return render(request, "evaluation/sensitivity.html", context)


def sensitivity_download(request, table, fmt):
    evaluation = SensitivityEvaluation.objects.first()
    if table not in sensitivity_page.EXPORTED or fmt not in EXPORT_FORMATS or evaluation is None:
        raise Http404("Unknown table or format, or no sensitivity evaluation stored.")
    return table_download(sensitivity_page.sensitivity_export(evaluation, table), fmt)
