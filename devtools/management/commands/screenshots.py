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
from django.urls import reverse

from bugs.models import ReproducerVersion, ReviewState
from devtools.browser import VIEWPORT, launch
from evaluation.models import Evaluation
from runners.local_worker import database_url, log_tail, stop_process
from runners.models import Campaign, Run, RunStatus

MAX_HEIGHT = 3000  # px; a full-page shot is cut here


def example_run():
    """A finished buggy run whose detector alarmed, preferably of PT-115607: the loss chart with alarms."""
    runs = Run.objects.filter(status=RunStatus.SUCCEEDED, variant="buggy", alarms__isnull=False).order_by("pk")
    run = runs.filter(reproducer_version__reproducer__bug__bug_id="PT-115607").first() or runs.first()
    return run.get_absolute_url() if run else None


def example_campaign():
    evaluation = Evaluation.objects.first()
    campaign = evaluation.campaign if evaluation else Campaign.objects.order_by("-created_at").first()
    return campaign.get_absolute_url() if campaign else None


def example_review():
    """The review page of the oldest version waiting for a maintainer."""
    version = ReproducerVersion.objects.filter(review_state=ReviewState.PENDING).order_by("created_at").first()
    return reverse("bugs:review", args=[version.pk]) if version else None


# (file name, path or a function returning one or None when the database has nothing to show, signed in).
# Signed-in pages are taken as the user named by --user, and skipped without it. Extend here.
PAGES = [
    ("catalog", "/", False),
    ("bug", "/bugs/PT-115607/", False),
    ("run", example_run, False),
    ("results", "/results/", False),
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

    def handle(self, *args, out, only, user, **options):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        wanted = set(only.split(",")) if only else None
        pages = [(name, target() if callable(target) else target, signed_in) for name, target, signed_in in PAGES
                 if wanted is None or name in wanted]
        session = self.session_of(user) if user else None
        try:
            self.shoot(pages, out, session)
        finally:
            if session is not None:
                session.delete()

    def shoot(self, pages, out, session):
        from playwright.sync_api import sync_playwright  # a test dependency, like the browser it drives

        with tempfile.NamedTemporaryFile(suffix=".log") as log, dashboard(log.name) as base_url:
            with sync_playwright() as playwright:
                browser = launch(playwright)
                anonymous = browser.new_context(viewport=VIEWPORT)
                member = browser.new_context(viewport=VIEWPORT)
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
                    response = page.goto(base_url + path, wait_until="networkidle")
                    if response is None or not response.ok:
                        raise CommandError(f"{path} answered {response and response.status}:\n{log_tail(log.name)}")
                    if page.url != base_url + path:  # e.g. to the sign-in page
                        raise CommandError(f"{path} redirected to {page.url}")
                    self.wait_for_charts(page)
                    height = min(page.evaluate("document.documentElement.scrollHeight"), MAX_HEIGHT)
                    target = out / f"{name}.png"
                    page.screenshot(path=target, full_page=True,
                                    clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height})
                    self.stdout.write(f"{target} ({path}, {target.stat().st_size // 1024} KiB)")
                    page.close()
                browser.close()

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
        """Plotly draws after the load event: on a page that loads it, wait until each chart has its SVG."""
        page.wait_for_function("""() => !window.Plotly || (document.querySelector(".js-plotly-plot") !== null
            && [...document.querySelectorAll(".js-plotly-plot")].every(plot => plot.querySelector(".main-svg")))""")


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
