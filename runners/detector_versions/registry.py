"""Which plugin runs a Detector row, and what the worker knows of each detector: read-only lookups.

Detector rows (one per plugin, version, exact config and exact code, recorded verbatim with every run) are written
by runners.actions.detectors. Built-in and submitted detectors are one kind: each Detector row names the
DetectorVersion whose code it runs. A built-in plugin's version is its module's source as the repository holds it
(``builtin_source``), recorded by the system and approved as it is recorded; a submitted one is stored by
``do_submit_detector_version`` and runs once a maintainer approved it. What differs is where the code is imported:
a built-in module is part of the worker, a submitted one is never imported there (``plugin_for``,
runners.detector_versions.submitted)."""
import hashlib
import json
import sys
from pathlib import Path

from core.enums import ReviewState

from ..detectors import DetectorPlugin, all_plugins, campaign_plugins, get_plugin
from ..models import Detector, DetectorVersion
from .submitted import SubmittedPlugin


def config_hash(config):
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def builtin_interface(plugin):
    """What the worker knows of a plugin without importing it, as ``interface_of`` reads it for a submitted one."""
    return {"integration": plugin.integration, "default_config": plugin.default_config,
            "instruments": plugin.instruments, "needs_fit": plugin.needs_fit,
            "time_limit_factor": plugin.time_limit_factor, "fit_config_keys": list(plugin.fit_config_keys),
            "analyze": type(plugin).analyze is not DetectorPlugin.analyze, "fit": plugin.needs_fit}


def builtin_source(plugin: DetectorPlugin) -> tuple[str, str]:
    """A built-in plugin's module as the repository holds it now, and its SHA-256: the code of its DetectorVersion."""
    source = Path(sys.modules[type(plugin).__module__].__file__).read_text(encoding="utf-8")
    return source, hashlib.sha256(source.encode("utf-8")).hexdigest()


def plugin_for(detector):
    """The plugin that runs a Detector row: the built-in registry's, or for submitted code a stand-in that
    runs its hooks only inside a sandbox (runners.detector_versions.submitted)."""
    if detector.code_id is not None and not detector.code.builtin:
        return SubmittedPlugin(detector.code)
    return get_plugin(detector.name)


def approved_submitted_versions():
    """The newest approved version of each submitted detector."""
    newest = {}
    for version in (DetectorVersion.objects.filter(builtin=False, review_state=ReviewState.APPROVED)
                    .order_by("name", "-reviewed_at", "-id")):
        newest.setdefault(version.name, version)
    return list(newest.values())


def _default_record_key(plugin):
    return plugin.name, plugin.version, config_hash(plugin.config())


def with_plugin_facts(detectors):
    """The Detectors, each given ``needs_fit`` and ``integration`` (drop-in or opt-in; both None when its plugin is
    no longer registered) and ``current``: whether it is its plugin's current version with the default config, what a
    campaign naming it runs."""
    plugins = all_plugins()
    current = {_default_record_key(plugin) for plugin in plugins.values()}
    newest_submitted = {version.pk for version in approved_submitted_versions()}
    for detector in detectors:
        submitted = detector.code_id is not None and not detector.code.builtin
        plugin = SubmittedPlugin(detector.code) if submitted else plugins.get(detector.name)
        detector.needs_fit = plugin.needs_fit if plugin else None
        detector.integration = plugin.integration if plugin else None
        detector.current = (detector.code_id in newest_submitted if submitted
                            else (detector.name, detector.version, detector.config_hash) in current)
    return detectors


def detector_listing(records):
    """``records`` (Detector rows) and, for each registered plugin whose current version and default config no
    row holds yet, an unsaved Detector (``pk`` None): every detector a campaign can name, without writing a row."""
    listing = list(records)
    recorded = {(detector.name, detector.version, detector.config_hash) for detector in listing}
    for plugin in campaign_plugins().values():
        if _default_record_key(plugin) not in recorded:
            config = plugin.config()
            listing.append(Detector(name=plugin.name, version=plugin.version, config=config,
                                    config_hash=config_hash(config), description=plugin.description))
    return with_plugin_facts(sorted(listing, key=lambda detector: (detector.name, detector.version,
                                                                   detector.pk is None, detector.pk or 0)))
