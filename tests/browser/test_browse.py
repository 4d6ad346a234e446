"""What an anonymous visitor does in a real browser: browse and filter the catalog, read a bug and its
highlighted code, read the results and download a paper table, watch a real run's loss chart."""
import re

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.models import Run
from runners.plans import CampaignPlan
from runners.progress import wait_for_campaign
from runners.selectors import runnable_versions

from ..factories import AlarmFactory, BugFactory, CampaignFactory, RunFactory
from ..helpers import latex_rows, matrix_cells
from .helpers import wait_for_plot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE = "<script>alert('pwned')</script><img src=x onerror=alert(1)>"


def finished_runs():
    """DS-1801 detected by param_not_updated; on SO-60335387 it stays silent on buggy and alarms on fixed."""
    guard = do_record_detector("param_not_updated")
    versions = {v.reproducer.bug.bug_id: v for v in runnable_versions(["DS-1801", "SO-60335387"])}

    def run(bug_id, variant, alarm_step=None):
        made = RunFactory(reproducer_version=versions[bug_id], detector=guard, variant=variant, status="succeeded",
                          steps=10, trigger_step=3, manifested=variant == "buggy",
                          step_records=[{"step": s, "rank": 0, "loss": 1.0 / (s + 1), "time": 100.0 + s,
                                         "metrics": {}} for s in range(10)])
        if alarm_step is not None:
            AlarmFactory(run=made, step=alarm_step, rule="no_parameter_updated", message="no update")

    run("DS-1801", "buggy", alarm_step=5)
    run("DS-1801", "fixed")
    run("SO-60335387", "buggy")
    run("SO-60335387", "fixed", alarm_step=4)


def test_browse_the_catalog_a_bug_and_the_results(page, live_site, page_events):
    call_command("load_catalog")
    finished_runs()

    page.goto("/catalog/")
    expect(page.locator("h1")).to_have_text("Catalog of silent training errors")
    expect(page.get_by_role("link", name="PT-115607", exact=True)).to_be_visible()
    page.select_option("select[name=framework]", "deepspeed")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"framework=deepspeed"))
    expect(page.get_by_role("link", name="DS-1801", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="PT-51800", exact=True)).to_have_count(0)
    frameworks = page.locator("table tbody tr td:nth-child(3)").all_inner_texts()
    assert frameworks and set(frameworks) == {"DeepSpeed"}

    page.get_by_role("link", name="DS-1801", exact=True).click()
    expect(page).to_have_url(re.compile(r"/bugs/DS-1801/$"))
    expect(page.locator("h1")).to_contain_text("DS-1801")
    expect(page.get_by_role("heading", name="Root cause")).to_be_visible()
    # Pygments tokens, coloured by the page's stylesheet: a keyword is not in the text colour (the code is folded
    # under the runs and verdicts: open it).
    page.locator("details.code-files summary").first.click()
    keyword = page.locator(".code span.kn, .code span.k").first
    expect(keyword).to_be_visible()
    colours = keyword.evaluate("k => [getComputedStyle(k).color, getComputedStyle(k.closest('pre')).color]")
    assert colours[0] != colours[1]

    page.get_by_role("navigation").get_by_role("link", name="Results").click()
    expect(page.locator("h1")).to_have_text("Detection results")
    shown = matrix_cells(page)
    assert shown[("DS-1801", "param_not_updated")] == ("detected", "1/1")
    assert shown[("SO-60335387", "param_not_updated")] == ("false alarm", "0/1")

    downloads = page.locator("li", has_text="detection:")
    with page.expect_download() as info:
        downloads.get_by_role("link", name="tex", exact=True).click()
    download = info.value
    assert download.suggested_filename.endswith(".tex")
    latex = download.path().read_text(encoding="utf-8")
    assert r"\toprule" in latex and r"\bottomrule" in latex
    exported = {(row["bug"], row["detector"]): (row["outcome"], f"{row['detected runs']}/{row['buggy runs']}")
                for row in latex_rows(latex)}
    assert exported == shown
    assert page_events["dialogs"] == []


def test_hostile_bug_title_is_shown_as_text(page, live_site, page_events):
    BugFactory(bug_id="TEST-EVIL", title=HOSTILE, symptom=HOSTILE)

    page.goto("/catalog/?q=TEST-EVIL")
    row = page.locator("table tbody tr", has_text="TEST-EVIL")
    expect(row.locator("td").nth(1)).to_have_text(HOSTILE)
    page.get_by_role("link", name="TEST-EVIL").click()
    expect(page.locator("h1")).to_contain_text(HOSTILE)
    expect(page.locator("img[src=x]")).to_have_count(0)
    assert page.locator("script", has_text="pwned").count() == 0
    page.wait_for_load_state("load")
    assert page_events["dialogs"] == []


def test_a_real_run_plots_its_loss(page, live_site, celery_worker):
    call_command("load_catalog")
    versions = runnable_versions(["PT-FORUM-84911"])
    campaign = do_create_campaign("browser",
                                  CampaignPlan.build(versions, [do_record_detector("plain")], ["buggy", "fixed"],
                                                     [0]), acting_user=None)

    page.goto(campaign.get_absolute_url())
    expect(page.locator("h1")).to_contain_text("browser")
    progress = wait_for_campaign(campaign, lambda line: None, timeout=240)
    assert progress["done"] == progress["total"] == 2
    page.reload()  # the page refreshes itself every 3 s while live; do not wait for it
    expect(page.locator(".card p").first).to_contain_text("2 of 2 runs finished")

    page.locator("tbody tr", has_text="buggy").get_by_role("link").click()
    expect(page.locator("h1")).to_contain_text("Succeeded")
    wait_for_plot(page, "#loss-chart")
    legend = page.locator("#loss-chart .legendtext").all_text_contents()
    assert {"buggy", "fixed"} <= set(legend)
    assert page.locator("#loss-chart .scatterlayer .trace").count() >= 2


def test_pages_and_plots_work_under_the_content_security_policy(page, live_site, page_events):
    """The policy refuses inline script (the control at the end), and no page needs any: the plots draw,
    the API docs start, and the page fixture fails the test on anything the policy refused."""
    call_command("load_catalog")
    finished_runs()
    run = Run.objects.filter(reproducer_version__reproducer__bug__bug_id="DS-1801", variant="buggy").get()
    campaign = CampaignFactory(name="live")
    RunFactory(campaign=campaign, reproducer_version=run.reproducer_version)  # queued: the page polls
    for url, drawn in [("/results/", "figure.chart .main-svg"), (f"/runs/{run.pk}/", "#loss-chart .main-svg"),
                       (campaign.get_absolute_url(), "progress"), ("/bugs/DS-1801/", ".code span.kn"),
                       ("/api/docs/", ".swagger-ui .info"), ("/admin/login/", "#login-form"),
                       ("/accounts/login/", "main form")]:
        page.goto(url)
        page.wait_for_selector(drawn, state="attached")
        page.wait_for_load_state("load")
    assert page_events["csp"] == []

    with page.expect_console_message(lambda message: "Content Security Policy" in message.text):
        page.evaluate("""() => { const script = document.createElement("script");
                                 script.textContent = "window.injected = true"; document.body.append(script); }""")
    assert page.evaluate("window.injected") is None
    assert page_events["csp"] and "script-src" in page_events["csp"][0]
    page_events["csp"].clear()  # the control's refusal, expected
