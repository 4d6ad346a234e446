"""``{{ value|record_table }}``: a JSON record (a detector's config and summary, an oracle's evidence, how a run
executed, an alarm's evidence) as a key / value table rather than a Python dict's text. Nested records become
nested tables, lists of plain values one line; every key and value is escaped."""
import json

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()
MAX_DEPTH = 4  # deeper than this, a value is shown as compact JSON
MAX_ITEMS = 50  # of one record or list; the rest is counted


@register.filter
def record_table(value):
    return _html(value, 0)


@register.filter
def without_keys(record, keys):
    """``record`` without the keys (comma-separated) that the page shows otherwise."""
    omitted = set(keys.split(","))
    return {key: value for key, value in (record or {}).items() if key not in omitted}


def _html(value, depth):
    if isinstance(value, dict) and depth < MAX_DEPTH:
        if not value:
            return format_html('<span class="muted">{}</span>', "(empty)")
        items = list(value.items())
        rows = format_html_join("", '<tr><th scope="row">{}</th><td>{}</td></tr>',
                                ((key, _html(item, depth + 1)) for key, item in items[:MAX_ITEMS]))
        more = _more(len(items), '<tr><td colspan="2">{}</td></tr>')
        return format_html('<table class="record">{}{}</table>', rows, more)
    if isinstance(value, list) and depth < MAX_DEPTH:
        if not value:
            return format_html('<span class="muted">{}</span>', "(none)")
        shown = value[:MAX_ITEMS]
        if all(not isinstance(item, (dict, list)) for item in shown):
            return format_html("{}{}", ", ".join(_scalar(item) for item in shown), _more(len(value), " {}"))
        items = format_html_join("", "<li>{}</li>", ((_html(item, depth + 1),) for item in shown))
        return format_html('<ul class="record">{}{}</ul>', items, _more(len(value), "<li>{}</li>"))
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return _scalar(value)


def _scalar(value):
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _more(count, form):
    return format_html(form, f"… {count - MAX_ITEMS} more") if count > MAX_ITEMS else ""
