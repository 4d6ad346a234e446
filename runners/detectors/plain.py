from .base import DetectorPlugin, register


@register
class PlainBaseline(DetectorPlugin):
    """No detector: the reproducer runs untouched. The baseline for overhead."""

    name = "plain"
    version = "1"
    description = "No instrumentation at all; the baseline that overhead is measured against."
    instruments = False
