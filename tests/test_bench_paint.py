"""`manage.py bench_paint`: the table it prints from given timings, and one real pass in Chromium over gunicorn."""
import re

import pytest
from django.core.management import call_command

from devtools.pages import first_visit_pages
from devtools.paint import PageLoads, median_max, paint_table
from tests.factories import RunFactory


def load(first_paint, fcp=None, dcl=100.0, onload=120.0, size=2048, requests=3, first_byte=20.0):
    return {"first_byte": first_byte, "first_paint": first_paint, "first_contentful_paint": fcp,
            "dom_content_loaded": dcl, "load": onload, "bytes": size, "requests": requests}


def test_median_and_max_ignore_missing_timings():
    assert median_max([300.4, 100.0, 900.6, None]) == "300 / 901"
    assert median_max([None, None]) == "-"


def test_paint_table_gives_each_timing_its_median_and_max_and_names_pages_not_served():
    measured = [
        PageLoads("results", "/results/", [load(500, 510, size=1024 * 1500, requests=7),
                                           load(700, 720, size=1024 * 1600, requests=7),
                                           load(1200, 1250, size=1024 * 1700, requests=7)]),
        PageLoads("leaderboard", "/leaderboard/", status=404),
    ]
    header, rule, results, leaderboard = paint_table(measured)
    assert header.split(" | ")[3:6] == ["first byte ms", "first paint ms", "first contentful paint ms"]
    assert header.count("|") == rule.count("|") == results.count("|") == leaderboard.count("|")
    assert results == ("| results | `/results/` | 3 | 20 / 20 | 700 / 1200 | 720 / 1250 | 100 / 100 | 120 / 120 | "
                       "1,600 | 7 |")
    assert leaderboard.startswith("| leaderboard | `/leaderboard/` | 0 | answered 404 |")


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_bench_paint_measures_every_page_in_chromium(capsys):
    """On the empty test database (no run to show): five pages, each load painted and counted."""
    call_command("bench_paint", repeat=1, warmup=0, gunicorn_workers=1)
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\| [^|]+ \| `", line)]
    assert [row.split(" | ")[1] for row in rows] == ["`/`", "`/catalog/`", "`/leaderboard/`", "`/results/`",
                                                     "`/methodology/`"]
    for row in rows:
        loads, first_byte, first_paint, fcp, dcl, onload, kib, requests = row.strip("| ").split(" | ")[2:]
        assert loads == "1" and all(re.fullmatch(r"\d+ / \d+", value) for value in (first_paint, fcp, dcl, onload))
        assert int(kib.replace(",", "")) > 0 and int(requests) >= 2  # the page and its style sheet at least


@pytest.mark.django_db
def test_bench_paint_adds_the_busiest_bug_and_detector_pages_once_something_has_run():
    """The bug and detector pages measured are those with the most runs: the heaviest to render."""
    quiet, busy = RunFactory(), RunFactory()
    RunFactory.create_batch(2, reproducer_version=busy.reproducer_version, detector=busy.detector)
    listed = dict(first_visit_pages())
    bug_id = busy.reproducer_version.reproducer.bug.bug_id
    assert listed[f"bug page ({bug_id})"] == f"/bugs/{bug_id}/"
    assert listed[f"detector page ({busy.detector.name})"] == f"/detectors/{busy.detector.name}/"
    assert quiet.reproducer_version.reproducer.bug.bug_id not in " ".join(listed)
