"""The repository's documentation (docs/*.md) as pages of the site, rendered with core.markdown. A name is looked
up among the files that docs/ holds, and only there: no path is ever built from a URL."""
import functools
import posixpath
import re

from django.conf import settings
from django.templatetags.static import static
from django.urls import reverse

from .markdown import document_html

DOC_LINK = re.compile(r"docs/(?P<name>[\w-]+)\.md(?P<fragment>#.*)?")


@functools.cache
def documents():
    """``{name: title}`` of every docs/<name>.md, the title being its first heading; read once per process, as
    the documents ship with the code."""
    found = {}
    for path in sorted((settings.BASE_DIR / "docs").glob("*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        found[path.stem] = next((line[2:].strip() for line in lines if line.startswith("# ")), path.stem)
    return found


def document_page_html(name):
    """docs/<name>.md as HTML, its links to other documents pointing at their pages; ``name`` is one of
    ``documents()``."""
    text = (settings.BASE_DIR / "docs" / f"{name}.md").read_text(encoding="utf-8")
    return document_html(text, site_link, site_image)


def site_link(href):
    """Where a link of a document leads on the site: web addresses and anchors as written, another document to
    its page, and None (no link) for the repository's other files, which the site does not serve."""
    if re.match(r"[a-z][a-z0-9+.-]*:|#", href):
        return href
    match = DOC_LINK.fullmatch(posixpath.normpath(posixpath.join("docs", href)))
    if match and match["name"] in documents():
        return reverse("docs:page", args=[match["name"]]) + (match["fragment"] or "")
    return None


def site_image(src):
    """Where an image of a document is served: the files of docs/img/ are static files (``docs-img/``, see
    STATICFILES_DIRS); any other image is dropped, keeping its description."""
    path = posixpath.normpath(posixpath.join("docs", src))
    folder, name = posixpath.split(path)
    if folder == "docs/img" and name in {image.name for image in (settings.BASE_DIR / "docs" / "img").glob("*")}:
        return static(f"docs-img/{name}")
    return None
