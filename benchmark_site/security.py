"""Request limits that hold before a view, or the CSRF check, reads a byte of the body."""
from django.conf import settings
from django.http import HttpResponse, JsonResponse


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
