"""The Detector rows of the registered plugins: one per plugin, version and exact config, recorded
verbatim with every run."""
import hashlib
import json

from .detectors import all_plugins, get_plugin
from .models import Detector


def config_hash(config):
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def detector_record(name, overrides=None):
    """The Detector row for a plugin at its current version with this exact config."""
    plugin = get_plugin(name)
    config = plugin.config(overrides)
    detector, _ = Detector.objects.get_or_create(
        name=plugin.name, version=plugin.version, config_hash=config_hash(config),
        defaults={"config": config, "description": plugin.description},
    )
    return detector


def sync_detectors():
    """Make sure every registered plugin has a row with its default config."""
    return {name: detector_record(name) for name in all_plugins()}


def _default_record_key(plugin):
    return plugin.name, plugin.version, config_hash(plugin.config())


def with_plugin_facts(detectors):
    """The Detectors, each given ``needs_fit`` and ``integration`` (drop-in or opt-in; both None when its plugin is
    no longer registered) and ``current``: whether it is its plugin's current version with the default config, what a
    campaign naming it runs."""
    plugins = all_plugins()
    current = {_default_record_key(plugin) for plugin in plugins.values()}
    for detector in detectors:
        plugin = plugins.get(detector.name)
        detector.needs_fit = plugin.needs_fit if plugin else None
        detector.integration = plugin.integration if plugin else None
        detector.current = (detector.name, detector.version, detector.config_hash) in current
    return detectors


def detector_listing(records):
    """``records`` (Detector rows) and, for each registered plugin whose current version and default config no
    row holds yet, an unsaved Detector (``pk`` None): every detector a campaign can name, without writing a row."""
    listing = list(records)
    recorded = {(detector.name, detector.version, detector.config_hash) for detector in listing}
    for plugin in all_plugins().values():
        if _default_record_key(plugin) not in recorded:
            config = plugin.config()
            listing.append(Detector(name=plugin.name, version=plugin.version, config=config,
                                    config_hash=config_hash(config), description=plugin.description))
    return with_plugin_facts(sorted(listing, key=lambda detector: (detector.name, detector.version,
                                                                   detector.pk is None, detector.pk or 0)))
