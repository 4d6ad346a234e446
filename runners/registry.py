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
