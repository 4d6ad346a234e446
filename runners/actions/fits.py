"""Fit artifacts, as named actions: what a detector learned from clean reference pipelines, cached, and the one a
run is checked against."""
from django.db import IntegrityError, transaction

from ..models import FitArtifact, Run, RunStatus


def do_attach_fit(run, artifact):
    """The fit artifact a running run is checked against (recorded before it executes)."""
    run.fit_artifact = artifact
    Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(fit_artifact=artifact)


def do_store_fit_artifact(detector, key, tool_version, content, summary, fit_seconds, references):
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
