from .base import DROP_IN, DetectorPlugin, register


@register
class PlainBaseline(DetectorPlugin):
    """No detector: the reproducer runs untouched. The baseline for overhead."""

    name = "plain"
    version = "1"
    integration = DROP_IN  # the baseline: it observes nothing, and the program runs as written
    description = "No instrumentation at all; the baseline that overhead is measured against."
    instruments = False
