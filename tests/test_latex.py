"""Every LaTeX export, compiled by a real TeX engine (pdflatex, from Debian's texlive packages that bin/test-tools
installs) inside a document that loads exactly the packages the export's first line names, on a page as wide as a
two-column paper's full width: it must compile without an error or a table wider than the page, and the PDF must show
its caption and its cells. A missing engine fails the tests, as a missing Chromium fails the browser tests."""
import io
import re
import shutil
import subprocess

import pytest
from django.core.management import CommandError, call_command

from bugs.models import Bug, BugStatus
from evaluation.actions import run_tables
from evaluation.exports import ABOUT, CAPTIONS, EXPORT_TABLES
from runners.models import Run

from .factories import BugFactory, CampaignFactory, EnvironmentFactory, EvaluationFactory
from .helpers import HOSTILE, make_runs

pytestmark = pytest.mark.django_db

TEX_PACKAGES = "texlive-latex-base texlive-latex-recommended poppler-utils"  # pdflatex, booktabs.sty, pdftotext
OVERHEAD = [
    {"detector": "param_not_updated", "pairs": 5, "pairs_planned": 5, "median_step_time_ratio": 1.0165,
     "median_end_to_end_ratio": 0.984, "median_plain_step_ms": 5.8467, "median_step_ms": 6.091,
     "median_check_seconds": 0.0, "fit_seconds": None},
]
# A page as wide as the text of a two-column paper (ACM's and IEEE's are about 7 in): a table* must fit it.
DOCUMENT = r"""\documentclass{article}
\usepackage[paperwidth=8.5in,paperheight=11in,textwidth=7in,textheight=9in]{geometry}
\usepackage{%s}
\begin{document}
\input{table}
\end{document}
"""
LATEX = r"\input{/etc/passwd} & 100% $x$ #1 <b> | ~^_{}"


def tex_tool(name):
    """The path of a TeX or poppler tool; a failure that names the package when it is missing (never a skip)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: run bin/test-tools as root, or `apt-get install {TEX_PACKAGES}`.")
    return path


def compiled(latex, directory):
    """(text of the PDF, its page count) of a LaTeX export compiled in a document of its own."""
    packages = re.match(r"% SilentBench [\w-]+\. Preamble: \\usepackage\{([\w, ]+)\}\n", latex)
    assert packages, latex.splitlines()[0]
    (directory / "table.tex").write_text(latex, encoding="utf-8")
    (directory / "paper.tex").write_text(DOCUMENT % packages.group(1), encoding="utf-8")
    for _ in range(2):  # a longtable settles its column widths in the second run
        result = subprocess.run([tex_tool("pdflatex"), "-interaction=nonstopmode", "-halt-on-error",
                                 "-no-shell-escape", "paper.tex"], cwd=directory, capture_output=True, text=True,
                                timeout=120)
    log = (directory / "paper.log").read_text(encoding="latin-1")
    assert result.returncode == 0, log[-3000:]
    assert not re.search(r"^! ", log, re.MULTILINE), log[-3000:]
    for problem in ("Overfull \\hbox", "Float too large", "Rerun"):  # wider or taller than the page, unsettled
        assert problem not in log, log[-3000:]
    info = subprocess.run([tex_tool("pdfinfo"), "paper.pdf"], cwd=directory, capture_output=True, text=True,
                          check=True).stdout
    text = subprocess.run([tex_tool("pdftotext"), "-layout", "paper.pdf", "-"], cwd=directory, capture_output=True,
                          text=True, check=True).stdout
    # OT1 draws an underscore as a rule, which pdftotext reads as a space
    return " ".join(text.replace("_", " ").split()), int(re.search(r"^Pages:\s+(\d+)", info, re.MULTILINE).group(1))


def download(client, name):
    """The LaTeX download of a table (``manage.py export`` prints the same: tests/test_exports.py)."""
    response = client.get("/catalog.tex" if name == "catalog" else f"/results/{name}.tex")
    assert response.status_code == 200, response.content
    return response.content.decode()


@pytest.fixture
def evaluation():
    """A stored evaluation of the two test bugs (make_runs) with an overhead row, run on torch 2.13.0+cpu; TEST-A is
    verified, but one of its fixed runs manifested (a row of the flakiness table)."""
    campaign = CampaignFactory(name="evaluation")
    runs = make_runs(campaign=campaign, environment=EnvironmentFactory(torch="2.13.0+cpu"))
    Bug.objects.filter(bug_id="TEST-A").update(status=BugStatus.VERIFIED)
    Run.objects.filter(pk=runs["plain_fixed"].pk).update(manifested=True)
    return EvaluationFactory(campaign=campaign, tables={**run_tables(campaign.runs.all()), "overhead": OVERHEAD},
                             parameters={"traincheck": "0.2.0"})


@pytest.mark.parametrize("name", ["catalog", *EXPORT_TABLES])
def test_every_latex_export_compiles_and_shows_its_caption_and_cells(name, client, evaluation, tmp_path):
    BugFactory(bug_id="TEST-LONG", title="A title long enough to need a paragraph column: " + "words " * 20)
    latex = download(client, name)
    text, pages = compiled(latex, tmp_path)
    assert pages == 1
    assert f"tab:silentbench-{name}" in latex and r"\caption{" in latex and r"\toprule" in latex
    assert "TEST-A" in text or "param not updated" in text
    what = "The SilentBench catalog" if name == "catalog" else CAPTIONS[name]
    assert f"Table 1: {what}" in text
    if name != "catalog":
        # a short caption naming the evaluation cited, the definitions and the runs in the note under the table
        caption = latex.split(r"\caption{", 1)[1].split(r"\label", 1)[0]
        assert len(caption) < 300 and f"SilentBench evaluation \\#{evaluation.pk} (not published)" in caption
        assert f"tables digest {evaluation.tables_digest[:8]}" in caption
        note = " ".join(text.split("Note.", 1)[1].split())
        assert note.startswith(" ".join(ABOUT[name][:40].split())) or name == "leaderboard"
        assert f"Runs: SilentBench evaluation #{evaluation.pk} of" in note
        assert "seeds 0, 1; torch 2.13.0+cpu, traincheck 0.2.0." in note


def test_the_paper_layout(client, evaluation):
    """Numbers right-aligned with the decimals their column needs, the Wilson interval in one cell, headers wider
    than their cells on two lines, the matrix and the leaderboard as on screen, prose in paragraph columns."""
    false_positives = client.get("/results/false-positives.tex").content.decode()
    assert "param\\_not\\_updated & 2 & 1 & 0.5 & [0.095, 0.905] & 50.0 & -- \\\\" in false_positives
    assert "plain & 1 & 0 & 0.0 & [0.000, 0.793] & 0.0 & -- \\\\" in false_positives
    assert r"\begin{tabular}{l>{\raggedleft\arraybackslash}b{" in false_positives  # "clean runs" on two lines
    assert "fp_ci" not in false_positives and "fp_ci_low" in client.get("/results/false-positives.csv").content.decode()
    matrix = client.get("/results/matrix.tex").content.decode()
    assert r"\begin{tabular}{llcc}" in matrix and r"\rotatebox{90}{param\_not\_updated}" in matrix
    assert "TEST-A & cpu & 2/2 (1 beyond fixed) & 0/1 \\\\" in matrix and "TEST-B & cpu & 0/1 FA & -- \\\\" in matrix
    assert "TEST-B & cuda & 1/1 (no fixed twin) & -- \\\\" in matrix
    assert [(row["bug"], row["reproducer"], row["plain"]) for row in client.get("/results/matrix.json").json()] == [
        ("TEST-A", "cpu", "0/1"), ("TEST-B", "cpu", None), ("TEST-B", "cuda", None)]
    board = client.get("/results/leaderboard.tex").content.decode()
    # seed 1 of TEST-A and TEST-B's cuda detection have no fixed run to tell them from: no fixed twin, not =fixed
    assert "1 & param\\_not\\_updated & 1/2 & 2/2 & 0/3 & 2/3 & 0.5 & [0.095, 0.905] & -- & 2 & 1.0165 \\\\" in board
    assert "baseline & plain & 0/1 & 0/1 & -- & -- & 0.0 & [0.000, 0.793] & -- & -- & -- \\\\" in board
    # drop-in detectors and the baseline in blocks of their own, each under its label
    drop_in, baseline = (board.index(r"\emph{Drop-in detectors"), board.index(r"\emph{Baseline: plain"))
    assert drop_in < board.index("param\\_not\\_updated &") < baseline < board.index("baseline & plain")
    assert [(row["rank"], row["detector"], row["beyond_fixed"], row["bugs"])
            for row in client.get("/results/leaderboard.json").json()] == [
        (1, "param_not_updated", 1, 2), ("baseline", "plain", 0, 1)]
    BugFactory(bug_id="TEST-CAT", title=HOSTILE)
    catalog = client.get("/catalog.tex").content.decode()
    assert r">{\raggedright\arraybackslash}p{4cm}" in catalog and "https://" not in catalog


def test_latex_special_characters_are_typeset_literally(client, tmp_path):
    BugFactory(bug_id="TEST-LATEX", title=LATEX + "\nsecond line\u2028third")
    latex = download(client, "catalog")
    assert "\\input{" not in latex and "second line third" in latex
    text, _ = compiled(latex, tmp_path)
    # (pdftotext reads the title's lines among the other columns' cells; OT1 prints ~ and ^ as accents)
    for part in (r"\input{/etc/passwd} & 100%", "$x$ #1 <b> |", "{} second line third"):
        assert part in text


def test_a_long_table_continues_on_the_next_pages(client, tmp_path):
    for number in range(100):
        BugFactory(bug_id=f"TEST-{number:02}")
    latex = download(client, "catalog")
    assert r"\begin{longtable}" in latex and "longtable}" in latex.splitlines()[0]
    text, pages = compiled(latex, tmp_path)
    assert pages == 2 and "TEST-00" in text and "TEST-99" in text and "Table 1 (continued)" in text


def test_an_empty_table_is_a_message_not_a_table(client):
    campaign = CampaignFactory(name="nothing ran")
    for name in EXPORT_TABLES:
        with pytest.raises(CommandError, match="no rows"):
            call_command("export", name, "--format", "tex", "--campaign", str(campaign.pk), stdout=io.StringIO())
        response = client.get(f"/results/{name}.tex", {"campaign": campaign.pk})
        assert response.status_code == 404 and response["Content-Type"].startswith("text/plain")
        assert "no rows" in response.content.decode()
    assert client.get("/results/detection.csv", {"campaign": campaign.pk}).content.decode().startswith("bug,")
    assert client.get("/catalog.tex").status_code == 404


def test_the_leaderboard_takes_no_filter(client, evaluation):
    with pytest.raises(CommandError, match="the leaderboard takes only evaluation or campaign"):
        call_command("export", "leaderboard", "--detector", "plain", stdout=io.StringIO())
    assert client.get("/results/leaderboard.csv", {"detector": "plain"}).status_code == 400
    assert client.get("/results/leaderboard.csv", {"evaluation": evaluation.pk}).status_code == 200
