"""Submitting bugs and reproducers, and the maintainers' review queue."""
import difflib

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render

from core.enums import ReviewState

from .actions import do_review_version, do_submit_reproducer
from .forms import BugSubmissionForm, ReproducerFilesForm, ReviewForm
from .models import ReproducerVersion
from .permissions import APPROVE_PERMISSION, can_resubmit
from .selectors import visible_bugs, visible_versions
from .submissions import SubmissionLimits, check_uploads, reproducer_problems
from .views import highlighted, pygments_css

KEPT_FILES = "submission_kept_files"  # the session's key for the files of a refused submission


def _submit(request, form, bug=None):
    """Check the form and the files together, so that every problem is reported at once. On a refusal the files,
    when they could be read, are kept in the session: fixing a field does not mean attaching them again."""
    uploads = request.FILES.getlist("files")
    # checked: the files' (manifest, problems), handed to the action so that the code is parsed once
    if uploads:
        files, checked, problems = check_uploads(uploads)
    else:  # the files kept from the last attempt, which were read without a problem then
        files = form.kept_files
        checked = reproducer_problems(files) if files else None
        problems = checked[1] if checked else []
    if form.is_valid() and not problems:
        try:
            version = do_submit_reproducer(files, form.cleaned_data["reproducer_name"], bug=bug,
                                           bug_fields=None if bug else form.bug_fields(), acting_user=request.user,
                                           checked=checked)
        except ValidationError as error:
            problems = error.messages
        else:
            request.session.pop(KEPT_FILES, None)
            return version
    _keep_files(request, form, bug, files if checked else {})
    for problem in problems:
        form.add_error(None, problem)
    return None


def _kept_files(request, bug):
    """The files kept from the user's last refused submission to this form (a new bug, or ``bug``'s new version)."""
    kept = request.session.get(KEPT_FILES)
    return kept["files"] if kept and kept["bug"] == (bug and bug.bug_id) else {}


def _keep_files(request, form, bug, files):
    if files:
        request.session[KEPT_FILES] = {"bug": bug and bug.bug_id, "files": files}
    else:
        request.session.pop(KEPT_FILES, None)
    form.keep_files(files)


def _submission_page(request, form_class, bug=None):
    """The form for a new bug, or for a new version of ``bug``. Files are kept only from one refused attempt to
    the next: opening the page afresh forgets them."""
    if request.method != "POST":
        request.session.pop(KEPT_FILES, None)
        form = form_class()
    else:
        form = form_class(request.POST, request.FILES)
        form.keep_files(_kept_files(request, bug))
        version = _submit(request, form, bug=bug)
        if version is not None:
            if bug:
                messages.success(request, f"New version {version.short_hash} of {version.reproducer} waits for review.")
            else:
                messages.success(request, f"{version.reproducer.bug.bug_id} was submitted. A maintainer will read the "
                                          f"code; nothing runs before they approve it.")
            return redirect("bugs:my_submissions")
    return render(request, "bugs/submit.html", {"form": form, "bug": bug, "limits": limits_for_humans()})


@login_required
def submit_bug(request):
    return _submission_page(request, BugSubmissionForm)


@login_required
def resubmit(request, bug_id):
    bug = get_object_or_404(visible_bugs(request.user), bug_id=bug_id)
    if not can_resubmit(request.user, bug):
        raise PermissionDenied("Only the bug's submitter or a maintainer can submit new versions of it.")
    return _submission_page(request, ReproducerFilesForm, bug=bug)


def limits_for_humans():
    limits = SubmissionLimits.from_settings()
    return {"max_files": limits.max_files, "max_file_kib": limits.max_file_bytes // 1024,
            "max_total_kib": limits.max_total_bytes // 1024}


@login_required
def my_submissions(request):
    versions = (visible_versions(request.user).filter(submitted_by=request.user)  # not those of held-out bugs
                .select_related("reproducer__bug", "reviewed_by").defer("files").order_by("-created_at", "-id"))
    page = Paginator(versions, 25).get_page(request.GET.get("page"))
    return render(request, "bugs/my_submissions.html", {"page_obj": page, "versions": page.object_list})


@permission_required(APPROVE_PERMISSION, raise_exception=True)
def review_queue(request):
    pending = (ReproducerVersion.objects.filter(review_state=ReviewState.PENDING)
               .select_related("reproducer__bug", "submitted_by").defer("files").order_by("created_at", "id"))
    recent = (ReproducerVersion.objects.exclude(review_state=ReviewState.PENDING).exclude(submitted_by=None)
              .select_related("reproducer__bug", "submitted_by", "reviewed_by").defer("files")
              .order_by("-reviewed_at", "-id")[:20])
    page = Paginator(pending, 25).get_page(request.GET.get("page"))
    return render(request, "bugs/review_queue.html", {"page_obj": page, "pending": page.object_list,
                                                      "recent": recent})


def file_diffs(previous, version):
    """[(path, change, highlighted unified diff)] between two versions' files; all files if there is no previous."""
    before = previous.files if previous else {}
    diffs = []
    for path in sorted(set(before) | set(version.files)):
        old, new = before.get(path), version.files.get(path)
        if old == new:
            continue
        change = "added" if old is None else "removed" if new is None else "changed"
        lines = difflib.unified_diff((old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
                                     fromfile=f"a/{path}", tofile=f"b/{path}")
        diffs.append((path, change, highlighted("change.diff", "".join(lines))))
    return diffs


@permission_required(APPROVE_PERMISSION, raise_exception=True)
def review_version(request, pk):
    version = get_object_or_404(ReproducerVersion.objects.select_related("reproducer__bug", "submitted_by"), pk=pk)
    form = ReviewForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        approve = form.cleaned_data["decision"] == "approve"
        try:
            do_review_version(version, approve, form.cleaned_data["note"], acting_user=request.user)
        except ValidationError as error:
            form.add_error(None, " ".join(error.messages))
        else:
            if approve:
                messages.success(request, f"{version} approved; its verification runs are queued.")
            else:
                messages.info(request, f"{version} rejected; the submitter sees your reason.")
            return redirect("bugs:review_queue")
    previous = version.approved_baseline()
    return render(request, "bugs/review_detail.html", {
        "version": version, "bug": version.reproducer.bug, "previous": previous, "form": form,
        "files": [(name, highlighted(name, text)) for name, text in sorted(version.files.items())],
        "diffs": file_diffs(previous, version) if previous else [], "pygments_css": pygments_css(),
    })
