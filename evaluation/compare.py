"""Two sets of runs side by side, result by result: two campaigns, two environments, two torch
versions or two GPU models. For every (bug, reproducer, detector, variant) each side gives how many
runs manifested the symptom, were detected, or raised a false alarm, and the row names what changed
from side A to side B. Beside them, each side's failed and cancelled runs by failure kind."""
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd
from django import forms

from core.enums import Variant
from runners.detectors.plain import PlainBaseline
from runners.failures import breakdown, failure_counts
from runners.models import Campaign, CampaignPurpose, Environment, Run
from runners.selectors import outside_sensitivity_track, shown_name, visible_campaigns, visible_runs

from .filters import ResultFilterForm
from .results import results_viewer
from .tables import judged_runs

PLAIN = PlainBaseline.name

STOPPED_REPRODUCING = "stopped reproducing"
STARTED_REPRODUCING = "started reproducing"
STARTED_MISSING = "detector started missing"
NEWLY_DETECTED = "newly detected"
NEW_FALSE_ALARM = "new false alarm"
FALSE_ALARM_GONE = "false alarm gone"
CHANGES = [STOPPED_REPRODUCING, STARTED_MISSING, NEW_FALSE_ALARM, STARTED_REPRODUCING, NEWLY_DETECTED,
           FALSE_ALARM_GONE]
ONLY_A, ONLY_B = "only in A", "only in B"

COLUMNS = ["bug", "reproducer", "detector", "variant", "a_runs", "a_manifested", "a_detected", "a_false_alarm_runs",
           "b_runs", "b_manifested", "b_detected", "b_false_alarm_runs", "changes"]


@dataclass(frozen=True)
class Side:
    value: str  # "campaign:3", "environment:7", "torch:2.4.1", "gpu:NVIDIA A100-SXM4-80GB"
    label: str
    runs: object  # QuerySet of runs


def side_choices(viewer=None):
    """Grouped choices for a side: campaigns (those ``viewer`` may see), environments, torch versions, GPU models."""
    environments = Environment.objects.order_by("torch", "gpu", "host")
    campaigns = (visible_campaigns(viewer).exclude(purpose=CampaignPurpose.SENSITIVITY)
                 .order_by("-created_at", "-id")[:200])
    return [
        ("Campaign", [(f"campaign:{c.pk}", f"#{c.pk} {shown_name(c, viewer)}") for c in campaigns]),
        ("Environment", [(f"environment:{e.pk}", str(e)) for e in environments]),
        ("torch version", [(f"torch:{v}", f"torch {v}") for v in
                           environments.exclude(torch="").values_list("torch", flat=True).distinct()]),
        ("GPU model", [(f"gpu:{g}", g) for g in
                       Environment.objects.exclude(gpu="").order_by("gpu").values_list("gpu", flat=True).distinct()]
         + [("gpu:", "CPU only (no GPU)")]),
    ]


def side(value, viewer=None):
    """The Side a choice value names, labelled for ``viewer``; LookupError when it names nothing. The sensitivity
    track's runs (mutants) are on no side: they have tables of their own."""
    kind, _, key = value.partition(":")
    runs = outside_sensitivity_track(Run.objects.all())
    if kind == "campaign" and key.isdigit():
        campaign = Campaign.objects.exclude(purpose=CampaignPurpose.SENSITIVITY).filter(pk=key).first()
        if campaign:
            label = f"campaign #{campaign.pk} {shown_name(campaign, viewer)}"
            return Side(value, label, runs.filter(campaign=campaign))
    elif kind == "environment" and key.isdigit():
        environment = Environment.objects.filter(pk=key).first()
        if environment:
            return Side(value, str(environment), runs.filter(environment=environment))
    elif kind == "torch" and key:
        return Side(value, f"torch {key}", runs.filter(environment__torch=key))
    elif kind == "gpu":
        return Side(value, key or "CPU only", runs.filter(environment__gpu=key))
    raise LookupError(f"{value!r} names no campaign, environment, torch version or GPU model")


class CompareForm(forms.Form):
    a = forms.ChoiceField(label="Side A (before)")
    b = forms.ChoiceField(label="Side B (after)")
    only_changes = forms.BooleanField(required=False, label="Only rows that changed")

    def __init__(self, *args, viewer=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["a"].choices = self.fields["b"].choices = [("", "–")] + side_choices(viewer)


def tally(judged):
    """{(bug, reproducer, detector, variant): counts} over judged runs."""
    cells = defaultdict(lambda: {"runs": 0, "manifested": 0, "detected": 0, "false_alarm_runs": 0})
    for row, verdict, _ in judged:
        key = (row["reproducer_version__reproducer__bug__bug_id"] or "", row["reproducer_version__reproducer__name"],
               row["detector__name"], row["variant"])
        cell = cells[key]
        cell["runs"] += 1
        cell["manifested"] += int(bool(row["manifested"]))
        cell["detected"] += int(verdict.detected)
        cell["false_alarm_runs"] += int(verdict.any_false_alarm)
    return dict(cells)


def changes(detector, variant, a, b):
    """What changed in one row from side A to side B."""
    if a is None or b is None:
        return [ONLY_B if a is None else ONLY_A]
    found = []
    if variant == Variant.BUGGY:
        if a["manifested"] and not b["manifested"]:
            found.append(STOPPED_REPRODUCING)
        elif b["manifested"] and not a["manifested"]:
            found.append(STARTED_REPRODUCING)
        if detector != PLAIN and a["detected"] and not b["detected"]:
            found.append(STARTED_MISSING)
        elif detector != PLAIN and b["detected"] and not a["detected"]:
            found.append(NEWLY_DETECTED)
    if detector != PLAIN and b["false_alarm_runs"] and not a["false_alarm_runs"]:
        found.append(NEW_FALSE_ALARM)
    elif detector != PLAIN and a["false_alarm_runs"] and not b["false_alarm_runs"]:
        found.append(FALSE_ALARM_GONE)
    return found


def is_change(row):
    return any(change in CHANGES for change in row["changes"])


def comparison(runs_a, runs_b):
    """Rows for every key seen on either side, changed rows first (the worst kinds of change first)."""
    a, b = tally(judged_runs(runs_a)), tally(judged_runs(runs_b))
    rows = []
    for key in set(a) | set(b):
        bug, reproducer, detector, variant = key
        rows.append({"bug": bug, "reproducer": reproducer, "detector": detector, "variant": variant,
                     "a": a.get(key), "b": b.get(key), "sides": (a.get(key), b.get(key)),
                     "changes": changes(detector, variant, a.get(key), b.get(key))})

    def order(row):
        ranks = [CHANGES.index(c) for c in row["changes"] if c in CHANGES]
        return (min(ranks) if ranks else len(CHANGES), row["bug"] == "", row["bug"], row["reproducer"],
                row["detector"], row["variant"])

    return sorted(rows, key=order)


def summary(rows):
    """[(change, rows, reproducers)]: how many rows show each change, and over how many reproducers."""
    counted = []
    for change in CHANGES + [ONLY_A, ONLY_B]:
        matching = [r for r in rows if change in r["changes"]]
        counted.append((change, len(matching), len({(r["bug"], r["reproducer"]) for r in matching})))
    return counted


def comparison_frame(rows):
    """The comparison as a flat table, for the downloads."""
    def side_values(counts):
        if counts is None:
            return [0, None, None, None]
        return [counts["runs"], counts["manifested"], counts["detected"], counts["false_alarm_runs"]]

    records = [[r["bug"], r["reproducer"], r["detector"], r["variant"], *side_values(r["a"]), *side_values(r["b"]),
                "; ".join(r["changes"])] for r in rows]
    return pd.DataFrame(records, columns=COLUMNS, dtype=object)


def failures_by_kind(runs_a, runs_b):
    """[{kind, label, a, b}]: the failed and cancelled runs of each side by failure kind, most in all first."""
    a, b = failure_counts(runs_a), failure_counts(runs_b)
    rows = breakdown({kind: a.get(kind, 0) + b.get(kind, 0) for kind in set(a) | set(b)})
    return [{**row, "a": a.get(row["kind"], 0), "b": b.get(row["kind"], 0)} for row in rows]


@dataclass
class Comparison:
    a: Side
    b: Side
    rows: list  # every row; ``shown`` are those on screen and in the downloads
    only_changes: bool
    failures: list = field(default_factory=list)  # failures_by_kind

    @property
    def shown(self):
        return [r for r in self.rows if is_change(r)] if self.only_changes else self.rows

    @property
    def summary(self):
        return summary(self.rows)


def compare_query(query, user=None):
    """(compare form, filter form, Comparison or None) for a query string: ``a`` and ``b`` name the
    sides, ``only_changes`` and the results filter fields (detectors, bugs...) narrow the rows. The
    runs compared are those of the result tables for ``user`` (evaluation.results.results_viewer)."""
    viewer = results_viewer(user)
    if not (query.get("a") and query.get("b")):  # a side or none chosen yet: preselect, no errors
        form = CompareForm(initial={"a": query.get("a", ""), "b": query.get("b", ""),
                                    "only_changes": bool(query.get("only_changes"))}, viewer=viewer)
    else:
        form = CompareForm(query, viewer=viewer)
    filters = ResultFilterForm(query, user=viewer)
    if not form.is_bound or not form.is_valid():
        return form, filters, None
    criteria = filters.criteria()
    a, b = side(form.cleaned_data["a"], viewer), side(form.cleaned_data["b"], viewer)
    runs_a, runs_b = (criteria.runs(visible_runs(viewer, chosen.runs)) for chosen in (a, b))
    return form, filters, Comparison(a, b, comparison(runs_a, runs_b), form.cleaned_data["only_changes"],
                                     failures_by_kind(runs_a, runs_b))
