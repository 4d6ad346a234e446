import re

from django import forms
from django.core.exceptions import ValidationError

from bugs.models import Bug, BugStatus, Reproducer
from core.enums import ReviewState, Variant

from .detectors import campaign_plugins
from .models import PythonEnvironment, RunFailureKind
from .plans import MAX_SEEDS, MAX_STEPS, CampaignPlan


def parse_seeds(text):
    """'0-2, 7' -> [0, 1, 2, 7]."""
    seeds = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match:
            raise forms.ValidationError(f"{part!r} is not a seed or a range such as 0-4.")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first or last - first >= MAX_SEEDS:
            raise forms.ValidationError(f"{part!r}: give a rising range of at most {MAX_SEEDS} seeds.")
        seeds.update(range(first, last + 1))
    if not seeds or len(seeds) > MAX_SEEDS:
        raise forms.ValidationError(f"Give between 1 and {MAX_SEEDS} seeds.")
    return sorted(seeds)


class CampaignForm(forms.Form):
    """What a maintainer picks; a valid form holds its CampaignPlan as ``plan``."""

    name = forms.CharField(max_length=200)
    bugs = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    pipelines = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                          help_text="Clean pipelines: fixed variant only, for false positives.")
    include_cuda = forms.BooleanField(required=False,
                                      label="Include CUDA reproducers and pipelines (they need a GPU worker)")
    detectors = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple)
    variants = forms.MultipleChoiceField(choices=Variant.choices, initial=Variant.values,
                                         widget=forms.CheckboxSelectMultiple)
    seeds = forms.CharField(initial="0", help_text="Seeds or ranges, e.g. 0-2 or 0, 5, 9.")
    steps = forms.IntegerField(required=False, min_value=1, max_value=MAX_STEPS,
                               help_text="Leave empty for each reproducer's default.")
    environments = forms.ModelMultipleChoiceField(
        queryset=PythonEnvironment.objects.all(), required=False, to_field_name="name",
        widget=forms.CheckboxSelectMultiple,
        help_text="Python environments (torch releases) to run in; none: the workers' own. A reproducer runs only in "
                  "those its needs.packages allow.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        approved = Reproducer.objects.filter(versions__review_state=ReviewState.APPROVED)
        bugs = (Bug.objects.filter(reproducers__in=approved).exclude(status=BugStatus.DEPRECATED)
                .distinct().order_by("bug_id").values_list("bug_id", "title"))
        self.fields["bugs"].choices = [(bug_id, f"{bug_id}: {title}") for bug_id, title in bugs]
        self.fields["pipelines"].choices = [
            (name, f"{name} (needs CUDA)" if needs_cuda else name) for name, needs_cuda
            in approved.reference_pipelines().distinct().order_by("name").values_list("name", "needs_cuda")]
        self.fields["detectors"].choices = [(name, name) for name in campaign_plugins()]

    def clean_seeds(self):
        return parse_seeds(self.cleaned_data["seeds"])

    def clean(self):
        """Resolve the choices into a CampaignPlan (``self.plan``); its problems show on their fields."""
        data = super().clean()
        if self.errors:
            return data
        if not data.get("bugs") and not data.get("pipelines"):
            raise forms.ValidationError("Pick at least one bug or pipeline.")
        try:
            self.plan = CampaignPlan.resolve(bugs=data["bugs"], pipelines=data["pipelines"],
                                             detectors=data["detectors"], variants=data["variants"],
                                             seeds=data["seeds"], steps=data["steps"], cuda=data["include_cuda"],
                                             environments=list(data["environments"]) or None)
        except ValidationError as error:
            for field, messages in error.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)
        return data


class RetryForm(forms.Form):
    """The campaign page's retry: a box per kind of failure among the campaign's failed and cancelled runs
    (``present``: runners.failures.breakdown), all ticked at first. Ticking every kind present retries every
    failed and cancelled run, as does a post without the boxes (no ``by_kind``)."""

    by_kind = forms.BooleanField(required=False, initial=True, widget=forms.HiddenInput)
    kind = forms.MultipleChoiceField(choices=RunFailureKind.choices, required=False, label="Kinds of failure",
                                     widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args, present=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.present = [row["kind"] for row in present if row["kind"]]  # runs without a kind have no box
        if not self.is_bound:  # the boxes shown; a post is checked against every kind
            self.fields["kind"].choices = [(row["kind"], f"{row['label']} ({row['count']})")
                                           for row in present if row["kind"]]
            self.fields["kind"].initial = self.present

    def clean(self):
        data = super().clean()
        if data.get("by_kind") and not data.get("kind") and self.present and "kind" not in self.errors:
            raise forms.ValidationError("Tick at least one kind of failure to retry.")
        return data

    def kinds(self):
        """None (every failed and cancelled run) or the RunFailureKinds ticked."""
        ticked = self.cleaned_data["kind"]
        if not self.cleaned_data["by_kind"] or set(ticked) >= set(self.present):
            return None
        return [RunFailureKind(kind) for kind in ticked]


class DetectorSubmissionForm(forms.Form):
    """A detector's plugin module (pasted or uploaded), its config and a link (docs/writing-a-detector.md)."""

    code = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false"}),
                           help_text="The plugin module: one class deriving from DetectorPlugin.")
    code_file = forms.FileField(required=False, label="or upload the module (.py)")
    config = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                             help_text="Optional JSON object applied over the class's default_config.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                  help_text="Optional; the class's description attribute otherwise.")
    link = forms.URLField(required=False, max_length=500, assume_scheme="https",
                          help_text="A paper or repository describing the detector.")
