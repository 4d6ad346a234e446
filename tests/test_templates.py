"""The templates: syntax that Django would print on the page instead of reading, and what the pages say of a
value that was never recorded."""
import re
from pathlib import Path

import pytest

from .factories import EvaluationFactory
from .helpers import said

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
ONE_LINE_COMMENT = re.compile(r"\{#.*?#\}")


def unclosed_comments(text):
    """Line numbers of ``text`` where a ``{#`` has no ``#}`` after it on the same line."""
    return [number for number, line in enumerate(text.splitlines(), 1) if "{#" in ONE_LINE_COMMENT.sub("", line)]


def test_the_check_finds_a_comment_left_open_and_passes_closed_ones():
    assert unclosed_comments("{# one line #}\n<p>{# a #} text {# b #}</p>\n{% comment %}a\nb{% endcomment %}") == []
    assert unclosed_comments("<p>\n{# a note that goes on\n   to a second line #}\n{# a #} {# b\n") == [2, 4]


def test_no_template_opens_a_comment_it_does_not_close_on_the_same_line():
    """Django's ``{# #}`` ends on its own line: one spread over lines shows on the page as text, tags and all.
    A note of several lines goes in ``{% comment %}...{% endcomment %}``."""
    found = {str(path.relative_to(TEMPLATES)): lines for path in sorted(TEMPLATES.rglob("*.html"))
             if (lines := unclosed_comments(path.read_text(encoding="utf-8")))}
    assert found == {}


def day(evaluation):
    return f"{evaluation.created_at:%Y-%m-%d}"


def minute(evaluation):
    """Each evaluation's own time: two made a moment apart can straddle a minute (CI saw 21:59 and 22:00)."""
    return f"{evaluation.created_at:%Y-%m-%d %H:%M}"


@pytest.mark.django_db
def test_an_evaluation_names_its_run_and_seed_counts_only_when_it_recorded_them(client):
    """A synthetic history's evaluation records neither: the pages said "? seed(s)" and " runs, seed(s)"."""
    unrecorded = EvaluationFactory(parameters={"synthetic": True})
    catalog, results = client.get("/catalog/").content.decode(), client.get("/results/").content.decode()
    assert f"evaluation #{unrecorded.pk} ({day(unrecorded)}); a bug only GPUs run" in said(catalog, "caught-by-source")
    assert f"evaluation #{unrecorded.pk} ({minute(unrecorded)} UTC; CPU), campaign" in said(results, "selection")
    assert "run count not recorded, seed count not recorded" in said(client.get("/methodology/").content.decode(),
                                                                     "cite")
    recorded = EvaluationFactory(parameters={"runs": 492, "seeds": 3})
    assert f"#{recorded.pk} ({day(recorded)}, 3 seeds)" in said(client.get("/catalog/").content.decode(),
                                                                "caught-by-source")
    assert f"({minute(recorded)} UTC, 492 runs when stored, 3 seeds; CPU)" in said(
        client.get("/results/").content.decode(), "selection")
    assert "492 runs, 3 seeds" in said(client.get("/methodology/").content.decode(), "cite")
    one = EvaluationFactory(parameters={"runs": 1, "seeds": 1})
    assert f"#{one.pk} ({day(one)}, 1 seed)" in said(client.get("/catalog/").content.decode(), "caught-by-source")
