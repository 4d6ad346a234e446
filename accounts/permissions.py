"""Who may do what with API tokens. Views and the API check these at the edge (accounts.actions does not)."""
from rest_framework import permissions

from .models import ApiToken


class NotByApiToken(permissions.BasePermission):
    """A token cannot create tokens: a new one needs the password (``POST /api/token/``) or a signed-in
    session, so a stolen token, once revoked, leaves nothing behind."""

    message = ("An API token cannot create tokens: use POST /api/token/ with your password, or "
               "/account/tokens/ signed in.")

    def has_permission(self, request, view):
        return not isinstance(request.auth, ApiToken)
