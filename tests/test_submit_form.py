"""The way to the submission form for a newcomer (the link, signing in or up) and the form itself: required fields
marked, and the files of a refused attempt kept so that fixing a field does not mean attaching them again."""
import re

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import RequestFactory
from django.urls import reverse

from accounts.views import locked_out
from bugs.models import Bug, ReproducerVersion
from bugs.submission_views import KEPT_FILES

from .factories import BugFactory, UserFactory
from .helpers import BUG_FORM, FILES, uploads

pytestmark = pytest.mark.django_db

SIGN_UP_FOR_SUBMIT = 'href="/accounts/signup/?next=/submit/"'


def test_anonymous_visitors_see_submit_a_bug_and_are_led_to_sign_up(client):
    nav = re.search(r"<nav>.*?</nav>", client.get("/").content.decode(), re.S).group(0)
    assert '<a href="/submit/">Submit a bug</a>' in nav
    response = client.get("/submit/", follow=True)
    assert response.redirect_chain == [("/accounts/login/?next=/submit/", 302)]
    page = response.content.decode()
    assert "Submitting a bug needs an account" in page and page.count(SIGN_UP_FOR_SUBMIT) == 2


def test_every_sign_in_page_offers_sign_up(client):
    assert 'href="/accounts/signup/"' in client.get("/accounts/login/").content.decode()  # no next: none passed on
    assert "Submitting a bug needs an account" not in client.get("/accounts/login/?next=/results/").content.decode()
    assert 'href="/accounts/signup/?next=/results/"' in client.get("/accounts/login/?next=/results/").content.decode()
    request = RequestFactory().post("/accounts/login/", {"next": "/submit/"})
    request.user = AnonymousUser()
    response = locked_out(request)
    assert response.status_code == 429 and SIGN_UP_FOR_SUBMIT in response.content.decode()


def test_sign_up_returns_to_the_submission_form(client):
    response = client.post("/accounts/signup/?next=/submit/", {
        "username": "newcomer", "password1": "a-long-newcomer-password", "password2": "a-long-newcomer-password"})
    assert response["Location"] == "/submit/"
    assert client.get("/submit/").status_code == 200


def labels(page):
    """{field name: whether its label is marked required}."""
    return {name: "required" in classes for name, classes in
            re.findall(r'<label for="id_(\w+)"(?: class="([^"]*)")?>', page)}


def test_required_fields_are_marked(client):
    client.force_login(UserFactory())
    page = client.get("/submit/").content.decode()
    marked = labels(page)
    assert marked["bug_id"] and marked["title"] and marked["files"] and marked["reproducer_name"]
    assert not marked["fix_url"] and not marked["multi_rank"] and not marked["detection_signal"]
    assert "Fields marked" in page


def test_the_submission_page_links_the_documentation(client):
    client.force_login(UserFactory())
    page = client.get("/submit/").content.decode()
    assert 'href="/docs/reproducer-protocol/"' in page and 'href="/docs/writing-a-reproducer/"' in page
    assert "docs/reproducer-protocol.md" not in page


def test_files_of_a_refused_attempt_are_kept_for_the_next(client):
    user = UserFactory()
    client.force_login(user)
    page = client.post("/submit/", {**BUG_FORM, "title": "", "files": uploads(FILES)}).content.decode()
    assert "This field is required." in page and Bug.objects.count() == 0
    assert "Kept from your last attempt: repro.py, reproducer.yaml." in page
    assert not labels(page)["files"]  # attaching files is now optional

    response = client.post("/submit/", BUG_FORM)  # no files attached this time
    assert response.status_code == 302, response.content.decode()
    version = ReproducerVersion.objects.get()
    assert version.files == FILES and version.submitted_by == user and version.reproducer.bug.bug_id == "GH-4242"
    assert KEPT_FILES not in client.session


def test_new_files_replace_the_kept_ones(client):
    client.force_login(UserFactory())
    client.post("/submit/", {**BUG_FORM, "title": "", "files": uploads({"other.py": "x = 1\n"})})
    assert client.session[KEPT_FILES]["files"] == {"other.py": "x = 1\n"}
    assert client.post("/submit/", {**BUG_FORM, "files": uploads(FILES)}).status_code == 302
    assert ReproducerVersion.objects.get().files == FILES


def test_files_that_could_not_be_read_are_not_kept_and_must_be_attached(client):
    client.force_login(UserFactory())
    client.post("/submit/", {**BUG_FORM, "title": "", "files": uploads(FILES)})
    binary = SimpleUploadedFile("model.bin", b"\xff\xfe\x00")
    page = client.post("/submit/", {**BUG_FORM, "files": [binary]}).content.decode()
    assert "not UTF-8 text" in page and "Kept from your last attempt" not in page
    assert KEPT_FILES not in client.session
    page = client.post("/submit/", BUG_FORM).content.decode()
    assert "Upload the reproducer" in page and Bug.objects.count() == 0


def test_kept_files_are_forgotten_on_a_fresh_page_and_not_offered_to_another_form(client):
    user = UserFactory()
    client.force_login(user)
    BugFactory(bug_id="GH-1", submitted_by=user)
    client.post("/submit/", {**BUG_FORM, "title": "", "files": uploads(FILES)})
    page = client.get(reverse("bugs:resubmit", args=["GH-1"])).content.decode()
    assert "Kept from your last attempt" not in page and KEPT_FILES not in client.session

    client.post("/submit/", {**BUG_FORM, "title": "", "files": uploads(FILES)})
    page = client.post(reverse("bugs:resubmit", args=["GH-1"]), {"reproducer_name": "cpu"}).content.decode()
    assert "Upload the reproducer" in page and ReproducerVersion.objects.count() == 0
