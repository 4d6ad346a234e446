"""Submitting detectors, and the maintainers' review of detector code (docs/writing-a-detector.md)."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render

from bugs.forms import ReviewForm
from bugs.submission_views import file_diffs
from bugs.views import highlighted, pygments_css
from core.enums import ReviewState

from ..actions.detector_versions import (
    do_approve_detector_version,
    do_reject_detector_version,
    do_submit_detector_version,
)
from ..forms import DetectorSubmissionForm
from ..models import DetectorVersion
from ..permissions import can_review_detectors, detector_submission_refusal
from .submissions import MAX_CONFIG_BYTES, check_submission


@login_required
def submit_detector(request):
    form = DetectorSubmissionForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        uploads = [data["code_file"]] if data["code_file"] else []
        checked, problems = check_submission(data["code"], uploads, data["config"], data["description"])
        if checked is not None and (refusal := detector_submission_refusal(request.user, checked.name)):
            problems = [refusal]
        if not problems:
            try:
                version = do_submit_detector_version(checked, data["link"], acting_user=request.user)
            except ValidationError as error:
                problems = error.messages
            else:
                messages.success(request, f"{version} waits for review. Nothing of it runs before a maintainer "
                                          f"approves it.")
                return redirect("runners:my_detectors")
        for problem in problems:
            form.add_error(None, problem)
    return render(request, "runners/detector_submit.html", {"form": form, "max_config_kib": MAX_CONFIG_BYTES // 1024})


@login_required
def my_detectors(request):
    versions = DetectorVersion.objects.filter(submitted_by=request.user).select_related("reviewed_by").defer("code")
    page = Paginator(versions.order_by("-created_at", "-id"), 25).get_page(request.GET.get("page"))
    return render(request, "runners/detector_mine.html", {"page_obj": page, "versions": page.object_list})


def _reviewer(request):
    if not can_review_detectors(request.user):
        raise PermissionDenied("Only maintainers review detector code.")


def detector_review_queue(request):
    _reviewer(request)
    submitted = (DetectorVersion.objects.filter(builtin=False).select_related("submitted_by", "reviewed_by")
                 .defer("code"))
    pending = submitted.filter(review_state=ReviewState.PENDING).order_by("created_at", "id")
    recent = submitted.exclude(review_state=ReviewState.PENDING).order_by("-reviewed_at", "-id")[:20]
    page = Paginator(pending, 25).get_page(request.GET.get("page"))
    return render(request, "runners/detector_review_queue.html", {"page_obj": page, "pending": page.object_list,
                                                                  "recent": recent})


def review_detector(request, pk):
    _reviewer(request)
    version = get_object_or_404(DetectorVersion.objects.select_related("submitted_by", "reviewed_by"), pk=pk)
    form = ReviewForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            if form.cleaned_data["decision"] == "approve":
                version, campaign = do_approve_detector_version(version, form.cleaned_data["note"],
                                                                acting_user=request.user)
                messages.success(request, f"{version} approved; its scoring campaign #{campaign.pk} is queued.")
            else:
                do_reject_detector_version(version, form.cleaned_data["note"], acting_user=request.user)
                messages.info(request, f"{version} rejected; the submitter sees your reason.")
        except ValidationError as error:
            form.add_error(None, " ".join(error.messages))
        else:
            return redirect("runners:detector_review_queue")
    previous = version.approved_baseline()
    return render(request, "runners/detector_review.html", {
        "version": version, "previous": previous, "form": form, "pygments_css": pygments_css(),
        "files": [(name, highlighted(name, text)) for name, text in version.files.items()],
        "diffs": file_diffs(previous, version) if previous else [],
    })
