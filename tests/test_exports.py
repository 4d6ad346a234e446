"""One filter, the same numbers: results page == API == web download == ``manage.py export``,
and the catalog downloads."""
import csv
import io
from html.parser import HTMLParser

import pandas as pd
import pytest
from django.core.management import CommandError, call_command
from markdown_it import MarkdownIt

from core.exports import export
from evaluation.exports import PAPER_TABLES
from evaluation.results import TABLES

from .factories import BugFactory, CampaignFactory, EvaluationFactory
from .helpers import HOSTILE, make_runs, table

pytestmark = pytest.mark.django_db

FORMATS = ["csv", "md", "tex", "json"]


def command(*args):
    out = io.StringIO()
    call_command("export", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def runs():
    return make_runs()


def test_page_api_download_and_command_agree_for_a_filter(client, runs):
    query = {"detector": "param_not_updated", "bug": ["TEST-A", "TEST-B"], "fault_location": "framework"}
    page = client.get("/results/", query).content.decode()
    api = client.get("/api/results/", query).json()
    web = client.get("/results/false-positives.json", query).json()
    on_page = table(page, "false-positives")
    assert [(r["Detector"], int(r["Clean runs"]), int(r["With alarm"]), float(r["FP rate"])) for r in on_page] == [
        (r["detector"], r["clean_runs"], r["clean_runs_with_alarm"], r["fp_rate"]) for r in api["false_positives"]
    ] == [(r["detector"], r["clean_runs"], r["clean_runs_with_alarm"], r["fp_rate"]) for r in web] == [
        ("param_not_updated", 1, 1, 1.0)]  # only TEST-B's fault lives in the framework
    assert [r["bug"] for r in api["detection"]] == ["TEST-B", "TEST-B"]
    latency = table(page, "latency")
    assert [float(r["Median steps"]) for r in latency] == [r["median_latency_steps"] for r in api["latency"]] == [4]
    args = ["--detector", "param_not_updated", "--bug", "TEST-A,TEST-B", "--fault-location", "framework"]
    for name in [*TABLES, "matrix"]:
        for fmt in FORMATS:
            response = client.get(f"/results/{name}.{fmt}", query)
            if response.status_code == 404:  # no rows, which LaTeX refuses to typeset: overhead (no evaluation),
                assert (name, fmt) in {("overhead", "tex"), ("flakiness", "tex")}  # flakiness (no run disagreed)
                with pytest.raises(CommandError, match="no rows"):
                    command(name, "--format", fmt, *args)
                continue
            assert response.status_code == 200
            assert command(name, "--format", fmt, *args) == response.content.decode(), (name, fmt)


def test_download_links_carry_the_query(client, runs):
    page = client.get("/results/", {"detector": "plain", "outcome": "missed"}).content.decode()
    assert 'href="/results/detection.csv?detector=plain&amp;outcome=missed"' in page
    assert 'href="/api/results/?detector=plain&amp;outcome=missed"' in page
    rows = list(csv.DictReader(io.StringIO(
        client.get("/results/detection.csv", {"detector": "plain", "outcome": "missed"}).content.decode())))
    assert [(r["bug"], r["detector"], r["outcome"]) for r in rows] == [("TEST-A", "plain", "missed")]
    matrix = page.split('id="detection-matrix"', 1)[1].split("</table>", 1)[0]
    assert "TEST-A" in matrix and "TEST-B" not in matrix


def test_the_matrix_and_the_leaderboard_download_as_on_screen(client):
    """The results page's matrix (a row per bug and reproducer, ``cell_text`` per detector) and the leaderboard
    page's table, the same from the command as from the web, for a campaign's runs."""
    campaign = CampaignFactory(name="paper")
    make_runs(campaign=campaign)
    query = {"campaign": campaign.pk}
    rows = list(csv.DictReader(io.StringIO(client.get("/results/matrix.csv", query).content.decode())))
    assert [(r["bug"], r["reproducer"], r["param_not_updated"], r["plain"]) for r in rows] == [
        ("TEST-A", "cpu", "2/2 (1 beyond fixed)", "0/1"), ("TEST-B", "cpu", "0/1 FA", ""),
        ("TEST-B", "cuda", "1/1 (no fixed twin)", "")]  # the cuda reproducer has no fixed run
    board = client.get("/results/leaderboard.json", query).json()
    assert [(r["rank"], r["detector"], r["beyond_fixed"], r["caught"], r["bugs"]) for r in board] == [
        (1, "param_not_updated", 1, 2, 2), ("baseline", "plain", 0, 0, 1)]
    # of its 3 detected runs, TEST-A's at seed 0 is beyond the fixed twin; TEST-A's at seed 1 and the cuda one have no
    # fixed run of their seed: not the same rule as on the fixed twin, which never ran
    assert [(r["detected_runs"], r["same_rule_as_fixed_runs"], r["no_fixed_twin_runs"]) for r in board] == [
        (3, 0, 2), (0, 0, 0)]
    markdown = client.get("/results/leaderboard.md", query).content.decode()
    assert "| detected_runs | same_rule_as_fixed_runs | no_fixed_twin_runs |" in markdown
    assert "| param_not_updated | drop-in | 2 | 1 | 2 | 3 | 0 | 2 |" in markdown
    csv_board = list(csv.DictReader(io.StringIO(client.get("/results/leaderboard.csv", query).content.decode())))
    assert [(r["same_rule_as_fixed_runs"], r["no_fixed_twin_runs"]) for r in csv_board] == [("0", "2"), ("0", "0")]
    for name in PAPER_TABLES:
        for fmt in FORMATS:
            response = client.get(f"/results/{name}.{fmt}", query)
            assert response.status_code == 200
            assert response["Content-Disposition"] == f'attachment; filename="silentbench-{name}.{fmt}"'
            assert command(name, "--format", fmt, "--campaign", str(campaign.pk)) == response.content.decode()
    assert client.get("/results/leaderboard.csv", {"campaign": 999}).status_code == 404
    page = client.get("/leaderboard/", query).content.decode()
    assert f'href="/results/leaderboard.tex?campaign={campaign.pk}"' in page
    assert f'href="/results/matrix.tex?campaign={campaign.pk}"' in page


def test_outcome_selects_matrix_rows(client, runs):
    api = client.get("/api/results/", {"outcome": "false alarm"}).json()
    assert [(r["bug"], r["reproducer"]) for r in api["detection"]] == [("TEST-B", "cpu")]
    assert len(api["false_positives"]) == 2  # the outcome narrows the matrix, not the runs


def test_a_stored_evaluation_narrowed_by_bug_recomputes_from_its_runs(client):
    campaign = CampaignFactory(name="evaluation")
    make_runs(campaign=campaign)
    stored = {"detection": [{"bug": "TEST-A", "reproducer": "cpu", "detector": "param_not_updated", "buggy_runs": 9,
                             "detected_runs": 9, "outcome": "detected", "fixed_runs": 9, "fixed_runs_with_alarm": 0,
                             "pre_trigger_false_alarm_runs": 0},
                            {"bug": "TEST-B", "reproducer": "cpu", "detector": "param_not_updated", "buggy_runs": 9,
                             "detected_runs": 0, "outcome": "missed", "fixed_runs": 9, "fixed_runs_with_alarm": 0,
                             "pre_trigger_false_alarm_runs": 0}],
              "false_positives": [{"detector": "param_not_updated", "clean_runs": 99, "clean_runs_with_alarm": 0,
                                   "fp_rate": 0.0, "fp_ci_low": 0.0, "fp_ci_high": 0.04}],
              "latency": [], "overhead": []}
    evaluation = EvaluationFactory(campaign=campaign, tables=stored, parameters={"runs": 8})
    whole = client.get("/api/results/").json()
    assert whole["evaluation"] == evaluation.pk and whole["false_positives"][0]["clean_runs"] == 99  # as stored
    narrowed = client.get("/api/results/", {"bug": "TEST-A"}).json()
    assert [(r["bug"], r["buggy_runs"]) for r in narrowed["detection"]] == [("TEST-A", 9)]  # stored rows, filtered
    assert [(r["detector"], r["clean_runs"]) for r in narrowed["false_positives"]] == [
        ("param_not_updated", 1), ("plain", 1)]  # recomputed over TEST-A's runs of the evaluation
    assert command("false-positives", "--format", "csv", "--bug", "TEST-A") == client.get(
        "/results/false-positives.csv", {"bug": "TEST-A"}).content.decode()


def test_bad_filters_and_unknown_evaluations(client, runs):
    assert client.get("/results/detection.csv", {"detector": "no-such-detector"}).status_code == 400
    assert client.get("/api/results/", {"outcome": "excellent"}).status_code == 400
    assert client.get("/results/", {"outcome": "excellent"}).status_code == 200  # the page shows the error
    assert client.get("/results/", {"evaluation": "999"}).status_code == 404
    assert client.get("/api/results/", {"evaluation": "999"}).status_code == 404
    with pytest.raises(CommandError):
        command("detection", "--detector", "no-such-detector")
    with pytest.raises(CommandError):
        command("detection", "--evaluation", "999")


def test_catalog_downloads_follow_the_catalog_filter(client):
    BugFactory(bug_id="TEST-PT", title=HOSTILE)
    BugFactory(bug_id="TEST-DS", framework="deepspeed", title="ZeRO & friends | 50% off_by_one")
    page = client.get("/catalog/", {"framework": "deepspeed"}).content.decode()
    assert 'href="/catalog.tex?framework=deepspeed"' in page
    assert "<script>alert" not in client.get("/catalog/").content.decode()
    rows = list(csv.DictReader(io.StringIO(client.get("/catalog.csv", {"framework": "deepspeed"}).content.decode())))
    assert [(r["bug"], r["framework"], r["title"]) for r in rows] == [
        ("TEST-DS", "DeepSpeed", "ZeRO & friends | 50% off_by_one")]
    everything = client.get("/catalog.json").json()
    assert [r["bug"] for r in everything] == ["TEST-DS", "TEST-PT"] and everything[1]["title"] == HOSTILE
    latex = client.get("/catalog.tex", {"framework": "deepspeed"}).content.decode()
    assert "\\toprule" in latex and "ZeRO \\& friends \\textbar{} 50\\% off\\_by\\_one" in latex
    assert "ZeRO &amp; friends \\| 50% off_by_one" in client.get("/catalog.md").content.decode()
    for fmt in FORMATS:
        assert command("catalog", "--format", fmt, "--framework", "deepspeed") == client.get(
            f"/catalog.{fmt}", {"framework": "deepspeed"}).content.decode()
    assert client.get("/catalog.csv", {"framework": "cobol"}).status_code == 400
    assert client.get("/catalog.xlsx").status_code == 404


# --- Markdown, as a renderer reads it ---

class _RenderedTable(HTMLParser):
    """The tags of rendered HTML, and the text of each table cell (row by row)."""

    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.cell = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def rendered(markdown):
    """Markdown as markdown-it renders it with raw HTML allowed (a README, a notebook): (tags, rows of cells)."""
    parser = _RenderedTable()
    parser.feed(MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown))
    parser.close()
    return parser.tags, parser.rows


NASTY_CELLS = [
    HOSTILE, "<img src=x onerror=alert(1)>", "a | b", "a \\| b", "trailing \\", "one\ntwo", "one\r\ntwo",
    "one\rtwo", "one\u2028two", "one\u2029two\x85three", "&lt;b&gt; stays text", "<https://evil.example/>",
]


def test_markdown_cells_escape_html_and_pipes_and_flatten_line_breaks():
    """Whatever a cell holds, the rendered table has exactly its rows and columns, no tag but the table's
    own, and each cell's text is the value with its line breaks as spaces."""
    frame = pd.DataFrame({"<b>bug</b> | id": NASTY_CELLS, "ok": range(len(NASTY_CELLS))})
    markdown = export(frame, "md")
    tags, rows = rendered(markdown)
    assert set(tags) == {"table", "thead", "tbody", "tr", "th", "td"}, markdown
    assert rows == [["<b>bug</b> | id", "ok"]] + [
        [" ".join(value.splitlines()), str(number)] for number, value in enumerate(NASTY_CELLS)]


def test_the_catalog_download_in_markdown_renders_as_text(client):
    BugFactory(bug_id="TEST-MD", title=HOSTILE + "\r\n| injected | row |")
    tags, rows = rendered(client.get("/catalog.md").content.decode())
    assert "script" not in tags
    header, [bug] = rows[0], rows[1:]
    assert dict(zip(header, bug))["title"] == HOSTILE + " | injected | row |"
