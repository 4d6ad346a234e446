"""Headless Debian Chromium through Playwright, for the browser tests (tests/browser/) and `manage.py screenshots`.

Playwright's own browser download (`playwright install`) is never used; bin/test-tools installs the
distribution's Chromium. SILENTBENCH_CHROMIUM points elsewhere if needed.
"""
import os
from pathlib import Path

CHROMIUM = os.environ.get("SILENTBENCH_CHROMIUM", "/usr/bin/chromium")
# No sandbox (containers, root), no GPU, and nothing that phones home: the network is closed.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 900}


def launch(playwright):
    """A headless Chromium from a started Playwright; fails with the way out when the binary is missing."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: run bin/test-tools as root, or `apt-get install chromium`, "
                           "or set SILENTBENCH_CHROMIUM to a Chromium binary.")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
