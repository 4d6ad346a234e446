"""State changes of the sensitivity track, each on behalf of a user (or of none, for a command)."""
from dataclasses import dataclass, field

from django.db import transaction

from bugs.catalog import LoadSummary, load_reproducer_version
from bugs.models import Reproducer, Track
from bugs.submissions import manifest_problems

from .models import Mutant
from .mutants import mutant_programs


@dataclass
class MutantLoadSummary:
    created: list = field(default_factory=list)
    updated: list = field(default_factory=list)
    versions: LoadSummary = field(default_factory=LoadSummary)

    def __str__(self):
        return (f"{len(self.created)} mutant(s) created, {len(self.updated)} updated, "
                f"{len(self.versions.versions_created)} reproducer version(s) created, "
                f"{self.versions.unchanged} unchanged")


@transaction.atomic
def do_load_mutants(catalog_root, *, acting_user=None):
    """Every mutant of sensitivity/spec.yaml as a reproducer of the sensitivity track, approved as catalog code is
    (the operators, the harness and the spec are reviewed as code). Each pipeline must be loaded first
    (bugs.catalog.do_load_catalog). Idempotent: unchanged code makes no new version."""
    summary = MutantLoadSummary()
    pipelines = {pipeline.name: pipeline for pipeline in Reproducer.objects.reference_pipelines()}
    for mutant in mutant_programs(catalog_root):
        if mutant.pipeline.name not in pipelines:
            raise ValueError(f"{mutant.mutant_id}: the pipeline {mutant.pipeline.name} is not loaded: "
                             f"run manage.py load_catalog first")
        if problems := manifest_problems(mutant.manifest, mutant.files):
            raise ValueError(f"{mutant.mutant_id}: {' '.join(problems)}")
        reproducer = load_reproducer_version(None, mutant.mutant_id, mutant.manifest, mutant.files,
                                             summary.versions, acting_user, source="sensitivity/spec.yaml",
                                             track=Track.SENSITIVITY)
        fields = {"reproducer": reproducer, "pipeline": pipelines[mutant.pipeline.name],
                  "operator": mutant.operator.name, "fault_class": mutant.operator.fault_class,
                  "mirrors": mutant.operator.mirrors, "severity": mutant.severity,
                  "severity_level": mutant.severity_level, "persistence": mutant.persistence,
                  "trigger_step": mutant.trigger_step, "rank": mutant.rank, "parameters": mutant.parameters,
                  "steps": mutant.steps}
        row = Mutant.objects.filter(mutant_id=mutant.mutant_id).first()
        if row is None:
            Mutant.objects.create(mutant_id=mutant.mutant_id, **fields)
            summary.created.append(mutant.mutant_id)
        elif any(getattr(row, name) != value for name, value in fields.items()):
            Mutant.objects.filter(pk=row.pk).update(**fields)
            summary.updated.append(mutant.mutant_id)
    return summary
