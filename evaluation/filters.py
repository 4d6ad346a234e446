"""The results filter. One query string narrows the results page, its plots, its downloads, the API
(/api/results/) and ``manage.py export`` alike: they all go through ``Criteria``. The comparison
uses its run filters (detectors, bugs, framework, fault location), not the matrix outcome.

The matrix outcome is a verdict on a bug's buggy runs under a detector, so it selects rows of the detection
matrix and, with them, the latency (which only detected buggy runs have). The false positives (clean runs,
clean pipelines included) and the overhead (one clean workload) have no such outcome and are not narrowed."""
from dataclasses import dataclass
from functools import cache

from django import forms

from bugs.models import Bug, FaultLocation, Framework
from bugs.selectors import visible_bugs, visible_reproducers
from runners.selectors import watched_by, watcher_names

from .metrics import Outcome

ANY = [("", "any")]
OUTCOMES = [Outcome.DETECTED, Outcome.FALSE_ALARM, Outcome.MISSED, Outcome.NO_DATA]


class ResultFilterForm(forms.Form):
    detector = forms.MultipleChoiceField(required=False, label="Detectors", widget=forms.CheckboxSelectMultiple)
    bug = forms.MultipleChoiceField(required=False, label="Bugs", widget=forms.SelectMultiple(attrs={"size": 5}))
    framework = forms.ChoiceField(required=False, choices=ANY + Framework.choices)
    fault_location = forms.ChoiceField(required=False, choices=ANY + FaultLocation.choices,
                                       label="Where the fault lives")
    outcome = forms.ChoiceField(required=False, choices=ANY + [(o, o) for o in OUTCOMES],
                                label="Matrix outcome",
                                help_text="Rows of the detection matrix with this outcome, judged on buggy runs; "
                                          "latency follows it, false positives and overhead do not")

    def __init__(self, *args, user=None, **kwargs):
        """The bugs offered are those with a reproducer that ``user`` may see (None: the public). The choices are
        read when first needed, once (a query without these fields validates without them)."""
        super().__init__(*args, **kwargs)
        self.fields["detector"].choices = cache(lambda: [(name, name) for name in watcher_names()])
        self.fields["bug"].choices = cache(lambda: [(bug_id, bug_id) for bug_id in (
            visible_bugs(user).filter(reproducers__in=visible_reproducers(user)).order_by("bug_id")
            .values_list("bug_id", flat=True).distinct())])

    def criteria(self):
        """The criteria of the fields that are valid (an invalid field narrows nothing; see ``errors``)."""
        self.is_valid()
        data = self.cleaned_data
        return Criteria(detectors=tuple(data.get("detector") or ()), bugs=tuple(data.get("bug") or ()),
                        framework=data.get("framework") or "", fault_location=data.get("fault_location") or "",
                        outcome=data.get("outcome") or "")


@dataclass(frozen=True)
class Criteria:
    """What the user narrowed the results to. Detectors and bug properties select runs (so every table
    and plot is computed over the same runs); the outcome selects rows of the detection matrix."""

    detectors: tuple = ()
    bugs: tuple = ()
    framework: str = ""
    fault_location: str = ""
    outcome: str = ""

    @property
    def narrows_bugs(self):
        return bool(self.bugs or self.framework or self.fault_location)

    @property
    def narrows_runs(self):
        """Whether the filter selects runs (the outcome selects rows of the matrix, not runs)."""
        return bool(self.detectors or self.narrows_bugs)

    @property
    def keeps_detections(self):
        """Whether the outcome leaves any detected run: latency comes only from detected buggy runs, and those lie
        only in matrix cells whose outcome is "detected" (``metrics.cell_outcome``)."""
        return self.outcome in ("", Outcome.DETECTED)

    def __bool__(self):
        return bool(self.narrows_runs or self.outcome)

    def bug_queryset(self):
        bugs = Bug.objects.all()
        if self.bugs:
            bugs = bugs.filter(bug_id__in=self.bugs)
        if self.framework:
            bugs = bugs.filter(framework=self.framework)
        if self.fault_location:
            bugs = bugs.filter(fault_location=self.fault_location)
        return bugs

    def runs(self, runs):
        """Runs of the chosen detectors on the chosen bugs (clean reference pipelines drop out once
        the bugs are narrowed, since they belong to no bug)."""
        if self.detectors:
            runs = runs.filter(watched_by(self.detectors))
        if self.narrows_bugs:
            runs = runs.filter(reproducer_version__reproducer__bug__in=self.bug_queryset())
        return runs

    def rows(self, frame, outcome=False):
        """Rows of a table (a DataFrame with a ``detector`` and maybe a ``bug`` column) that match."""
        keep = frame.index == frame.index
        if self.detectors and "detector" in frame:
            chosen = frame["detector"].isin(self.detectors)
            if "members" in frame:  # a bundle's row (the flakiness table's) when one of its members is chosen
                chosen |= frame["members"].fillna("").map(lambda names: bool(set(names.split(", ")) & set(
                    self.detectors)))
            keep &= chosen
        if self.narrows_bugs and "bug" in frame:
            keep &= frame["bug"].isin(set(self.bug_queryset().values_list("bug_id", flat=True)))
        if outcome and self.outcome and "outcome" in frame:
            keep &= frame["outcome"] == self.outcome
        return frame[keep].reset_index(drop=True)
