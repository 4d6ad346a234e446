"""Who may do what to runs and campaigns, checked at the edge: views, the API and the admin."""
from rest_framework import permissions

from core.roles import TRIGGER_PERMISSION


def can_trigger(user):
    """Create, cancel and retry campaigns (maintainers)."""
    return bool(user and user.is_authenticated and user.has_perm(TRIGGER_PERMISSION))


class CanTriggerCampaigns(permissions.BasePermission):
    """The API's edge for campaigns: anyone reads (what they may see: runners.selectors), maintainers write."""

    message = "Only maintainers can trigger runs."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or can_trigger(request.user)
