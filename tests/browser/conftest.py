"""Fixtures for the browser tests: headless Chromium (Playwright's sync API) against pytest-django's
live server on the test database, and a real Celery worker when a story needs runs executed.

    pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

    def test_story(page, live_site, celery_worker, page_events):
        page.goto("/")                        # relative URLs resolve against live_site
        login(page, live_site, "ada", "pw")   # tests/browser/helpers.py
        ...
        assert page_events["dialogs"] == []

Set up data with the ORM, factories or call_command in the test itself: the live server reads the same
database (transaction=True, so that it sees committed rows). Uncaught JavaScript errors and anything the
Content-Security-Policy blocked on a page fail the test; dialogs (alert, confirm) are dismissed and recorded
in ``page_events["dialogs"]``.
"""
import os

import pytest
from playwright.sync_api import expect, sync_playwright

from benchmark_site.celery import app
from devtools.browser import VIEWPORT, launch
from runners.worker.local import log_tail, start_worker, stop_process

TIMEOUT_MS = 20_000  # generous: the machine may be busy with runs
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="package")
def browser():
    """One headless Chromium for all browser tests; stopped after the last of them.

    Playwright's sync API keeps an event loop running in this thread, so Django's guard against ORM
    calls from async code would refuse the tests' own setup queries: it is lifted while Playwright runs
    (and only then; package scope so the other test modules run without it)."""
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    try:
        chromium = launch(playwright)
        yield chromium
        chromium.close()
    finally:
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def live_site(live_server, transactional_db):
    """The base URL of a live server on the test database, e.g. ``http://localhost:41234``."""
    return live_server.url


@pytest.fixture
def page_events():
    """What the page did besides rendering: ``dialogs`` (messages of alert/confirm/prompt, dismissed),
    ``errors`` (uncaught JavaScript exceptions) and ``csp`` (what the Content-Security-Policy refused, as
    Chromium reports it on the console); any error or refusal fails the test."""
    return {"dialogs": [], "errors": [], "csp": []}


@pytest.fixture
def page(browser, live_site, page_events):
    """A fresh browser context (no cookies) 1400 px wide, downloads enabled, relative URLs on live_site."""
    context = browser.new_context(base_url=live_site, viewport=VIEWPORT, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()

    def on_dialog(dialog):
        page_events["dialogs"].append(dialog.message)
        dialog.dismiss()

    def on_console(message):
        if "Content Security Policy" in message.text:
            page_events["csp"].append(f"{tab.url}: {message.text}")

    tab.on("dialog", on_dialog)
    tab.on("pageerror", lambda error: page_events["errors"].append(str(error)))
    tab.on("console", on_console)
    yield tab
    context.close()
    assert page_events["errors"] == [], "uncaught JavaScript errors"
    assert page_events["csp"] == [], "the Content-Security-Policy refused something"


@pytest.fixture
def celery_worker(live_site, tmp_path):
    """A real `celery worker` process on the configured broker, pointed at the test database; queue a
    campaign (runners.actions.campaigns.do_create_campaign, or through the pages) and it executes the runs."""
    app.control.purge()  # stale messages of an earlier session name runs that do not exist here
    log = tmp_path / "worker.log"
    process = start_worker(log, name="browser")
    yield process
    alive = process.poll() is None
    stop_process(process)
    assert alive, f"the worker died:\n{log_tail(log)}"
