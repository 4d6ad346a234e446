"""Who may do what to runs and campaigns, checked at the edge: views, the API and the admin."""
from rest_framework import permissions

from bugs.permissions import APPROVE_PERMISSION

TRIGGER_PERMISSION = "runners.trigger_campaign"  # the maintainer's (RunnersConfig.maintainer_permissions)


def can_trigger(user):
    """Create, cancel and retry campaigns (maintainers)."""
    return bool(user and user.is_authenticated and user.has_perm(TRIGGER_PERMISSION))


class CanTriggerCampaigns(permissions.BasePermission):
    """The API's edge for campaigns: anyone reads (what they may see: runners.selectors), maintainers write."""

    message = "Only maintainers can trigger runs."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or can_trigger(request.user)


def can_review_detectors(user):
    """Approve or reject submitted detector code (maintainers, who review reproducer code too)."""
    return bool(user and user.is_authenticated and user.has_perm(APPROVE_PERMISSION))


def detector_submission_refusal(user, name):
    """Why ``user`` may not submit a version of the detector ``name``, or '': anyone signed in may submit a detector
    of a new name; new versions of a submitted detector come from whoever submitted it before, or a maintainer."""
    from .models import DetectorVersion

    earlier = DetectorVersion.objects.filter(name=name, builtin=False)
    if earlier.exists() and not earlier.filter(submitted_by=user).exists() and not can_review_detectors(user):
        return (f"{name} was submitted by someone else; only they or a maintainer can submit new versions of it. "
                f"Give yours a name of its own.")
    return ""


class CanReviewDetectors(permissions.BasePermission):
    message = "Only maintainers can review detector code."

    def has_permission(self, request, view):
        return can_review_detectors(request.user)
