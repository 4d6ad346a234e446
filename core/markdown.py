"""Markdown as HTML, with markdown-it-py (CommonMark and tables). Raw HTML is disabled: a ``<script>`` in the
text is shown as text, never run, and markdown-it refuses ``javascript:`` and the like as link targets."""
import re

from django.utils.safestring import mark_safe
from markdown_it import MarkdownIt


def _parser():
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    # a line wrapped inside a paragraph is a space, as a reader of the Markdown sees it
    parser.add_render_rule("softbreak", lambda renderer, tokens, idx, options, env: " ")
    return parser


PARSER = _parser()


def markdown_html(text, *, compact=False):
    """``text`` as HTML. ``compact`` leaves out the line breaks between elements, as in ``<ul><li>x</li></ul>``."""
    tokens = PARSER.parse(text)
    if compact:
        for token in tokens:
            token.block = False  # markdown-it writes a line break after each block token, and only after those
    return mark_safe(PARSER.renderer.render(tokens, PARSER.options, {}))


def markdown_inline_html(text):
    """One line of ``text`` (**strong**, *emphasis*, `code`, links) as HTML, without a paragraph around it."""
    return mark_safe(PARSER.renderInline(text))


def heading_slug(text, taken):
    """GitHub's anchor for a heading ("Sign-in attempts" -> "sign-in-attempts"), numbered when ``taken`` holds
    it already, so that the links written for the repository's pages work on ours; adds it to ``taken``."""
    slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    unique, number = slug, 0
    while unique in taken:
        number += 1
        unique = f"{slug}-{number}"
    taken.add(unique)
    return unique


def document_html(text, link_target, image_source=lambda src: src):
    """A whole document as HTML: each heading gets GitHub's anchor as its ``id``, each link's ``href`` is
    what ``link_target(href)`` returns for it (None drops the link and keeps its text), and each image's ``src``
    what ``image_source(src)`` returns (None drops the image and keeps its description)."""
    tokens = PARSER.parse(text)
    taken = set()
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            inline = tokens[index + 1]
            token.attrSet("id", heading_slug("".join(child.content for child in inline.children), taken))
        elif token.type == "inline":
            _retarget_links(token, link_target)
            _retarget_images(token, image_source)
    return mark_safe(PARSER.renderer.render(tokens, PARSER.options, {}))


def _retarget_links(inline, link_target):
    kept, closing = [], []  # closing: for each open link, whether its link_close is kept
    for child in inline.children:
        if child.type == "link_open":
            href = link_target(child.attrGet("href"))
            closing.append(href is not None)
            if href is None:
                continue
            child.attrSet("href", href)
        elif child.type == "link_close" and not closing.pop():
            continue
        kept.append(child)
    inline.children = kept


def _retarget_images(inline, image_source):
    kept = []
    for child in inline.children:
        if child.type == "image":
            src = image_source(child.attrGet("src"))
            if src is None:
                kept.extend(child.children or ())  # the description, as text
                continue
            child.attrSet("src", src)
        kept.append(child)
    inline.children = kept
