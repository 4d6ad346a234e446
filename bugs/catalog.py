"""Catalog as code: load ``catalog/<BUG-ID>/bug.yaml`` and its reproducer folders, and the clean
reference pipelines in ``catalog/pipelines/<name>/``, into the database.

Loading is idempotent. Unchanged files create nothing; a changed reproducer becomes a new,
immutable version (the old one stays, with its runs).
"""
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core import audit
from core.enums import AuditAction, ReviewState
from core.untrusted import UntrustedInputError, load_yaml

from .models import (
    Bug,
    BugStatus,
    FaultLocation,
    Framework,
    Reproducer,
    ReproducerVersion,
    Reproduction,
    Track,
    validate_bug_id,
)
from .submissions import MANIFEST_NAME, manifest_problems

BUG_FIELDS = {
    "title": str, "framework": str, "framework_versions": str, "fault_location": str,
    "root_cause_category": str, "root_cause": str, "symptom": str, "fix": str,
    "detection_signal": str, "upstream_issue_url": str, "fix_url": str, "links": list,
    "reproduction": str, "catalog_only_reason": str, "reference_pipelines": list,
    "needs_cuda_original": bool, "multi_rank": bool, "source": str,
}
REQUIRED_BUG_FIELDS = ("title", "framework", "fault_location", "root_cause", "symptom", "reproduction")
CHOICES = {"framework": Framework, "fault_location": FaultLocation, "reproduction": Reproduction}
CATALOG_REVIEW_NOTE = "Catalog as code: reviewed and merged in the repository."
IGNORED_NAMES = {"__pycache__", ".pytest_cache"}
PIPELINES_DIR = "pipelines"  # catalog/pipelines/<name>/: clean reference pipelines, no bug


@dataclass
class LoadSummary:
    bugs_created: list = field(default_factory=list)
    bugs_updated: list = field(default_factory=list)
    versions_created: list = field(default_factory=list)
    unchanged: int = 0

    def __str__(self):
        return (f"{len(self.bugs_created)} bug(s) created, {len(self.bugs_updated)} updated, "
                f"{len(self.versions_created)} reproducer version(s) created, {self.unchanged} unchanged")


def content_hash(files, manifest):
    payload = json.dumps({"files": files, "manifest": manifest}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def parse_bug_yaml(path):
    """Validated bug fields from a bug.yaml; raises ValidationError naming the file and the problem."""
    data = _read_yaml(path)
    bug_id = data.get("id")
    if bug_id != path.parent.name:
        raise ValidationError(f"{path}: id {bug_id!r} must equal the folder name {path.parent.name!r}")
    validate_bug_id(bug_id)
    missing = [name for name in REQUIRED_BUG_FIELDS if not data.get(name)]
    if missing:
        raise ValidationError(f"{path}: missing {', '.join(missing)}")
    fields = {}
    for name, kind in BUG_FIELDS.items():
        value = data.get(name, kind())
        if value is None:
            value = kind()
        if not isinstance(value, kind):
            raise ValidationError(f"{path}: {name} must be a {kind.__name__}")
        fields[name] = value.strip() if isinstance(value, str) else value
    urls = [fields["upstream_issue_url"], fields["fix_url"]]
    urls += [link.get("url", "") if isinstance(link, dict) else "" for link in fields["links"]]
    for url in filter(None, urls):
        if not url.startswith(("https://", "http://")):
            raise ValidationError(f"{path}: {url!r} must be an http(s) URL")
    for name, choices in CHOICES.items():
        if fields[name] not in choices.values:
            raise ValidationError(f"{path}: {name} {fields[name]!r} is not one of {', '.join(choices.values)}")
    return bug_id, fields


def parse_reproducer_folder(folder, *, reproduces_bug=True):
    """(manifest, files) of a reproducer folder; every file is part of the version. A bug's reproducer must declare
    its oracle's symptom and a fidelity note; a clean reference pipeline (``reproduces_bug=False``) need not."""
    manifest = _read_yaml(folder / MANIFEST_NAME, max_bytes=settings.SILENTBENCH_MAX_MANIFEST_BYTES)
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not IGNORED_NAMES.intersection(path.relative_to(folder).parts):
            files[path.relative_to(folder).as_posix()] = path.read_text(encoding="utf-8")
    problems = manifest_problems(manifest, files, reproduces_bug=reproduces_bug)
    if problems:
        raise ValidationError(f"{folder}: {' '.join(problems)}")
    return manifest, files


def _full_clean(instance, path):
    """The model's own validation (lengths, URLs, choices), so SQLite refuses what PostgreSQL would."""
    try:
        instance.full_clean(validate_unique=False)
    except ValidationError as error:
        problems = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in error.message_dict.items())
        raise ValidationError(f"{path}: {problems}") from error


def _read_yaml(path, max_bytes=None):
    """A mapping, read as submitted manifests are (``core.untrusted.load_yaml``: no alias, bounded nesting)."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), max_bytes=max_bytes)
    except (OSError, UnicodeDecodeError, UntrustedInputError) as error:
        raise ValidationError(f"{path}: cannot read YAML ({error})") from error
    if not isinstance(data, dict):
        raise ValidationError(f"{path}: expected a mapping")
    return data


def reproducer_fields(manifest):
    needs = manifest.get("needs") or {}
    oracle = manifest["oracle"] if isinstance(manifest.get("oracle"), dict) else {}  # none for a clean pipeline
    return {
        "strategy": manifest["strategy"],
        "strategy_note": str(manifest.get("strategy_note", "")).strip(),
        "oracle_symptom": oracle.get("symptom", ""),
        "oracle_check": str(oracle.get("check", "")).strip(),
        "fidelity_note": str(manifest.get("fidelity_note", "")).strip(),
        "simulated": bool(manifest.get("simulated", False)),
        "historical_reason": str(manifest.get("historical_reason", "")).strip(),
        "needs_cuda": bool(needs.get("cuda", False)),
        "world_size": int(needs.get("world_size", 1)),
    }


def version_fields(manifest):
    needs = manifest.get("needs") or {}
    return {
        "entrypoint": manifest["entrypoint"],
        "default_steps": int(manifest["default_steps"]),
        "time_limit_seconds": int(needs.get("time_limit_seconds", 60)),
        "memory_mb": int(needs.get("memory_mb", 4096)),
    }


@transaction.atomic
def do_load_catalog(root, *, acting_user=None):
    """Load ``catalog/``: bugs created or updated from their bug.yaml, and each changed reproducer folder as a
    new version, approved (catalog code is reviewed as code, before it is merged). Each change leaves an
    audit record. Idempotent."""
    summary = LoadSummary()
    root = Path(root)
    for bug_yaml in sorted(root.glob("*/bug.yaml")):
        bug_id, fields = parse_bug_yaml(bug_yaml)
        bug = Bug.objects.filter(bug_id=bug_id).first() or Bug(bug_id=bug_id, status=BugStatus.APPROVED)
        if bug.pk and all(getattr(bug, name) == value for name, value in fields.items()):
            summary.unchanged += 1
        else:
            (summary.bugs_updated if bug.pk else summary.bugs_created).append(bug_id)
            for name, value in fields.items():
                setattr(bug, name, value)
            _full_clean(bug, bug_yaml)
            created = bug.pk is None
            bug.save()
            audit.record(acting_user, AuditAction.LOAD, bug,
                         f"{'added' if created else 'updated'} {bug_id} from catalog/{bug_id}/bug.yaml")
        for manifest_path in sorted(bug_yaml.parent.glob("*/reproducer.yaml")):
            _load_reproducer(bug, manifest_path.parent, summary, acting_user)
    for manifest_path in sorted((root / PIPELINES_DIR).glob("*/reproducer.yaml")):
        _load_reproducer(None, manifest_path.parent, summary, acting_user)
    return summary


def _load_reproducer(bug, folder, summary, acting_user):
    manifest, files = parse_reproducer_folder(folder, reproduces_bug=bug is not None)
    load_reproducer_version(bug, folder.name, manifest, files, summary, acting_user,
                            source=f"catalog/{folder.parent.name}/{folder.name}")


def load_reproducer_version(bug, name, manifest, files, summary, acting_user, *, source, track=Track.CATALOG):
    """The reproducer ``name`` (of ``bug``, or of none) made or brought up to date from a checked manifest, and its
    files loaded as a new approved version unless that content is already one; returns the reproducer."""
    fields = reproducer_fields(manifest)
    reproducer, created = Reproducer.objects.get_or_create(bug=bug, name=name, track=track, defaults=fields)
    if not created and any(getattr(reproducer, k) != v for k, v in fields.items()):
        Reproducer.objects.filter(pk=reproducer.pk).update(**fields)
    digest = content_hash(files, manifest)
    if reproducer.versions.filter(content_hash=digest).exists():
        summary.unchanged += 1
        return reproducer
    version = ReproducerVersion.objects.create(
        reproducer=reproducer, content_hash=digest, files=files, manifest=manifest,
        review_state=ReviewState.APPROVED, reviewed_at=timezone.now(), review_note=CATALOG_REVIEW_NOTE,
        **version_fields(manifest),
    )
    audit.record(acting_user, AuditAction.LOAD, version, f"loaded {version} from {source} ({CATALOG_REVIEW_NOTE})")
    summary.versions_created.append(f"{reproducer} @ {digest[:12]}")
    return reproducer
