"""Request limits: the body's size before a view, or the CSRF check, reads a byte of it; who the client is,
for the API throttles and for django-axes' count of failed sign-ins."""
import ipaddress

from django.conf import settings
from rest_framework import throttling

from accounts.models import username_max_length

from .middleware import refusal


def client_ip(request):
    """The client's address, for the API's throttles (``ByClientIp`` below) and django-axes alike:
    ``REMOTE_ADDR``, or with ``SILENTBENCH_NUM_PROXIES`` (N) trusted proxies the N-th X-Forwarded-For entry
    from the end, the one the outermost proxy appended (the first, in a header of fewer entries: what the
    proxies it went through saw). An entry that is not an address gives ``REMOTE_ADDR``. N larger than the real
    chain counts an entry the client sent itself, so the client chooses its address."""
    remote_addr = request.META.get("REMOTE_ADDR")
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    proxies = settings.SILENTBENCH_NUM_PROXIES
    if not proxies or forwarded is None:
        return remote_addr
    entries = forwarded.split(",")
    try:
        return str(ipaddress.ip_address(entries[-min(proxies, len(entries))].strip()))
    except ValueError:
        return remote_addr


def attempted_username(request, credentials):
    """The username django-axes counts a failed sign-in under, cut to the longest a username can be: Django's
    login form (and the admin's) checks no length, and django-axes stores at most 255 characters."""
    username = (credentials or {}).get("username") or request.POST.get("username")
    return username[:username_max_length()] if username else None


class ByClientIp:
    """A DRF throttle that knows an anonymous caller by ``client_ip`` (DRF's own get_ident reads NUM_PROXIES
    its own way, and keys a caller by an entry that is not an address, which the caller can vary)."""

    def get_ident(self, request):
        return client_ip(request)


class AnonRateThrottle(ByClientIp, throttling.AnonRateThrottle):
    """DRF's rate for anonymous callers, by address."""


class ScopedRateThrottle(ByClientIp, throttling.ScopedRateThrottle):
    """DRF's rate of a view's ``throttle_scope`` (``token``: the password checks of /api/token/), by address
    for anonymous callers."""


class UserRateThrottle(ByClientIp, throttling.UserRateThrottle):
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
            return refusal(request, message, 413)
        return self.get_response(request)
