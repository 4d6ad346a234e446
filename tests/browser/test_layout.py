"""The pages at a phone's width and at a desktop's, and a newcomer's way in, in a real browser.

At 390 px nothing makes a page scroll sideways (a table shows each row as "heading: value" lines); at 1400 px no
box of a page scrolls by itself to hide part of its content (code, the builder's bug list, the tables) and no table
is wider than the page's column."""
import re

import pytest
import yaml
from django.core.management import call_command
from playwright.sync_api import expect

from bugs.models import ReproducerVersion
from runners.detectors import all_plugins
from runners.models import Campaign

from ..factories import (
    GOOD_REPRODUCER,
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    DetectorFactory,
    MaintainerFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
)
from ..helpers import BUG_FORM, SUBMISSION_MANIFEST, make_runs
from .helpers import login, wait_for_plot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1400, "height": 900}

# Elements that scroll by themselves and are taller or wider than they show; a list box of a multiple choice
# (<select multiple>) is one by nature, and what is moved off the screen on purpose is not content.
HIDING_BOXES = """() => [...document.querySelectorAll("body *")].filter(element => {
    const style = getComputedStyle(element), box = element.getBoundingClientRect();
    return element.tagName !== "SELECT" && box.right > 0 && box.width > 1
        && /auto|scroll|hidden/.test(style.overflowX + style.overflowY)
        && (element.scrollWidth > element.clientWidth + 1 || element.scrollHeight > element.clientHeight + 1);
}).map(element => `${element.tagName}.${element.className}: ${element.scrollWidth}x${element.scrollHeight} shown in `
                   + `${element.clientWidth}x${element.clientHeight}`)"""
PAGE_WIDTH = "() => [document.documentElement.scrollWidth, document.body.scrollWidth]"
# Tables whose right edge passes the right edge of main's content (the catalog's was 1481 px in a 1400 px window).
WIDER_THAN_MAIN = """() => { const main = document.querySelector("main"), box = main.getBoundingClientRect();
    const right = box.right - parseFloat(getComputedStyle(main).paddingRight);
    return [...main.querySelectorAll("table")].filter(table => table.getBoundingClientRect().right > right + 1)
        .map(table => `table#${table.id}: ${Math.round(table.getBoundingClientRect().right - right)} px too wide`); }"""
# How many lines each key of a record table (a detector's config and summary) takes.
KEY_LINES = """() => [...document.querySelectorAll("table.record th")].map(th => {
    const range = document.createRange(); range.selectNodeContents(th);
    return [th.textContent, new Set([...range.getClientRects()].map(rect => Math.round(rect.top))).size]; })"""


def pages():
    call_command("load_catalog")
    campaign, other = CampaignFactory(name="first"), CampaignFactory(name="second")
    make_runs(campaign=campaign)
    run = RunFactory(detector=DetectorFactory(name="traincheck"), status="succeeded",
                     detector_summary={"rules_deployed": 300, "rules_failed": 2})
    return {
        "landing": "/", "catalog": "/catalog/", "bug": "/bugs/DS-1801/", "results": f"/results/?campaign={campaign.pk}",
        "run": run.get_absolute_url(),
        "leaderboard": "/leaderboard/", "submit": "/submit/",
        "compare": f"/results/compare/?a=campaign:{campaign.pk}&b=campaign:{other.pk}",
        "builder": "/campaigns/new/", "docs": "/docs/detectors/",
    }


def test_pages_fit_a_phone_and_hide_nothing_on_a_desktop(page, live_site):
    urls = pages()
    maintainer = MaintainerFactory()
    login(page, live_site, maintainer.username, "a-long-test-password")
    for width, viewport in (("390 px", PHONE), ("1400 px", DESKTOP)):
        page.set_viewport_size(viewport)
        for name, url in urls.items():
            page.goto(url)
            page.wait_for_load_state("load")
            if name == "results":
                page.wait_for_selector("figure.chart .main-svg", state="attached")  # the plots take their width
            if viewport is PHONE:
                assert page.evaluate(PAGE_WIDTH) == [390, 390], f"{name} scrolls sideways at {width}"
            else:
                assert page.evaluate(HIDING_BOXES) == [], f"{name} hides content in a scroll box at {width}"
                assert page.evaluate(WIDER_THAN_MAIN) == [], f"{name} has a table too wide at {width}"
            if name == "run":  # a key is one word on one line; its value wraps instead
                assert {lines for _, lines in page.evaluate(KEY_LINES)} == {1}, f"{name}: keys broken at {width}"
    # At the phone's width a table's cells carry their column's heading.
    page.set_viewport_size(PHONE)
    page.goto(urls["catalog"])
    cell = page.locator("table tbody tr", has_text="DS-1801").locator("td").nth(2)
    expect(cell).to_have_attribute("data-label", "Framework")
    assert "Framework" in cell.evaluate("td => getComputedStyle(td, '::before').content")
    expect(cell).to_have_text("DeepSpeed")  # the heading is the style sheet's, not the cell's text


# The margin, in px, of each heading or paragraph that opens (its top margin) or closes (bottom) a card: inside a
# card's padding it only adds a blank band.
CARD_EDGE_MARGINS = """() => [...document.querySelectorAll("main .card")].flatMap(card => [
        [card.firstElementChild, "marginTop"], [card.lastElementChild, "marginBottom"]]
    .filter(([element]) => element && element.matches("h1, h2, h3, p"))
    .map(([element, side]) => [`${side} of ${element.textContent.trim().slice(0, 30)}`,
                               parseFloat(getComputedStyle(element)[side])]))"""
# Each table caption's width and its table's, in px.
CAPTION_WIDTHS = """() => [...document.querySelectorAll("main table > caption")].map(caption =>
    [caption.textContent, Math.round(caption.getBoundingClientRect().width),
     Math.round(caption.parentElement.getBoundingClientRect().width)])"""


def test_cards_open_and_close_at_their_padding_and_captions_span_a_phone(page):
    """In the screenshots of docs/screenshots/, the run page's Oracle and Environment cards and the catalog's
    leaderboard box opened with a blank band (their heading's own 1.8rem margin on top of the card's padding), a
    card ending in a paragraph closed with one, and at 390 px the leaderboard's caption was squeezed into a column
    one word wide, seven lines tall."""
    call_command("load_catalog")
    run = make_runs(campaign=CampaignFactory())["detected"]
    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        for url in ("/", "/catalog/", run.get_absolute_url(), "/leaderboard/"):
            page.goto(url)
            margins = page.evaluate(CARD_EDGE_MARGINS)
            assert margins and all(margin == 0 for _, margin in margins), f"{url} at {viewport['width']}: {margins}"
    page.goto("/leaderboard/")
    captions = page.evaluate(CAPTION_WIDTHS)
    assert captions and all(width == table for _, width, table in captions), captions
    assert page.evaluate(PAGE_WIDTH) == [390, 390]


# The heatmap's tick labels and colour bar, as drawn: [text, left, top, right, bottom] in page pixels.
HEATMAP_PARTS = """() => { const box = element => { const r = element.getBoundingClientRect();
        return [element.textContent, r.left, r.top, r.right, r.bottom]; };
    const chart = document.querySelector("#detection-heatmap .js-plotly-plot");  // its layers of SVG
    return {figure: box(chart.querySelector(".main-svg")), x: [...chart.querySelectorAll(".xtick text")].map(box),
            y: [...chart.querySelectorAll(".ytick text")].map(box), bar: box(chart.querySelector(".colorbar")),
            ticks: [...chart.querySelectorAll(".colorbar text")].map(box),
            legend: [...chart.querySelectorAll(".legend .traces")].map(box)}; }"""


def overlaps(first, second):
    """Whether two boxes [text, left, top, right, bottom] share more than a pixel."""
    return (min(first[3], second[3]) - max(first[1], second[1]) > 1
            and min(first[4], second[4]) - max(first[2], second[2]) > 1)


def test_the_heatmap_names_every_row_and_detector_on_a_phone(page):
    """Long bug IDs beside every registered detector: at 390 px the labels were cut on the left, 4 of the 11 names
    showed, overlapping, and the colour bar's "100%" was clipped; with 21 detectors the upright names overlapped
    again. Now a plot with more columns than the screen holds scrolls sideways inside its figure, never the page."""
    detectors = [DetectorFactory(name=name) for name in sorted(all_plugins())]
    bug_ids = ["BLOOM-176B-DIVERGENCE", "VERDICT-ALLGATHER-AS-ALLREDUCE", "VERDICT-INCONSISTENT-SCALING"]
    for bug_id in bug_ids:
        version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id=bug_id)))
        for detector in detectors[:-1] if bug_id == bug_ids[0] else detectors:  # one cell never run: "no data"
            RunFactory(reproducer_version=version, detector=detector, status="succeeded", steps=10, trigger_step=3,
                       manifested=True)
        if bug_id == bug_ids[1]:  # a false alarm on the fixed variant, nothing detected: the legend's other swatch
            fixed = RunFactory(reproducer_version=version, detector=detectors[0], status="succeeded", steps=10,
                               variant="fixed", manifested=False)
            AlarmFactory(run=fixed, step=1, rule="noise")
    page.set_viewport_size(PHONE)
    page.goto("/results/")
    wait_for_plot(page, "#detection-heatmap")
    parts = page.evaluate(HEATMAP_PARTS)
    assert len(parts["legend"]) == 2 and parts["ticks"]
    for swatch in parts["legend"]:  # "false alarms, nothing detected" ran into the colour bar's "0%"
        assert not any(overlaps(swatch, tick) for tick in parts["ticks"]), (swatch, parts["ticks"])
    _, left, top, right, bottom = parts["figure"]
    assert [text for text, *_ in parts["x"]] == [detector.name for detector in detectors]
    # a label's lines joined (a line break before a space drops the space)
    assert [text.replace(" ", "") for text, *_ in parts["y"]] == [f"{bug_id}(cpu)" for bug_id in bug_ids]
    for text, *edges in parts["x"] + parts["y"] + [parts["bar"]] + parts["legend"]:
        assert left <= edges[0] and top <= edges[1] and edges[2] <= right and edges[3] <= bottom, text
    for (name, *first), (_, *second) in zip(parts["x"], parts["x"][1:]):
        assert first[2] <= second[0] + 0.5, f"{name} overlaps the next detector's name"
    assert page.evaluate(PAGE_WIDTH) == [390, 390]
    assert right - left > 390 and page.evaluate(
        "getComputedStyle(document.querySelector('#detection-heatmap').closest('.chart-scrolls')).overflowX") == "auto"


def fill(page, fields):
    """Type or choose each form field's value."""
    for name, value in fields.items():
        field = page.locator(f"[name={name}]")
        if field.evaluate("field => field.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)


def test_a_newcomer_goes_from_submit_a_bug_to_a_submission(page, live_site, tmp_path):
    (tmp_path / "repro.py").write_text(GOOD_REPRODUCER)
    (tmp_path / "reproducer.yaml").write_text(yaml.safe_dump(SUBMISSION_MANIFEST))
    page.set_viewport_size(PHONE)
    page.goto("/")
    page.get_by_role("navigation").get_by_role("link", name="Submit a bug").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/submit/$"))
    page.get_by_role("link", name="create an account").click()
    page.fill("input[name=username]", "newcomer")
    page.fill("input[name=password1]", "a-long-newcomer-password")
    page.fill("input[name=password2]", "a-long-newcomer-password")
    page.click("main form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/submit/$"))
    expect(page.locator("label.required[for=id_title]")).to_have_count(1)

    # A field left out: the page says so and keeps the files, so that they need not be attached again.
    fill(page, {name: value for name, value in BUG_FORM.items() if name != "title"})
    page.set_input_files("input[name=files]", [tmp_path / "repro.py", tmp_path / "reproducer.yaml"])
    page.get_by_role("button", name="Submit for review").click()
    expect(page.locator(".field.invalid")).to_contain_text("Title")
    expect(page.locator(".kept-files")).to_contain_text("repro.py, reproducer.yaml")
    assert page.evaluate(PAGE_WIDTH) == [390, 390]
    fill(page, {"title": BUG_FORM["title"]})
    page.get_by_role("button", name="Submit for review").click()
    expect(page).to_have_url(re.compile(r"/submissions/mine/$"))
    version = ReproducerVersion.objects.get(reproducer__bug__bug_id=BUG_FORM["bug_id"])
    assert set(version.files) == {"repro.py", "reproducer.yaml"} and not Campaign.objects.exists()

    # The documentation the form names is a page of the site.
    page.goto("/submit/")
    page.get_by_role("link", name="the reproducer protocol").first.click()
    expect(page).to_have_url(re.compile(r"/docs/reproducer-protocol/$"))
    expect(page.locator("article h1")).to_contain_text("reproducer protocol")
    assert page.evaluate(PAGE_WIDTH) == [390, 390]


# Each line number of the code on a page: its text, how many lines it takes, and whether it is shown.
LINE_NUMBERS = """() => [...document.querySelectorAll(".code .linenos")].map(number =>
    [number.textContent.trim(), number.getClientRects().length])"""
PAGE_HEIGHT = "() => document.documentElement.scrollHeight"
# The bound a bug page stays under with its code folded (DS-1801's was 286 lines of code before its runs).
BUG_PAGE_HEIGHT = {"390 px": 9000, "1400 px": 5000}


def test_code_is_folded_and_its_line_numbers_count_its_lines_at_both_widths(page):
    """The YAML's numbers were one line off and "10" broke into "1" over "0" on a phone: the numbers were a column
    of their own, out of step with wrapped code lines. Now each number is in its line, whole."""
    call_command("load_catalog")
    version = ReproducerVersion.objects.filter(reproducer__bug__bug_id="DS-1801").order_by("-created_at").first()
    lines = [len(text.splitlines()) for _, text in sorted(version.files.items())]
    for width, viewport in (("390 px", PHONE), ("1400 px", DESKTOP)):
        page.set_viewport_size(viewport)
        page.goto("/bugs/DS-1801/")
        assert page.evaluate(PAGE_HEIGHT) < BUG_PAGE_HEIGHT[width], f"the bug page is too long at {width}"
        expect(page.locator("details.code-files").first).not_to_have_attribute("open", "")
        page.locator("details.code-files summary").first.click()
        numbers = page.evaluate(LINE_NUMBERS)
        assert all(rects == 1 for _, rects in numbers), f"a line number broke across lines at {width}"
        files = []
        for text, _ in numbers:  # each file's numbers run from 1 to its number of lines
            if int(text) == 1:
                files.append(0)
            files[-1] += 1
            assert int(text) == files[-1]
        assert sorted(files) == sorted(lines), (files, lines)


# The navigation's rows at a phone's width: the distinct tops of its links.
NAV_ROWS = """() => new Set([...document.querySelectorAll("header.top nav a")].map(
    link => Math.round(link.getBoundingClientRect().top))).size"""


def test_the_navigation_takes_one_row_on_a_phone(page):
    page.set_viewport_size(PHONE)
    page.goto("/")
    assert page.evaluate(NAV_ROWS) == 1  # it took four
    assert page.evaluate(PAGE_WIDTH) == [390, 390]  # its row scrolls by itself, never the page
    page.get_by_role("navigation").get_by_role("link", name="Methodology").click()
    expect(page).to_have_url(re.compile(r"/methodology/$"))
