"""Detector versions, as named actions: a researcher submits one, a maintainer approves or rejects it, and an
approved one is scored on the corpus by a campaign of its own."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db import transaction

from core import audit
from core.enums import AuditAction, ReviewState
from core.review import record_review

from ..detector_versions.fitting import is_fit_reference
from ..detector_versions.submissions import CheckedDetector, name_problem
from ..detectors import campaign_plugins
from ..models import Campaign, CampaignPurpose, Detector, DetectorVersion, Variant
from ..plans import CampaignPlan
from ..scoring import TWIN_CONFIG, published_seeds, scoring_versions
from .campaigns import do_create_campaign
from .detectors import do_record_detector, do_record_submitted_detector

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from bugs.models import ReproducerVersion


@transaction.atomic
def do_submit_detector_version(checked: CheckedDetector, link: str = "", *,
                               acting_user: User | None) -> DetectorVersion:
    """A researcher's detector (a runners.detector_versions.submissions.CheckedDetector), stored as a version waiting
    for review. Nothing is imported, queued or run. A new version of a submitted detector comes from its
    submitter or a maintainer (``permissions``: checked by the callers); a built-in's name is refused, as is a
    version label or code the detector already has. Raises ValidationError with every problem found."""
    problems = []
    if problem := name_problem(checked.name):
        problems.append(problem)
    earlier = DetectorVersion.objects.filter(name=checked.name, builtin=False)
    if earlier.filter(version=checked.version).exists():
        problems.append(f"{checked.name} already has a version {checked.version!r}: give the new one another "
                        f"version label (the class's version attribute).")
    if same := earlier.filter(code_hash=checked.code_hash).first():
        problems.append(f"This code is identical to {same}: nothing new to review.")
    if problems:
        raise ValidationError(problems)
    version = DetectorVersion.objects.create(
        name=checked.name, version=checked.version, code=checked.code, code_hash=checked.code_hash,
        config=checked.config, interface=checked.interface, description=checked.description, link=link,
        submitted_by=acting_user, review_state=ReviewState.PENDING)
    audit.record(acting_user, AuditAction.SUBMIT, version, f"submitted detector {version} for review")
    return version


def _review_detector_version(version: DetectorVersion, approve: bool, note: str,
                             acting_user: User | None) -> DetectorVersion:
    version = record_review(version, approve, note, acting_user)
    audit.record(acting_user, AuditAction.APPROVE if approve else AuditAction.REJECT, version,
                 f"{'approved' if approve else 'rejected'} detector {version}" + (f": {version.review_note}"
                                                                                 * bool(version.review_note)))
    return version


@transaction.atomic
def do_approve_detector_version(version: DetectorVersion, note: str = "", *,
                                acting_user: User | None) -> tuple[DetectorVersion, Campaign]:
    """A maintainer approves one exact detector version; its scoring campaign starts (``do_start_scoring``).
    Returns ``(version, campaign)``."""
    version = _review_detector_version(version, True, note, acting_user)
    return version, do_start_scoring(version, acting_user=acting_user)


@transaction.atomic
def do_reject_detector_version(version: DetectorVersion, note: str, *, acting_user: User | None) -> DetectorVersion:
    """A maintainer rejects one detector version, with a reason the submitter reads; nothing of it ever runs."""
    return _review_detector_version(version, False, note, acting_user)


def do_start_scoring(version: DetectorVersion, seeds: Iterable[int] | None = None,
                     versions: Sequence[ReproducerVersion] | None = None, *, acting_user: User | None) -> Campaign:
    """An evaluation campaign of one approved DetectorVersion (its submitted config) over every CPU reproducer and
    clean pipeline (``versions``: runners.scoring.scoring_versions), both variants, at the published
    evaluation's seeds (``seeds``: runners.scoring.published_seeds), its own fit references left out. Each clean
    pipeline also runs presented as buggy (a canary), and a submitted version's bug runs have their trusted twins
    under ``plain`` (runners.scoring.TWIN_CONFIG). Approval starts it; ``manage.py rescore`` starts it again on the
    current corpus."""
    if not version.is_approved:
        raise ValidationError(f"{version} is not approved by a maintainer; it cannot run.")
    if version.builtin and version.name not in campaign_plugins():
        raise ValidationError(f"{version.name} is run only by the sensitivity track; nothing scores it.")
    record = do_record_detector(version.name) if version.builtin else do_record_submitted_detector(version)
    if record.code_id != version.pk:
        raise ValidationError(f"{version} is no longer the repository's {version.name}; score the current one.")
    seeds = tuple(published_seeds() if seeds is None else seeds)
    versions = scoring_versions() if versions is None else versions
    if not versions:
        raise ValidationError("There is no approved CPU reproducer or clean pipeline to score a detector on yet.")
    detectors = [record]
    if not version.builtin:  # its runs are judged by their trusted twins' oracle (evaluation.integrity)
        detectors.append(do_record_detector("plain", TWIN_CONFIG, acting_user=acting_user))

    def skip(reproducer: ReproducerVersion, detector: Detector) -> bool:
        if detector is not record:  # a twin: only where there is a ground truth to give (a bug's reproducer)
            return reproducer.reproducer.is_reference_pipeline
        return is_fit_reference(reproducer, detector)

    plan = CampaignPlan.build(versions, detectors, [Variant.BUGGY, Variant.FIXED], seeds, skip=skip, canaries=True)
    return do_create_campaign(f"scoring {version.name} {version.version}", plan, CampaignPurpose.SCORING,
                              acting_user=acting_user)
