"""API token actions. A secret exists in memory once, when it is created; the database keeps its hash.
The callers check that the acting user owns the token, or is staff, and that a token is not creating a token
(accounts.permissions)."""
from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, cast

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core import audit
from core.enums import AuditAction
from core.roles import CONTRIBUTOR, MAINTAINER, MAINTAINERS_GROUP, role_of

from .models import ApiToken

if TYPE_CHECKING:
    from django.contrib.auth.models import User

TOKEN_NAME_MAX = cast(int, ApiToken._meta.get_field("name").max_length)  # a CharField's: never None


def do_create_api_token(name: str | None, *, acting_user: User) -> tuple[ApiToken, str]:
    """A new named token for ``acting_user``. Returns ``(token, secret)``; the secret cannot be recovered later."""
    name = (name or "").strip()
    if not name:
        raise ValidationError("Give the token a name, e.g. the machine or script that will use it.")
    if len(name) > TOKEN_NAME_MAX:
        raise ValidationError(f"A token name has at most {TOKEN_NAME_MAX} characters.")
    secret = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=acting_user, name=name, prefix=secret[:ApiToken.PREFIX_LENGTH],
                                    key_hash=ApiToken.hash_secret(secret))
    return token, secret


def do_revoke_api_token(token: ApiToken, *, acting_user: User | None) -> ApiToken:
    """Revoke ``token`` (its owner, or staff in the admin). Revoking twice keeps the first date."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=token.revoked_at)
    return token


def do_revoke_api_tokens_of(user: User, *, acting_user: User | None) -> int:
    """Revoke every active token of ``user``, as a password change does (accounts.passwords), recording who did
    and which tokens (names and prefixes) in the account's audit trail. Returns how many."""
    with transaction.atomic():
        active = list(ApiToken.objects.select_for_update().filter(user=user, revoked_at__isnull=True)
                      .values_list("pk", "name", "prefix"))
        revoked = [f"{name} ({prefix}…)" for _, name, prefix in active]
        if revoked:  # exactly the tokens listed (and locked): one made meanwhile is not revoked unrecorded
            ApiToken.objects.filter(pk__in=[pk for pk, _, _ in active]).update(revoked_at=timezone.now())
            audit.record(acting_user, AuditAction.REVOKE_API_TOKENS, user,
                         f"revoked {len(revoked)} API token(s) of {user.get_username()}", tokens=revoked)
    return len(revoked)


@transaction.atomic
def do_set_role(user: User, role: str, *, acting_user: User | None) -> str:
    """Make ``user`` a maintainer (a member of the Maintainers group) or a contributor (not a member); the role
    they then hold (core.roles.role_of: a superuser stays a maintainer, staff stays staff)."""
    if role not in (CONTRIBUTOR, MAINTAINER):
        raise ValidationError(f"A role is {CONTRIBUTOR} or {MAINTAINER}, not {role!r}.")
    group = Group.objects.get(name=MAINTAINERS_GROUP)  # made by migrate
    before = role_of(user)
    if role == MAINTAINER:
        user.groups.add(group)
    else:
        user.groups.remove(group)
    user = type(user).objects.get(pk=user.pk)  # permissions are cached on the instance
    audit.record(acting_user, AuditAction.SET_ROLE, user, f"{user.get_username()}: {before} -> {role_of(user)}",
                 asked=role)
    return role_of(user)
