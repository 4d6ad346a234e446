from datetime import timedelta

from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from .models import ApiToken

KEYWORDS = ("token", "bearer")
LAST_USED_RESOLUTION = timedelta(minutes=1)  # at most one write per token and minute


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Token <secret>`` or ``Authorization: Bearer <secret>`` with an ``ApiToken``."""

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].decode("latin-1").lower() not in KEYWORDS:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(_("Invalid token header: expected 'Token <secret>'."))
        try:
            secret = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed(_("Invalid token header: the token has invalid characters."))
        return self.authenticate_credentials(secret)

    def authenticate_credentials(self, secret):
        token = ApiToken.objects.select_related("user").filter(key_hash=ApiToken.hash_secret(secret)).first()
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed(
                f"This token ({token.prefix}…) was revoked on {token.revoked_at:%Y-%m-%d %H:%M} UTC; "
                "create a new one at /account/tokens/.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token.user, token

    def authenticate_header(self, request):
        return "Token"  # so that a missing credential is a 401, not a 403
