"""Watch a campaign from a terminal until its runs finish."""
import time

from .models import Campaign


def bar(progress, width=30):
    filled = round(width * progress["percent"] / 100)
    counts = ", ".join(f"{n} {status}" for status, n in progress["counts"].items() if n)
    return f"[{'#' * filled}{'.' * (width - filled)}] {progress['done']}/{progress['total']} runs ({counts})"


def wait_for_campaign(campaign, write, timeout=None, interval=1.0, watchdog=None):
    """Print a progress line whenever it changes; return the final progress (or on timeout).
    ``watchdog()`` is called at every poll and may raise to stop waiting."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        progress = Campaign.objects.get(pk=campaign.pk).progress()
        line = bar(progress)
        if line != last:
            write(line)
            last = line
        if progress["done"] >= progress["total"] or (deadline and time.monotonic() > deadline):
            return progress
        if watchdog:
            watchdog()
        time.sleep(interval)
