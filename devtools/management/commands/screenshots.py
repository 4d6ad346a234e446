import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from devtools.browser import VIEWPORT, launch
from devtools.pages import example_campaign, example_review, example_run
from runners.worker.local import database_url, log_tail, stop_process

MAX_HEIGHT = 3000  # px; a full-page shot is cut here


def widths(text):
    """``1400,390`` as [1400, 390]: an argparse type."""
    try:
        listed = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of widths: {text!r}") from None
    if not listed or min(listed) < 200:
        raise argparse.ArgumentTypeError(f"widths are at least 200 px: {text!r}")
    return listed


# (file name, path or a function returning one or None when the database has nothing to show, signed in).
# Signed-in pages are taken as the user named by --user, and skipped without it. Extend here.
PAGES = [
    ("landing", "/", False),
    ("catalog", "/catalog/", False),
    ("bug", "/bugs/PT-115607/", False),
    ("run", example_run, False),
    ("results", "/results/", False),
    ("leaderboard", "/leaderboard/", False),
    ("detector", "/detectors/shadow_eager/", False),
    ("methodology", "/methodology/", False),
    ("campaign", example_campaign, False),
    ("submit", "/submit/", True),
    ("review-queue", "/review/", True),
    ("review", example_review, True),
    ("campaign-builder", "/campaigns/new/", True),
]


class Command(BaseCommand):
    help = ("Serve the dashboard on the current database and save PNGs of its main pages, "
            f"{VIEWPORT['width']} px wide, for the README. Reads only (--user adds one session, removed after). "
            "Needs the test extra (playwright) and Chromium.")

    def add_arguments(self, parser):
        parser.add_argument("--out", default=str(settings.BASE_DIR / "docs" / "screenshots"))
        parser.add_argument("--only", help="comma-separated page names (default: all of PAGES)")
        parser.add_argument("--user", help="take the signed-in pages as this existing user (e.g. a maintainer); "
                                           "a session is created for the pass and deleted after it")
        parser.add_argument("--widths", type=widths,
                            help="comma-separated viewport widths in px, each page saved as NAME-WIDTH.png "
                                 f"(default: {VIEWPORT['width']}, saved as NAME.png)")
        parser.add_argument("--base-url", help="take this running server instead of starting one (it must serve "
                                               "the configured database), e.g. an older checkout's")

    def handle(self, *args, out, only, user, widths, base_url, **options):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        wanted = set(only.split(",")) if only else None
        pages = [(name, target() if callable(target) else target, signed_in) for name, target, signed_in in PAGES
                 if wanted is None or name in wanted]
        shots = [(width, f"-{width}") for width in widths] if widths else [(VIEWPORT["width"], "")]
        session = self.session_of(user) if user else None
        try:
            with tempfile.NamedTemporaryFile(suffix=".log") as log:
                if base_url:
                    self.shoot(pages, shots, out, session, base_url.rstrip("/"), log.name)
                else:
                    with dashboard(log.name) as served:
                        self.shoot(pages, shots, out, session, served, log.name)
        finally:
            if session is not None:
                session.delete()

    def shoot(self, pages, shots, out, session, base_url, log_path):
        """Each page at each (width, file name suffix) of ``shots``."""
        from playwright.sync_api import sync_playwright  # a test dependency, like the browser it drives

        with sync_playwright() as playwright:
            browser = launch(playwright)
            for width, suffix in shots:
                viewport = {**VIEWPORT, "width": width}
                anonymous = browser.new_context(viewport=viewport)
                member = browser.new_context(viewport=viewport)
                if session is not None:
                    member.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session.session_key,
                                         "url": base_url}])
                for name, path, signed_in in pages:
                    if path is None:
                        self.stdout.write(self.style.WARNING(f"{name}: nothing in this database to show; skipped"))
                        continue
                    if signed_in and session is None:
                        self.stdout.write(self.style.WARNING(f"{name}: needs --user; skipped"))
                        continue
                    page = (member if signed_in else anonymous).new_page()
                    self.open(page, base_url, path, log_path)
                    wider = page.evaluate("document.documentElement.scrollWidth")
                    if wider > width:  # the shot is cut at the viewport's width: say what it hides
                        self.stdout.write(self.style.WARNING(f"{name}: {wider} px wide in a {width} px viewport"))
                    height = min(page.evaluate("document.documentElement.scrollHeight"), MAX_HEIGHT)
                    target = out / f"{name}{suffix}.png"
                    page.screenshot(path=target, full_page=True,
                                    clip={"x": 0, "y": 0, "width": width, "height": height})
                    self.stdout.write(f"{target} ({path}, {target.stat().st_size // 1024} KiB)")
                    page.close()
                anonymous.close()
                member.close()
            browser.close()

    def open(self, page, base_url, path, log_path):
        """Load ``path`` and wait for its charts; fails on an error status or a redirect (e.g. to sign in)."""
        response = page.goto(base_url + path, wait_until="networkidle")
        if response is None or not response.ok:
            raise CommandError(f"{path} answered {response and response.status}:\n{log_tail(log_path)}")
        if page.url != base_url + path:
            raise CommandError(f"{path} redirected to {page.url}")
        self.wait_for_charts(page)

    def session_of(self, username):
        """A signed-in session for ``username`` without a login (which would write last_login)."""
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r} in this database.")
        session = SessionStore()
        session.update({SESSION_KEY: str(user.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
                        HASH_SESSION_KEY: user.get_session_auth_hash()})
        session.create()
        return session

    def wait_for_charts(self, page):
        """Plotly draws after the load event: wait until each chart of the page (an element with a figure to draw)
        has its SVG; a page that loads Plotly and has no chart (a detector page with one evaluation) is ready."""
        page.wait_for_function("""() => !window.Plotly
            || [...document.querySelectorAll("[data-figure]")].every(plot => plot.querySelector(".main-svg"))""")


@contextmanager
def dashboard(log_path):
    """`manage.py runserver` on a free port and this process's database (under tests: the test database);
    yields its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict)}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"], cwd=settings.BASE_DIR,
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if process.poll() is not None:
                raise CommandError(f"The dashboard exited:\n{log_tail(log_path)}")
            try:
                urllib.request.urlopen(url + "/", timeout=5)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise CommandError(f"The dashboard did not answer on {url}:\n{log_tail(log_path)}")
        yield url
    finally:
        stop_process(process)
