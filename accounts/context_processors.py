from django.utils.functional import SimpleLazyObject

from .roles import is_maintainer, role_of


def role(request):
    """``role`` and ``is_contributor`` / ``is_maintainer`` / ``is_staff_role`` for templates (nav by role).
    Lazy: the group lookup happens only on pages that ask."""
    user = getattr(request, "user", None)
    signed_in = bool(user and user.is_authenticated)
    return {
        "role": SimpleLazyObject(lambda: role_of(user)),
        "is_contributor": signed_in,
        "is_maintainer": SimpleLazyObject(lambda: is_maintainer(user)),
        "is_staff_role": signed_in and user.is_staff,
    }
