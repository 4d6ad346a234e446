import re

from django import template
from django.utils.html import conditional_escape, format_html_join
from django.utils.safestring import mark_safe

register = template.Library()
LIST_ITEM = re.compile(r"^\s*([-*•]|\d+[.)])\s")


@register.filter
def prose(text):
    """Paragraphs of text written with hard line wraps (the catalog's YAML): a blank line starts a
    paragraph, a list item starts a line, any other line break is a space. The text is escaped."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", str(text or "").strip()):
        lines = []
        for line in block.splitlines():
            if lines and not LIST_ITEM.match(line):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append(mark_safe("<br>".join(conditional_escape(line) for line in lines)))
    return format_html_join("", "<p>{}</p>", ((p,) for p in paragraphs if p))


@register.filter
def breakable(name):
    """An identifier (a detector's name) that may wrap after each underscore and nowhere else: escaped, with
    ``<wbr>`` after every ``_``, so a narrow column breaks ``cross_rank_consistency`` between its words."""
    return mark_safe(conditional_escape(str(name)).replace("_", "_<wbr>"))
