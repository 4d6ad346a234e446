from django import forms

from .models import Bug, Reproduction

SUBMITTED_BUG_FIELDS = [
    "bug_id", "title", "framework", "framework_versions", "fault_location", "root_cause_category", "root_cause",
    "symptom", "fix", "detection_signal", "upstream_issue_url", "fix_url", "reproduction", "needs_cuda_original",
    "multi_rank",
]
FILES_HELP = "reproducer.yaml and the program (several files), or one .zip / .tar.gz of the folder."


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    """A list of uploads; the contents are checked by bugs.submissions, not here."""

    widget = MultipleFileInput

    def clean(self, data, initial=None):
        uploads = data if isinstance(data, (list, tuple)) else [data] if data else []
        if not uploads:
            if self.required:
                raise forms.ValidationError("Upload the reproducer's files or one archive of them.")
            return []
        return [super(MultipleFileField, self).clean(upload, initial) for upload in uploads]


class ReproducerFilesForm(forms.Form):
    required_css_class = "required"  # the page marks required fields by their label
    reproducer_name = forms.SlugField(initial="cpu", max_length=50,
                                      help_text="A short slug such as cpu or cuda: the folder's name in the catalog.")
    files = MultipleFileField(help_text=FILES_HELP)
    kept_files = {}

    def keep_files(self, files):
        """Offer the files of a refused attempt (``{path: text}``, kept by the view) for this one: attaching files
        becomes optional, and new ones replace them."""
        self.kept_files = files
        self.fields["files"].required = not files


class BugSubmissionForm(ReproducerFilesForm, forms.ModelForm):
    """A new bug and its reproducer. The model's own validators check the ID's form and uniqueness."""

    upstream_issue_url = forms.URLField(required=False, max_length=500, assume_scheme="https",
                                        label="Upstream issue URL")
    fix_url = forms.URLField(required=False, max_length=500, assume_scheme="https", label="Fix URL")
    reproduction = forms.ChoiceField(
        choices=[(Reproduction.FAITHFUL, "Faithful: real framework code hits the real bug"),
                 (Reproduction.INJECTED, "Injected: the faulty logic is rebuilt in a small loop")])

    class Meta:
        model = Bug
        fields = SUBMITTED_BUG_FIELDS
        widgets = {name: forms.Textarea(attrs={"rows": 3}) for name in
                   ("root_cause", "symptom", "fix", "detection_signal", "framework_versions")}
        labels = {"bug_id": "Bug ID", "needs_cuda_original": "The original bug needs CUDA",
                  "multi_rank": "It needs several processes (ranks)", "root_cause_category": "Root-cause category",
                  "framework_versions": "Affected versions"}
        help_texts = {"bug_id": "Upper-case words joined by dashes, as in PT-115607, DS-1801 or SO-60335387. "
                                "IDs are never reused."}

    def bug_fields(self):
        return {name: self.cleaned_data[name] for name in SUBMITTED_BUG_FIELDS}


class ReviewForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")], widget=forms.HiddenInput)
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                           help_text="Required when rejecting: the submitter reads it.")

    def clean(self):
        data = super().clean()
        if data.get("decision") == "reject" and not data.get("note", "").strip():
            self.add_error("note", "Say why: a rejection needs a reason for the submitter.")
        return data
