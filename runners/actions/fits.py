"""Fit artifacts, as named actions: what a detector learned from clean reference pipelines, cached, and the one a
run is checked against."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction

from ..models import Detector, FitArtifact, Run, RunStatus

if TYPE_CHECKING:
    from bugs.models import ReproducerVersion


def do_attach_fit(run: Run, artifact: FitArtifact) -> None:
    """The fit artifact a running run is checked against (recorded before it executes)."""
    run.fit_artifact = artifact
    Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(fit_artifact=artifact)


def do_store_fit_artifact(detector: Detector, key: str, tool_version: str, content: str, summary: dict[str, Any],
                          fit_seconds: float, references: Iterable[ReproducerVersion]) -> FitArtifact:
    """Cache what a detector learned from its reference programs; if another worker stored the same fit
    meanwhile, theirs is kept and returned."""
    try:
        with transaction.atomic():
            artifact = FitArtifact.objects.create(detector=detector, key=key, tool_version=tool_version,
                                                  content=content, summary=summary, fit_seconds=fit_seconds)
            artifact.reference_versions.set(references)
    except IntegrityError:
        artifact = FitArtifact.objects.get(key=key)
    return artifact
