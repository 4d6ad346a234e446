"""Detector records, as named actions: the Detector row of one plugin, version, config and code (recorded verbatim
with every run), and the DetectorVersion of a built-in plugin's module as the repository holds it.

Looking a detector up never writes (runners.detector_versions.registry); naming one for a campaign records its row,
here."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from core import audit
from core.enums import AuditAction, ReviewState

from ..detector_versions.registry import builtin_interface, builtin_source, config_hash
from ..detector_versions.submitted import SubmittedPlugin
from ..detectors import DetectorPlugin, campaign_plugins, get_plugin
from ..models import Detector, DetectorVersion

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def do_record_builtin_detector_version(plugin: DetectorPlugin, *, acting_user: User | None = None) -> DetectorVersion:
    """The approved DetectorVersion of a built-in plugin: its module's source as the repository holds it now,
    recorded as the system's on first use (built-in and submitted detectors are one kind of record)."""
    source, digest = builtin_source(plugin)
    version = DetectorVersion.objects.filter(name=plugin.name, version=plugin.version, code_hash=digest).first()
    if version is not None:
        return version
    with transaction.atomic():
        version, created = DetectorVersion.objects.get_or_create(
            name=plugin.name, version=plugin.version, code_hash=digest,
            defaults={"code": source, "interface": builtin_interface(plugin), "description": plugin.description,
                      "builtin": True, "review_state": ReviewState.APPROVED, "reviewed_at": timezone.now()})
        if created:
            audit.record(acting_user, AuditAction.RECORD, version, f"recorded built-in detector {version}")
    return version


def _record(name: str, version: str, config: dict, description: str, code: DetectorVersion) -> Detector:
    """The Detector row of exactly this code and config. A row recorded before detector versions existed (no
    code) with the same name, version and config is the built-in's: it is given its code, not duplicated."""
    digest = config_hash(config)
    if code.builtin and not Detector.objects.filter(name=name, version=version, config_hash=digest,
                                                    code=code).exists():
        legacy = Detector.objects.filter(name=name, version=version, config_hash=digest, code=None).first()
        if legacy is not None:
            Detector.objects.filter(pk=legacy.pk, code=None).update(code=code)
    detector, _ = Detector.objects.select_related("code").get_or_create(
        name=name, version=version, config_hash=digest, code=code,
        defaults={"config": config, "description": description})
    return detector


def do_record_detector(name: str, overrides: dict | None = None, *, acting_user: User | None = None) -> Detector:
    """The Detector row for a built-in plugin at its current version and code, with this exact config."""
    plugin = get_plugin(name)
    return _record(plugin.name, plugin.version, plugin.config(overrides), plugin.description,
                   do_record_builtin_detector_version(plugin, acting_user=acting_user))


def do_record_submitted_detector(version: DetectorVersion, overrides: dict | None = None, *,
                                 acting_user: User | None = None) -> Detector:
    """The Detector row of a submitted DetectorVersion, with its submitted config (and ``overrides``)."""
    plugin = SubmittedPlugin(version)
    return _record(version.name, version.version, plugin.config({**version.config, **(overrides or {})}),
                   version.description, version)


def do_sync_detectors(*, acting_user: User | None = None) -> dict[str, Detector]:
    """Make sure every registered plugin has a row with its default config."""
    return {name: do_record_detector(name, acting_user=acting_user) for name in campaign_plugins()}
