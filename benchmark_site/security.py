"""Request limits: the body's size before a view, or the CSRF check, reads a byte of it; who the client is,
for the API throttles and for django-axes' count of failed sign-ins."""
import ipaddress

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpResponse, JsonResponse
from rest_framework import throttling


def client_ip(request):
    """The client's address: ``REMOTE_ADDR``, or with ``SILENTBENCH_NUM_PROXIES`` trusted proxies the address
    the outermost of them appended to X-Forwarded-For. DRF's throttles read it the same way (its NUM_PROXIES);
    an entry that is not an address (a proxy count larger than the real chain) falls back to ``REMOTE_ADDR``."""
    address = throttling.BaseThrottle().get_ident(request)
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return request.META.get("REMOTE_ADDR")


def attempted_username(request, credentials):
    """The username django-axes counts a failed sign-in under, cut to the longest a username can be: Django's
    login form (and the admin's) checks no length, and django-axes stores at most 255 characters."""
    username = (credentials or {}).get("username") or request.POST.get("username")
    user_model = get_user_model()
    return username[:user_model._meta.get_field(user_model.USERNAME_FIELD).max_length] if username else None


class UserRateThrottle(throttling.UserRateThrottle):
    """DRF's per-user rate, for signed-in callers only: anonymous ones have the ``anon`` rate, by address,
    so that no address can ever count against an account's bucket (DRF's own class counts an anonymous
    caller under ``user`` too, keyed by whatever its address reads as)."""

    def get_cache_key(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return None
        return super().get_cache_key(request, view)


class RequestSizeLimitMiddleware:
    """A body larger than ``SILENTBENCH_MAX_REQUEST_BYTES`` (by its Content-Length) is refused with a 413:
    nothing is parsed, stored or spooled to disk. Django reads no body without a Content-Length."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit = settings.SILENTBENCH_MAX_REQUEST_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # Django treats it as no body, too
        if length > limit:
            message = (f"Request too large: {length} bytes, the limit is {limit} bytes (a submission's files may "
                       f"total {settings.SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES // 1024} KiB).")
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": message}, status=413)
            return HttpResponse(message, status=413, content_type="text/plain; charset=utf-8")
        return self.get_response(request)
