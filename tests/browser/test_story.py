"""The whole story in a real browser, with a real Celery worker executing the runs:

sign up -> submit a reproducer -> it cannot run while unapproved -> a maintainer reads and approves it ->
verification runs -> a campaign is triggered and watched live -> the results appear -> the LaTeX table
downloads and matches the screen.
"""
import re
import time

import pytest
import yaml
from playwright.sync_api import expect

from bugs.models import Bug
from devtools.browser import VIEWPORT
from runners.models import Run

from ..factories import GOOD_REPRODUCER, BugFactory, MaintainerFactory, ReproducerFactory, ReproducerVersionFactory
from ..helpers import ORACLE_AND_FIDELITY, latex_rows, matrix_cells
from .helpers import login, signup

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MANIFEST = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 5,
            "needs": {"cuda": False, "world_size": 1, "time_limit_seconds": 60, "memory_mb": 2048},
            **ORACLE_AND_FIDELITY}


def reload_until(page, text, timeout=240):
    """Reload ``page`` until it shows ``text`` (for pages without live updates)."""
    deadline = time.monotonic() + timeout
    while text not in page.locator("main").inner_text():
        assert time.monotonic() < deadline, f"{text!r} did not appear on {page.url}"
        time.sleep(2)
        page.reload()


def test_from_sign_up_to_a_paper_table(page, browser, live_site, celery_worker, page_events, tmp_path):
    (tmp_path / "repro.py").write_text(GOOD_REPRODUCER)
    (tmp_path / "reproducer.yaml").write_text(yaml.safe_dump(MANIFEST))
    (tmp_path / "broken.py").write_text("def oops(:\n")
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-OTHER")))  # approved

    # A practitioner signs up and submits; the first attempt is refused with the exact reasons.
    signup(page, live_site, "ada", "a-long-story-password")
    page.get_by_role("navigation").get_by_role("link", name="Submit a bug").click()
    page.fill("input[name=bug_id]", "GH-777")
    page.fill("input[name=title]", "Gradient accumulation silently drops the last micro-batch")
    page.select_option("select[name=framework]", "pytorch")
    page.select_option("select[name=fault_location]", "user")
    page.fill("textarea[name=root_cause]", "The accumulation counter is reset one step early.")
    page.fill("textarea[name=symptom]", "Loss curves look normal; the effective batch is smaller.")
    page.select_option("select[name=reproduction]", "injected")
    page.set_input_files("input[name=files]", [tmp_path / "broken.py", tmp_path / "reproducer.yaml"])
    page.get_by_role("button", name="Submit for review").click()
    errors = page.locator(".errors")
    expect(errors).to_contain_text("broken.py, line 1")
    expect(errors).to_contain_text("entrypoint 'repro.py' is not among the files")
    assert not Bug.objects.filter(bug_id="GH-777").exists()
    page.set_input_files("input[name=files]", [tmp_path / "repro.py", tmp_path / "reproducer.yaml"])
    page.get_by_role("button", name="Submit for review").click()
    expect(page).to_have_url(re.compile(r"/submissions/mine/$"))
    expect(page.locator("#submissions")).to_contain_text("Waiting for review")

    # Unapproved, it cannot run: the contributor may not trigger runs, and a maintainer cannot pick it.
    response = page.goto("/campaigns/new/")
    assert response.status == 403
    maintainer = MaintainerFactory(username="mona")
    mona = browser.new_context(base_url=live_site, viewport=VIEWPORT, accept_downloads=True).new_page()
    mona.on("dialog", lambda dialog: (page_events["dialogs"].append(dialog.message), dialog.dismiss()))
    mona.on("pageerror", lambda error: page_events["errors"].append(str(error)))
    login(mona, live_site, maintainer.username, "a-long-test-password")
    mona.goto("/campaigns/new/")
    expect(mona.locator("h1")).to_have_text("New campaign")
    expect(mona.locator("input[name=bugs][value=TEST-OTHER]")).to_have_count(1)
    expect(mona.locator("input[name=bugs][value=GH-777]")).to_have_count(0)
    assert Run.objects.count() == 0

    # The maintainer reads the highlighted code and approves it; verification starts.
    mona.get_by_role("navigation").get_by_role("link", name="Review", exact=True).click()
    mona.get_by_role("link", name="Read and review").click()
    expect(mona.locator("h1")).to_contain_text("GH-777")
    first_version = re.compile("no version of this reproducer was approved before")
    expect(mona.get_by_role("heading", name=first_version)).to_be_visible()
    expect(mona.locator(".code").first).to_contain_text("SILENTBENCH_REPORT")
    mona.get_by_role("button", name="Approve and verify").click()
    expect(mona.locator("ul.messages")).to_contain_text("approved; its verification runs are queued")

    # The submitter sees the review and, once the worker has run buggy and fixed on 3 seeds, the verdict.
    page.goto("/submissions/mine/")
    reload_until(page, "Verified")
    expect(page.locator("#submissions")).to_contain_text("Approved")

    # The maintainer builds a campaign, sees its size before confirming, and watches it live.
    mona.goto("/campaigns/new/")
    mona.fill("input[name=name]", "GH-777 under two detectors")
    mona.check("input[name=bugs][value=GH-777]")
    mona.check("input[name=detectors][value=plain]")
    mona.check("input[name=detectors][value=nan_inf]")
    mona.fill("input[name=seeds]", "0-1")
    mona.get_by_role("button", name="Preview run count and time").click()
    expect(mona.locator("#campaign-preview h2")).to_contain_text("8 runs")
    mona.get_by_role("button", name="Queue 8 runs").click()
    expect(mona).to_have_url(re.compile(r"/campaigns/\d+/$"))
    expect(mona.locator("#campaign-progress")).to_contain_text("8 of 8 runs finished", timeout=240_000)
    expect(mona.locator("#campaign-progress")).to_contain_text("8 succeeded")

    # The results of the campaign, and the paper table that matches them.
    mona.get_by_role("link", name="Results of this campaign").click()
    shown = matrix_cells(mona)
    assert set(shown) == {("GH-777", "plain"), ("GH-777", "nan_inf")}
    assert all(detected.endswith("/2") for _, detected in shown.values())
    with mona.expect_download() as info:
        mona.locator("li", has_text="detection:").get_by_role("link", name="tex", exact=True).click()
    latex = open(info.value.path(), encoding="utf-8").read()
    exported = {(row["bug"], row["detector"]): (row["outcome"], f"{row['detected runs']}/{row['buggy runs']}")
                for row in latex_rows(latex)}
    assert exported == shown
    mona.context.close()
    assert page_events["dialogs"] == [] and page_events["errors"] == []
