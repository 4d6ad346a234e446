"""The runs behind a number, as a page (/results/runs/): a selection's succeeded runs narrowed to one detector,
variant, bug and verdict: ``detected`` (buggy runs with an alarm at or after the trigger, in time), ``missed``
(buggy runs without one) or ``false-alarm`` (runs with an alarm that cannot be a detection: before the trigger, or
any on a clean run). Judged as every table judges (evaluation.tables.judged_runs). A count of runs and its list
agree, but for the runs the reader may not see (a held-out bug's), which the aggregate tables count and the list
leaves out (the page says so); a count of bugs links to the runs behind it."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from core.caching import digest
from core.enums import Variant
from runners.models import Run, RunStatus, runs_for_listing
from runners.selectors import outside_sensitivity_track, visible_runs, watched_by

from .leaderboard import selection_query
from .results import Results
from .tables import judged_runs

VERDICTS = {
    "detected": ("detected", lambda row, verdict: row["variant"] == Variant.BUGGY and verdict.detected),
    "missed": ("missed", lambda row, verdict: row["variant"] == Variant.BUGGY and not verdict.detected),
    "false-alarm": ("with a false alarm", lambda row, verdict: verdict.false_alarms > 0),
}
NARROWING = ("detector", "variant", "bug", "verdict")  # the query parameters besides the selection
NAME = re.compile(r"[-\w]+", re.ASCII)  # a detector's name, as its page's address takes it


class InvalidRunList(ValueError):
    """A query that names no variant or verdict this page knows."""


@dataclass
class RunList:
    results: Results  # the selection (a stored evaluation, a campaign, or every run)
    narrowed: dict  # {parameter: value} of NARROWING that the query set

    @cached_property
    def runs(self):
        """The matching runs, for listing, oldest first, as the selection's tables see them (its viewer's runs, so
        that the judged ones' IDs, kept while the selection cannot change, are the same for every reader of them:
        ``Results.cached``)."""
        narrowed, results = self.narrowed, self.results
        campaign = results.evaluation.campaign_id if results.evaluation else results.campaign_id
        runs = visible_runs(results.viewer, Run.objects.filter(status=RunStatus.SUCCEEDED))
        if campaign is not None:
            runs = runs.filter(campaign=campaign)
        else:  # every run, as the live tables count them (runners.selectors.counted_runs)
            runs = outside_sensitivity_track(runs)
        if "detector" in narrowed:
            runs = runs.filter(watched_by([narrowed["detector"]]))
        if "bug" in narrowed:
            runs = runs.filter(reproducer_version__reproducer__bug__bug_id=narrowed["bug"])
        if "verdict" in narrowed or "variant" in narrowed:
            matches = VERDICTS[narrowed["verdict"]][1] if "verdict" in narrowed else (lambda row, verdict: True)
            # judged as the tables judge: a clean pipeline presented as buggy (a scoring campaign's canary) is a
            # clean run, and counts in no table's clean runs
            ids = results.cached(f"run-list:{digest(sorted(narrowed.items()))}", lambda: [
                row["id"] for row, verdict, _ in judged_runs(runs)
                if narrowed.get("variant", row["variant"]) == row["variant"] == row["presented_as"]
                and narrowed.get("detector", row["detector__name"]) == row["detector__name"]  # a bundle's member
                and matches(row, verdict)])
            runs = runs.filter(pk__in=ids)
        return runs_for_listing(runs).order_by("id")

    @property
    def described(self):
        """The runs in words, e.g. "detected buggy runs of nan_inf on PT-115607"."""
        verdict = VERDICTS[self.narrowed["verdict"]][0] if "verdict" in self.narrowed else ""
        variant = {"buggy": "buggy", "fixed": "clean (fixed)"}.get(self.narrowed.get("variant", ""), "")
        words = " ".join(part for part in (verdict if verdict != "with a false alarm" else "", variant, "runs") if part)
        if verdict == "with a false alarm":
            words += " with a false alarm"
        for name, prefix in (("detector", "of"), ("bug", "on")):
            if name in self.narrowed:
                words += f" {prefix} {self.narrowed[name]}"
        return words


def run_list(query, user):
    """The runs ``query`` names, as ``user`` may see them (NotFound for a selection that does not exist,
    InvalidRunList for an unknown variant or verdict); they are read when first asked for."""
    narrowed = {name: query[name] for name in NARROWING if query.get(name)}
    if not NAME.fullmatch(narrowed.get("detector", "plain")):
        raise InvalidRunList("detector is a detector's name (letters, digits, - and _)")
    if ("verdict" in narrowed or "variant" in narrowed) and not ("detector" in narrowed or "bug" in narrowed):
        raise InvalidRunList("a verdict or variant is judged for one detector or one bug: name either")
    if narrowed.get("variant") not in (None, *Variant.values):
        raise InvalidRunList(f"variant is one of {', '.join(Variant.values)}")
    if narrowed.get("verdict") not in (None, *VERDICTS):
        raise InvalidRunList(f"verdict is one of {', '.join(VERDICTS)}")
    return RunList(Results(selection_query(query), user), narrowed)
