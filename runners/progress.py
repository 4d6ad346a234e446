"""Watch a campaign from a terminal until its runs finish."""
import time

from django.core.management.base import CommandError
from django.db.models import Max

from .detector_versions.registry import plugin_for
from .models import Campaign, Detector


def bar(progress, width=30):
    filled = round(width * progress["percent"] / 100)
    counts = ", ".join(f"{n} {status}" for status, n in progress["counts"].items() if n)
    return f"[{'#' * filled}{'.' * (width - filled)}] {progress['done']}/{progress['total']} runs ({counts})"


class CampaignStalled(CommandError):
    """A CommandError, so that the management commands that wait report it cleanly."""


def stall_limit(campaign):
    """No run can stay running longer than its allowance (its time limit under its detector, fit
    included): twice the longest one, plus start-up slack."""
    longest_by_detector = campaign.runs.values_list("detector").annotate(
        longest=Max("reproducer_version__time_limit_seconds"))
    detectors = Detector.objects.select_related("code").in_bulk([pk for pk, _ in longest_by_detector])
    allowances = [plugin_for(detectors[pk]).run_allowance(longest) for pk, longest in longest_by_detector]
    return 2 * max(allowances, default=60) + 120


def wait_for_campaign(campaign, write, timeout=None, interval=1.0, watchdog=None):
    """Print a progress line whenever it changes; return the final progress (or on timeout).

    Raises CampaignStalled when nothing has changed for longer than any run could take (no worker
    is consuming the queue, or the worker cannot reach the database). ``watchdog()`` is called at
    every poll and may raise to stop waiting.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    stalled_after = stall_limit(campaign)
    last, last_change = None, time.monotonic()
    while True:
        progress = Campaign.objects.get(pk=campaign.pk).progress()
        line = bar(progress)
        if line != last:
            write(line)
            last, last_change = line, time.monotonic()
        if progress["done"] >= progress["total"] or (deadline and time.monotonic() > deadline):
            return progress
        if time.monotonic() - last_change > stalled_after:
            raise CampaignStalled(f"campaign #{campaign.pk}: no run changed state for {stalled_after} s; is a "
                                  f"worker consuming the queue and able to reach the database?")
        if watchdog:
            watchdog()
        time.sleep(interval)
