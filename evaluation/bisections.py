"""What a bisection's page, the bug page and ``manage.py bisect`` show of it: the path it took (each round's probes:
release, outcome, runs, seconds) and its cost; and the form that starts one from the dashboard."""
from dataclasses import dataclass

from django import forms

from core.cli import comma_list
from runners.bisection import final_release

from .actions import MAX_BISECTION_SEEDS


@dataclass
class Path:
    rounds: list  # [(round number, [probes])]
    runs: int
    run_seconds: float
    elapsed_seconds: float | None


def bisection_path(bisection):
    """The ``Path`` of ``bisection``: its probes by round, the runs they made and their wall time added up, and
    the time from its start to its end (None while it runs)."""
    rounds = {}
    for probe in bisection.probes.select_related("environment").order_by("round", "id"):
        rounds.setdefault(probe.round, []).append(probe)
    probes = [probe for group in rounds.values() for probe in group]
    elapsed = ((bisection.finished_at - bisection.created_at).total_seconds() if bisection.finished_at else None)
    return Path(sorted(rounds.items()), sum(probe.runs for probe in probes),
                sum(probe.seconds or 0.0 for probe in probes), elapsed)


def path_lines(bisection):
    """The path and the result as lines of text (``manage.py bisect``)."""
    path = bisection_path(bisection)
    lines = []
    for number, probes in path.rounds:
        for probe in probes:
            outcome = probe.get_outcome_display() or "pending"
            lines.append(f"round {number}: torch {probe.release}: {outcome} (manifested {probe.manifested}/"
                         f"{probe.runs}, {probe.failed} failed; {probe.seconds or 0:.1f} s of runs)")
    elapsed = f", {path.elapsed_seconds:.0f} s from start to end" if path.elapsed_seconds is not None else ""
    lines.append(f"{bisection.get_status_display()}: {bisection.reason or 'still running'}; {len(path.rounds)} "
                 f"round(s), {path.runs} runs, {path.run_seconds:.1f} s of runs{elapsed}.")
    if bisection.first_changed:
        lines.append(f"First release where the oracle changed: {bisection.first_changed} "
                     f"(last agreeing with {bisection.good}: {bisection.last_same}).")
    return lines


class BisectionForm(forms.Form):
    """Start a bisection of one bug from the dashboard (maintainers)."""

    bug = forms.CharField(max_length=64, help_text="The bug's ID, e.g. PT-115607.")
    good = forms.CharField(max_length=32, initial="2.9.0", help_text="The release the search starts from.")
    bad = forms.CharField(max_length=32, initial="2.13.0", help_text="A release whose outcome differs from it.")
    releases = forms.CharField(required=False, max_length=500,
                               help_text="Comma-separated releases to search; empty: those the package index serves "
                                         "between the two.")
    seeds = forms.IntegerField(min_value=1, max_value=MAX_BISECTION_SEEDS, initial=3,
                               help_text="Seeds per probe; a release has the bug when most of them manifest it.")
    workers = forms.IntegerField(required=False, min_value=1, max_value=32,
                                 help_text="Probes per round; empty: the worker slots free as each round starts.")

    def clean_good(self):
        return self._release(self.cleaned_data["good"])

    def clean_bad(self):
        return self._release(self.cleaned_data["bad"])

    def clean_releases(self):
        return [self._release(release) for release in comma_list(self.cleaned_data["releases"])] or None

    @staticmethod
    def _release(value):
        value = value.strip()
        try:
            final_release(value)
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None
        return value
