"""A database outage answers 503 ("try again"), not a 500 with a traceback in the logs' place.

Django reconnects by itself once the database is back (``CONN_HEALTH_CHECKS``), so the page works
again on the next request. The answer is built without the database: no session, no template that
could query it.
"""
import logging

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.templatetags.static import static
from django.utils.html import escape

logger = logging.getLogger(__name__)
MESSAGE = "The database is unavailable right now; please try again in a minute."
RETRY_AFTER_SECONDS = 30
STYLESHEET = "css/site.css"  # the site's stylesheet, as templates/base.html links it
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Unavailable · SilentBench</title>
<link rel="stylesheet" href="{stylesheet}"></head>
<body><main class="container"><h1>Temporarily unavailable</h1><p>{message}</p></main></body></html>
"""


def unavailable_page():
    """The 503 page. The stylesheet's URL comes from the static files storage, as ``{% static %}`` gives it
    (with a manifest storage, the hashed name); that reads no database, only settings and the manifest. Should
    the manifest lack it (collectstatic not run), the plain name still answers the 503, not a 500."""
    try:
        stylesheet = static(STYLESHEET)
    except ValueError:
        stylesheet = settings.STATIC_URL + STYLESHEET
    return PAGE.format(stylesheet=escape(stylesheet), message=escape(MESSAGE))


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("database unavailable for %s %s: %s", request.method, request.path, exception)
        if request.path.startswith("/api/") or "json" in request.headers.get("Accept", ""):
            response = JsonResponse({"detail": MESSAGE}, status=503)
        else:
            response = HttpResponse(unavailable_page(), status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
