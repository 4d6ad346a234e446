"""``{{ value|record_table }}``: a JSON record (a detector's config and summary, an oracle's evidence, how a run
executed, an alarm's evidence) as a key / value table rather than a Python dict's text. Nested records become
nested tables, lists of plain values one line; every key and value is escaped."""
import json

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()
MAX_DEPTH = 4  # deeper than this, a value is shown as compact JSON
MAX_ITEMS = 50  # of one record or list; the rest is counted
MAX_CELLS = 500  # of the whole table, nested ones included: a run's report may hold megabytes of records
MAX_JSON_CHARS = 500  # of a value shown as compact JSON
MAX_TEXT_CHARS = 2000  # of one plain value


@register.filter
def record_table(value):
    return _html(value, 0, [MAX_CELLS])


@register.filter
def without_keys(record, keys):
    """``record`` without the keys (comma-separated) that the page shows otherwise."""
    omitted = set(keys.split(","))
    return {key: value for key, value in (record or {}).items() if key not in omitted}


def _html(value, depth, budget):
    """``value`` as HTML; ``budget`` holds the cells the whole table may still show."""
    if isinstance(value, dict) and depth < MAX_DEPTH:
        if not value:
            return format_html('<span class="muted">{}</span>', "(empty)")
        items = list(value.items())[:_take(budget, len(value))]
        rows = format_html_join("", '<tr><th scope="row">{}</th><td>{}</td></tr>',
                                ((key, _html(item, depth + 1, budget)) for key, item in items))
        more = _more(len(value), len(items), '<tr><td colspan="2">{}</td></tr>')
        return format_html('<table class="record">{}{}</table>', rows, more)
    if isinstance(value, list) and depth < MAX_DEPTH:
        if not value:
            return format_html('<span class="muted">{}</span>', "(none)")
        shown = value[:_take(budget, len(value))]
        if all(not isinstance(item, (dict, list)) for item in shown):
            return format_html("{}{}", ", ".join(_scalar(item) for item in shown), _more(len(value), len(shown), " {}"))
        items = format_html_join("", "<li>{}</li>", ((_html(item, depth + 1, budget),) for item in shown))
        return format_html('<ul class="record">{}{}</ul>', items, _more(len(value), len(shown), "<li>{}</li>"))
    if isinstance(value, (dict, list)):
        text = json.dumps(value, separators=(",", ":"), default=str)
        return text if len(text) <= MAX_JSON_CHARS else text[:MAX_JSON_CHARS] + " …"
    return _scalar(value)


def _take(budget, count):
    """How many of ``count`` items to show: at most MAX_ITEMS, and what is left of the table's budget."""
    taken = min(count, MAX_ITEMS, budget[0])
    budget[0] -= taken
    return taken


def _scalar(value):
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value)
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + " …"


def _more(count, shown, form):
    return format_html(form, f"… {count - shown} more") if count > shown else ""
