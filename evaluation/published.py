"""Published evaluations: the snapshot of a stored evaluation that ships with the app.

``manage.py publish_evaluation`` names a stored evaluation (its ``published_id``: its date and its tables' digest)
and writes its snapshot to ``evaluation/published/<published_id>.json.gz``; ``manage.py load_results`` (which the
quickstart runs) loads every snapshot there into a database, so that a fresh install shows the published numbers
before it has run anything. A snapshot holds what the pages read: the evaluation's stored tables, parameters and
device (CPU or GPU), its campaigns, every run with its alarms (as lists of ``ALARM_FIELDS``), step records and
oracle verdict (not its stdout and stderr, nor the TrainCheck fit artifacts, which are large: the fits table keeps
their figures), the reproducer versions and detector code they ran (by content, so that a catalog changed since
still shows what ran), the environments, and the stability checks of those versions. Loading it twice changes
nothing.
"""
from __future__ import annotations

import gzip
import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from runners.models import ALARM_FIELDS, RUN_RECORD_FIELDS

if TYPE_CHECKING:
    from .models import Evaluation

FORMAT = 1
PUBLISHED_DIR = Path(settings.BASE_DIR) / "evaluation" / "published"

# What a snapshot keeps of each row (the rest is either derived, a key rewritten on load, or left out above); a
# run's and an alarm's are runners.models.RUN_RECORD_FIELDS and ALARM_FIELDS.
CAMPAIGN_FIELDS = ("name", "purpose", "created_at", "parameters", "completed_at")
VERSION_FIELDS = ("content_hash", "files", "manifest", "entrypoint", "default_steps", "time_limit_seconds",
                  "memory_mb", "created_at")
DETECTOR_CODE_FIELDS = ("name", "version", "code", "code_hash", "config", "interface", "description", "link",
                        "builtin", "created_at")
ENVIRONMENT_FIELDS = ("fingerprint", "host", "cpu", "gpu", "gpu_driver", "cuda", "python", "torch", "facts")
STABILITY_FIELDS = ("seeds", "buggy_manifested", "fixed_manifested", "failed_runs", "verdict", "checked_at")


class SnapshotError(ValueError):
    """A snapshot that cannot be loaded, with the reason in words."""


def published_id_for(evaluation: Evaluation) -> str:
    """The name an evaluation is published under: the day it was stored and the first 8 digits of its tables'
    digest, so that two databases holding the same snapshot cite it alike."""
    return f"{evaluation.created_at:%Y-%m-%d}.{evaluation.tables_digest[:8]}"


def snapshot_path(published_id: str, directory: Path = PUBLISHED_DIR) -> Path:
    return directory / f"{published_id}.json.gz"


def write_snapshot(snapshot: dict[str, Any], path: Path) -> Path:
    """Write ``snapshot`` as gzipped JSON, byte for byte the same for the same snapshot (no time in the header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), default=_isoformat).encode()
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as stream:
        stream.write(data)
    return path


def _isoformat(value: Any) -> str:
    """Times in full (DjangoJSONEncoder keeps only milliseconds, which would move a loaded run's times)."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def read_snapshot(path: Path) -> dict[str, Any]:
    """A snapshot read back, checked for the parts loading needs; SnapshotError says what is wrong."""
    try:
        with gzip.open(path, "rb") as stream:
            snapshot = json.loads(stream.read())
    except (OSError, EOFError, ValueError) as error:
        raise SnapshotError(f"{path.name}: not a gzipped JSON snapshot ({error})") from error
    if not isinstance(snapshot, dict) or snapshot.get("format") != FORMAT:
        found = snapshot.get("format") if isinstance(snapshot, dict) else type(snapshot).__name__
        raise SnapshotError(f"{path.name}: snapshot format {found!r}, this code reads format {FORMAT}")
    missing = [key for key in ("published_id", "evaluation", "campaigns", "reproducer_versions", "detectors",
                               "environments", "runs", "stability") if key not in snapshot]
    if missing:
        raise SnapshotError(f"{path.name}: missing {', '.join(missing)}")
    return snapshot


def published_snapshots(directory: Path = PUBLISHED_DIR) -> list[Path]:
    """The snapshots that ship, oldest first (their names start with their date)."""
    return sorted(directory.glob("*.json.gz"))


def fields_of(row: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(row, name) for name in names}


def snapshot_of(evaluation: Evaluation) -> dict[str, Any]:
    """The snapshot of a published evaluation (see the module's docstring)."""
    from runners.models import StabilityCheck

    campaigns = {"evaluation": evaluation.campaign, "overhead": evaluation.overhead_campaign}
    versions: dict[int, dict[str, Any]] = {}
    detectors: dict[int, dict[str, Any]] = {}
    environments: dict[int, dict[str, Any]] = {}
    runs = []
    for role, campaign in campaigns.items():
        if campaign is None:
            continue
        for run in (campaign.runs.select_related("reproducer_version__reproducer__bug", "detector__code",
                                                 "environment")
                    .prefetch_related("alarms").order_by("id")):
            version = run.reproducer_version
            if version.pk not in versions:
                reproducer = version.reproducer
                versions[version.pk] = {"key": len(versions), "bug": reproducer.bug.bug_id if reproducer.bug else None,
                                        "reproducer": reproducer.name, **fields_of(version, VERSION_FIELDS)}
            detector = run.detector
            if detector.pk not in detectors:
                detectors[detector.pk] = {
                    "key": len(detectors), "name": detector.name, "version": detector.version,
                    "config": detector.config, "config_hash": detector.config_hash,
                    "description": detector.description,
                    "code": fields_of(detector.code, DETECTOR_CODE_FIELDS) if detector.code else None}
            environment = run.environment
            if environment is not None and environment.pk not in environments:
                environments[environment.pk] = {"key": len(environments),
                                                **fields_of(environment, ENVIRONMENT_FIELDS)}
            runs.append({
                "campaign": role, "reproducer_version": versions[version.pk]["key"],
                "detector": detectors[detector.pk]["key"],
                "environment": environments[environment.pk]["key"] if environment is not None else None,
                **fields_of(run, RUN_RECORD_FIELDS),
                "alarms": [[getattr(alarm, name) for name in ALARM_FIELDS]
                           for alarm in sorted(run.alarms.all(), key=lambda alarm: alarm.pk)]})
    stability = [{"reproducer_version": versions[check.reproducer_version_id]["key"],
                  **fields_of(check, STABILITY_FIELDS)}
                 for check in StabilityCheck.objects.filter(reproducer_version__in=list(versions)).order_by("id")]
    return {
        "format": FORMAT, "published_id": evaluation.published_id,
        "published_at": evaluation.published_at,
        "evaluation": {"created_at": evaluation.created_at, "parameters": evaluation.parameters,
                       "tables": evaluation.tables, "tables_digest": evaluation.tables_digest,
                       "wall_seconds": evaluation.wall_seconds, "device": evaluation.device},
        "campaigns": {role: fields_of(campaign, CAMPAIGN_FIELDS) for role, campaign in campaigns.items()
                      if campaign is not None},
        "reproducer_versions": list(versions.values()), "detectors": list(detectors.values()),
        "environments": list(environments.values()), "runs": runs, "stability": stability,
    }
