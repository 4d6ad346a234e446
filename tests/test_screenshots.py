"""`manage.py screenshots` serves the dashboard on the current database and saves PNGs of its pages.
Outside tests/browser/: it starts its own Playwright, which cannot run inside the browser tests' one."""
import struct

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_screenshots_of_the_catalog_and_a_bug(tmp_path):
    call_command("load_catalog")
    call_command("screenshots", out=str(tmp_path), only="catalog,bug,run")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bug.png", "catalog.png"]  # no run yet: skipped
    width, height = png_size(tmp_path / "catalog.png")
    assert width == 1400 and 900 <= height <= 3000
