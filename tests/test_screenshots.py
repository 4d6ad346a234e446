"""`manage.py screenshots` serves the dashboard on the current database and saves PNGs of its pages.
Outside tests/browser/: it starts its own Playwright, which cannot run inside the browser tests' one."""
import struct

import pytest
from django.contrib.sessions.models import Session
from django.core.management import call_command

from core.enums import ReviewState

from .factories import MaintainerFactory, ReproducerVersionFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_screenshots_of_the_catalog_and_a_bug(tmp_path):
    call_command("load_catalog")
    call_command("screenshots", out=str(tmp_path), only="catalog,bug,run,submit")
    # No run yet, no --user: those two are skipped.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bug.png", "catalog.png"]
    width, height = png_size(tmp_path / "catalog.png")
    assert width == 1400 and 900 <= height <= 3000


def test_each_width_has_its_own_file(tmp_path):
    call_command("screenshots", out=str(tmp_path), only="catalog,methodology", widths=[1400, 390])
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "catalog-1400.png", "catalog-390.png", "methodology-1400.png", "methodology-390.png"]
    assert png_size(tmp_path / "catalog-390.png")[0] == 390
    assert png_size(tmp_path / "methodology-1400.png")[0] == 1400


def test_signed_in_pages_leave_no_session_behind(tmp_path):
    maintainer = MaintainerFactory()
    ReproducerVersionFactory(review_state=ReviewState.PENDING)
    call_command("screenshots", out=str(tmp_path), only="review-queue,review", user=maintainer.username)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["review-queue.png", "review.png"]
    assert not Session.objects.exists()
