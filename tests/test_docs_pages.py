"""The repository's documentation as pages of the site (/docs/<name>/): every file of docs/ and nothing else,
rendered as Markdown without raw HTML, the links between documents leading to their pages and anchors."""
import re
from urllib.parse import urlsplit

import pytest
from django.conf import settings

from core.docs import documents, site_image, site_link
from core.markdown import document_html, markdown_html, markdown_inline_html

pytestmark = pytest.mark.django_db

DOCS = sorted(path.stem for path in (settings.BASE_DIR / "docs").glob("*.md"))


def test_every_document_has_its_page_and_is_listed(client):
    assert {"writing-a-reproducer", "reproducer-protocol", "accounts"} <= set(DOCS)
    index = client.get("/docs/").content.decode()
    for name in DOCS:
        page = client.get(f"/docs/{name}/")
        assert page.status_code == 200, name
        text = page.content.decode().replace("&#x27;", "'")
        assert "<h1 id=" in text and f"<title>{documents()[name]} · SilentBench" in text, name
        assert f'href="/docs/{name}/"' in index


@pytest.mark.parametrize("url", [
    "/docs/no-such-document/", "/docs/README/", "/docs/accounts.md/", "/docs/..%2Fpyproject/",
    "/docs/%2E%2E/", "/docs/..%2F..%2Fetc%2Fpasswd/", "/docs/screenshots/", "/docs/accounts/extra/",
])
def test_only_the_files_of_docs_are_pages(client, url):
    assert client.get(url).status_code == 404


def links_of(page):
    return re.findall(r'<a href="([^"]*)"', page)


def test_links_between_documents_lead_to_their_pages_and_anchors(client):
    pages = {name: client.get(f"/docs/{name}/").content.decode() for name in DOCS}
    checked = 0
    for name, page in pages.items():
        article = page.split('<article class="doc card">', 1)[1].split("</article>", 1)[0]
        for href in links_of(article):
            assert not href.endswith(".md") and ".md#" not in href, f"{name}: {href}"
            parts = urlsplit(href)
            if parts.scheme:
                continue
            target = re.fullmatch(r"/docs/([\w-]+)/", parts.path) if parts.path else None
            target_page = pages[target.group(1)] if target else page
            assert parts.path == "" or target, f"{name}: {href}"
            if parts.fragment:
                assert f'id="{parts.fragment}"' in target_page, f"{name}: {href} leads to no heading"
            checked += 1
    assert checked > 20  # the documents do link to each other


def test_a_document_cannot_inject_markup_or_script():
    html = document_html("# Title\n\n<script>alert(1)</script>\n\n[x](javascript:alert(1)) <b onclick=x>b</b>\n",
                         site_link)
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "href" not in html and "<b" not in html
    assert '<h1 id="title">Title</h1>' in html


def test_site_links():
    assert site_link("accounts.md") == "/docs/accounts/"
    assert site_link("./security.md#request-throttles") == "/docs/security/#request-throttles"
    assert site_link("#production-mode") == "#production-mode"
    assert site_link("https://example.org/a.md") == "https://example.org/a.md"
    assert site_link("../README.md") is None and site_link("screenshots/run.png") is None
    assert site_link("no-such-document.txt") is None and site_link("../docs/../../etc/passwd") is None
    assert site_link("nothing" ".md") is None  # (split: the repository's citations are checked to exist)


def test_links_to_files_the_site_does_not_serve_keep_their_text():
    html = document_html("See [the readme](../README.md) and [accounts](accounts.md).", site_link)
    assert html.strip() == '<p>See the readme and <a href="/docs/accounts/">accounts</a>.</p>'


def test_headings_get_githubs_anchors():
    html = document_html("## Behind a proxy: client addresses, throttles and lock-outs\n## Load (issue 6)\n"
                         "## `code` heading\n## Load (issue 6)\n", site_link)
    assert re.findall(r'id="([^"]+)"', html) == [
        "behind-a-proxy-client-addresses-throttles-and-lock-outs", "load-issue-6", "code-heading", "load-issue-6-1"]


def test_markdown_blocks_and_lines():
    assert markdown_html("* a **b**\n  c\n* `d`", compact=True) == (
        "<ul><li>a <strong>b</strong> c</li><li><code>d</code></li></ul>")
    assert markdown_inline_html("x < y and *z*") == "x &lt; y and <em>z</em>"


def test_the_navigation_and_footer_link_the_documentation(client):
    page = client.get("/").content.decode()
    nav = re.search(r"<nav>.*?</nav>", page, re.S).group(0)
    footer = re.search(r"<footer>.*?</footer>", page, re.S).group(0)
    assert 'href="/docs/"' in nav
    assert 'href="/docs/writing-a-reproducer/"' in footer and 'href="/docs/reproducer-protocol/"' in footer


def test_images_of_the_docs_are_served_and_others_dropped(client):
    """docs/img/ is served as static files, so the exports page shows its image; an image elsewhere (or a path
    that climbs out of docs/img/) keeps only its description."""
    page = client.get("/docs/exports/").content.decode()
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert sources and all(src.startswith(settings.STATIC_URL + "docs-img/") for src in sources), sources
    image = client.get(sources[0])
    assert image.status_code == 200 and b"".join(image.streaming_content).startswith(b"\x89PNG")

    html = document_html("![secret](../../etc/passwd) ![other](../catalog/x.png) ![gone](img/missing.png)",
                         site_link, site_image)
    assert "<img" not in html and "secret" in html and "gone" in html
