"""First paint of the dashboard's pages in a fresh browser (``manage.py bench_paint``, issue 16).

Each load is a new Playwright context: an empty cache, no cookies, as a first visit. The figures come
from the page's own performance timeline (paint, navigation and resource entries). Prints; never asserts.
See docs/performance.md, "First paint (issue 16)".
"""
import statistics
from dataclasses import dataclass, field

# Milliseconds from the start of the navigation; bytes as transferred (headers included, after compression).
TIMINGS_JS = """() => {
  const navigation = performance.getEntriesByType("navigation")[0];
  const paints = Object.fromEntries(performance.getEntriesByType("paint").map(entry => [entry.name, entry.startTime]));
  const resources = performance.getEntriesByType("resource");
  return {
    first_byte: navigation.responseStart,
    first_paint: paints["first-paint"] ?? null,
    first_contentful_paint: paints["first-contentful-paint"] ?? null,
    dom_content_loaded: navigation.domContentLoadedEventStart,
    load: navigation.loadEventStart,
    bytes: resources.reduce((sum, resource) => sum + resource.transferSize, navigation.transferSize),
    requests: 1 + resources.length,
  };
}"""
# (key of TIMINGS_JS, column heading), in the table's order.
TIMINGS = [("first_byte", "first byte"), ("first_paint", "first paint"),
           ("first_contentful_paint", "first contentful paint"), ("dom_content_loaded", "DOMContentLoaded"),
           ("load", "load")]


@dataclass
class PageLoads:
    """The loads of one page: each a dict as TIMINGS_JS returns it; ``status`` set when the page was not served."""
    label: str
    path: str
    loads: list = field(default_factory=list)
    status: int | None = None


def load_once(browser, url, viewport, timeout_ms=60_000):
    """Open ``url`` in a new context of ``browser``; (HTTP status, timings or None when the page was not served)."""
    context = browser.new_context(viewport=viewport)
    try:
        page = context.new_page()
        page.set_default_timeout(timeout_ms)
        response = page.goto(url, wait_until="load")
        if response is None or not response.ok:
            return (response and response.status), None
        page.wait_for_function("performance.getEntriesByType('navigation')[0].loadEventEnd > 0")
        page.wait_for_load_state("networkidle")  # what loads after the load event is counted in the bytes too
        return response.status, page.evaluate(TIMINGS_JS)
    finally:
        context.close()


def measure(browser, base_url, pages, viewport, repeat, warmup):
    """[PageLoads] of each (label, path) of ``pages``, loaded ``warmup`` times untimed (the server's
    first requests fill its caches) and then ``repeat`` times."""
    measured = []
    for label, path in pages:
        result = PageLoads(label, path)
        for attempt in range(warmup + repeat):
            status, timings = load_once(browser, base_url + path, viewport)
            if timings is None:
                result.status = status
                break
            if attempt >= warmup:
                result.loads.append(timings)
        measured.append(result)
    return measured


def median_max(values):
    """``"812 / 930"``: the median and the largest of ``values`` in whole units; ``-`` for none."""
    values = [value for value in values if value is not None]
    return f"{statistics.median(values):.0f} / {max(values):.0f}" if values else "-"


def paint_table(measured):
    """Lines of a Markdown table of [PageLoads]: each timing's median / max in ms, the median KiB and requests."""
    headings = " | ".join(f"{heading} ms" for _, heading in TIMINGS)
    lines = [f"| page | path | loads | {headings} | KiB transferred | requests |",
             "|---|---|---:|" + "---:|" * len(TIMINGS) + "---:|---:|"]
    for page in measured:
        if not page.loads:
            lines.append(f"| {page.label} | `{page.path}` | 0 | answered {page.status} |" + " |" * (len(TIMINGS) + 1))
            continue
        timings = " | ".join(median_max([load[key] for load in page.loads]) for key, _ in TIMINGS)
        kib = statistics.median(load["bytes"] for load in page.loads) / 1024
        requests = statistics.median(load["requests"] for load in page.loads)
        lines.append(f"| {page.label} | `{page.path}` | {len(page.loads)} | {timings} | {kib:,.0f} | {requests:g} |")
    return lines
