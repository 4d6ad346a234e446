"""The methodology (/methodology/ and docs/methodology.md) says what the code does, in the code's own words."""
import inspect
import re
from html.parser import HTMLParser

import pytest
import yaml
from django.conf import settings
from django.core.management import CommandError, call_command
from django.urls import reverse

from core.enums import ReviewState
from evaluation import methodology, metrics, overhead, tables
from evaluation.citation import bibtex_entry
from runners.detectors import all_plugins, campaign_plugins

from .factories import CampaignFactory, EvaluationFactory, ReproducerVersionFactory, RunFactory

pytestmark = pytest.mark.django_db


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts = []

    def handle_data(self, data):
        self.parts.append(data)


def page_text(page, between=""):
    """The page's text, whitespace collapsed; ``between`` goes between the texts of adjacent elements."""
    parser = _Text()
    parser.feed(page)
    return " ".join(between.join(parser.parts).split())


def statements(thing):
    """A docstring's paragraphs and list items as plain text: what a reader must find on the page."""
    found = []
    for paragraph in inspect.getdoc(thing).split("\n\n"):
        found += re.split(r"(?m)^\* ", paragraph)
    return [" ".join(re.sub(r"\*\*|`", "", text).split()) for text in found if text.strip()]


DEFINITIONS = [metrics, metrics.judge_run, metrics.detected_beyond_clean, metrics.wilson_interval,
               tables.false_positive_table, tables.latency_table, tables.cell_text, tables.flakiness_table, overhead]


def test_the_page_holds_the_metric_definitions_the_code_uses(client):
    text = page_text(client.get(reverse("methodology")).content.decode())
    missing = [statement for thing in DEFINITIONS for statement in statements(thing) if statement not in text]
    assert not missing
    assert "Detected, false alarm and beyond the fixed twin" in text and "z = 1.959964" in text


def test_the_page_describes_every_registered_detector(client):
    """Every detector a campaign may name; the sensitivity track's bundle, which none may, is in the track's text."""
    text = page_text(client.get(reverse("methodology")).content.decode())
    plugins = campaign_plugins()
    assert {"plain", "traincheck", "nan_inf"} <= set(plugins) and set(all_plugins()) - set(plugins) == {"bundle"}
    assert "in one process with a probe each (a bundle)" in text
    missing = [name for name, plugin in plugins.items()
               if " ".join(plugin.description.replace("`", "").split()) not in text]
    assert not missing


def test_the_page_renders_the_docstrings_markup_and_escapes_the_rest(client):
    page = client.get(reverse("methodology")).content.decode()
    assert "A buggy run is <strong>detected</strong> when it has an alarm at a step &gt;= its trigger step." in page
    assert "On a clean (<code>fixed</code>) run every alarm is false." in page
    assert "**" not in page_text(page)
    assert methodology.to_html("* <b>x</b> is **y**\n  and z") == (
        "<ul><li>&lt;b&gt;x&lt;/b&gt; is <strong>y</strong> and z</li></ul>")


def test_docs_methodology_is_what_the_code_says():
    call_command("methodology", "--check")  # raises CommandError when docs/methodology.md has drifted


def test_a_drifted_document_is_refused(monkeypatch):
    monkeypatch.setattr("evaluation.management.commands.methodology.markdown_document", lambda: "stale")
    with pytest.raises(CommandError, match="out of date"):
        call_command("methodology", "--check")


def test_how_to_cite_names_the_latest_evaluation(client):
    EvaluationFactory(parameters={"torch": "2.0.0+cpu", "host": "old"})
    latest = EvaluationFactory(parameters={"torch": "2.13.0+cpu", "host": "vm", "seeds": 3, "runs": 492,
                                           "commit": "0123abcd"})
    cite = page_text(re.search(r'<section id="cite">.*?</section>', client.get(reverse("methodology")).content.decode(),
                               re.S).group(0), between=" ")
    assert f"Evaluation #{latest.pk}" in cite and "torch 2.13.0+cpu" in cite and "host vm" in cite
    assert "Commit 0123abcd" in cite and f"{latest.created_at:%Y-%m-%d}" in cite
    assert f"title = {{SilentBench evaluation \\#{latest.pk} (not published)}}" in cite and "2.0.0" not in cite
    assert f"tables digest (MD5) {latest.tables_digest}" in cite and "@software{silentbench," in cite


def test_the_bibtex_download_cites_the_published_evaluation_then_the_benchmark(client):
    published = EvaluationFactory(parameters={"torch": "2.13.0+cpu", "host": "vm", "seeds": 3, "runs": 4,
                                              "commit": "0123abcd"}, published_id="2026-11-28.0a1b2c3d")
    response = client.get(reverse("citation_bib"))
    text = response.content.decode()
    assert response["Content-Type"].startswith("application/x-bibtex")
    assert text.index("@misc{silentbench-2026-11-28-0a1b2c3d,") < text.index("@software{silentbench,")
    assert "title = {SilentBench evaluation 2026-11-28.0a1b2c3d}" in text
    assert f"howpublished = {{http://testserver/results/?evaluation={published.pk}}}" in text
    assert "torch 2.13.0+cpu, host vm; commit 0123abcd" in text
    assert text.count("{") == text.count("}")  # every field closed: a BibTeX reader takes it whole
    assert text.count("author = {{The SilentBench developers}}") == 2  # an organisation, not Mr. developers
    cff = yaml.safe_load((settings.BASE_DIR / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["title"] in text and cff["authors"] and cff["message"]


def test_bibtex_fields_cannot_be_broken_by_what_they_quote():
    entry = bibtex_entry("misc", "k", {"title": "a } b { c_d & 50% #1 \\end"})
    assert entry.count("{") == entry.count("}") and r"c\_d \& 50\% \#1" in entry


def test_how_to_cite_says_what_is_missing(client):
    page = client.get(reverse("methodology")).content.decode()
    assert "No evaluation is stored yet: there is nothing to cite." in page
    EvaluationFactory(parameters={"torch": "2.13.0+cpu"})
    assert "not recorded by this evaluation" in client.get(reverse("methodology")).content.decode()
    assert "@software{silentbench," in page  # the benchmark can be cited before any evaluation


def test_an_evaluation_of_hidden_code_is_not_offered_for_citation(client):
    campaign = CampaignFactory()
    RunFactory(campaign=campaign, reproducer_version=ReproducerVersionFactory(review_state=ReviewState.PENDING))
    hidden = EvaluationFactory(campaign=campaign)
    page = client.get(reverse("methodology")).content.decode()
    assert f"evaluation #{hidden.pk}" not in page and "nothing to cite" in page
