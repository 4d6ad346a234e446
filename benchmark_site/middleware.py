"""Answers that replace a 500: a database outage is a 503 ("try again"), a NUL character in the request a 400.

Django reconnects by itself once the database is back (``CONN_HEALTH_CHECKS``), so the page works
again on the next request. The answer is built without the database: no session, no template that
could query it.
"""
import logging

from django.conf import settings
from django.core.exceptions import BadRequest
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
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


class NulCharacterMiddleware:
    """A NUL character in the URL's path, its query, a cookie or a form field is a 400 that says where, before
    any view, session or sign-in throttle reads it: PostgreSQL stores no NUL in text, so a lookup with one (as
    ``GET /bugs/%00/`` made) was a 500. A middleware rather than a URL converter or each form, because it covers
    every view, the admin's and django-axes' included, and every kind of parameter in one place. The API's JSON
    bodies are checked by its parser (``core.untrusted.BoundedJSONParser``), uploaded files by
    ``bugs.submissions``. A form that cannot be parsed (a multipart body without its boundary, a form that is
    not UTF-8) is such a 400 too, logged in one line (Django's would be an HTML page and a traceback); too many
    fields or files stay Django's 400, logged as a security event."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            where = nul_character_in(request)
        except (MultiPartParserError, BadRequest) as error:
            logger.warning("unreadable form in %s %s: %s", request.method, request.path, error)
            return refusal(request, f"The request's form cannot be read: {error}", 400)
        if not where:
            return self.get_response(request)
        return refusal(request, f"The request's {where} contains a NUL character (%00), which nothing here "
                                "accepts.", 400)


def refusal(request, message, status):
    """A refusal before any view, saying ``message``: JSON on the API, as DRF answers, text elsewhere."""
    if request.path_info.startswith("/api/"):
        return JsonResponse({"detail": message}, status=status)
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")


def nul_character_in(request):
    """Where in ``request`` a NUL character is ('path', 'query parameter "q"', ...), or ''. Reading the form
    parses the body, as the CSRF check would; a body too large was refused before (RequestSizeLimitMiddleware)."""
    if "\x00" in request.path_info:
        return "path"
    cookies = [(name, [value]) for name, value in request.COOKIES.items()]
    for kind, parameters in (("query parameter", request.GET.lists()), ("cookie", cookies),
                             ("form field", request.POST.lists())):
        for name, values in parameters:
            if "\x00" in name or any("\x00" in value for value in values):
                return f"{kind} {ascii(name.replace(chr(0), ''))}"
    return ""
