"""Catalog as code: idempotent loading, and a new immutable version when a reproducer changes."""
import shutil

import pytest
from django.core.exceptions import ValidationError

from bugs.catalog import do_load_catalog
from bugs.models import Bug, Reproducer, ReproducerVersion

pytestmark = pytest.mark.django_db

BUG_YAML = """\
id: TEST-1
title: A toy bug
framework: pytorch
fault_location: user
root_cause: Forgot something.
symptom: Loss looks fine.
reproduction: injected
"""
MANIFEST = """\
entrypoint: repro.py
strategy: injected
default_steps: 5
needs: {time_limit_seconds: 30, memory_mb: 1024}
oracle: {symptom: frozen_parameters, check: No parameter changed.}
fidelity_note: Upstream on GPUs; here on CPU.
"""


@pytest.fixture
def catalog(tmp_path):
    folder = tmp_path / "TEST-1" / "cpu"
    folder.mkdir(parents=True)
    (tmp_path / "TEST-1" / "bug.yaml").write_text(BUG_YAML)
    (folder / "reproducer.yaml").write_text(MANIFEST)
    (folder / "repro.py").write_text("print('v1')\n")
    return tmp_path


def test_first_load_creates_bug_reproducer_and_approved_version(catalog):
    summary = do_load_catalog(catalog)
    assert summary.bugs_created == ["TEST-1"]
    version = ReproducerVersion.objects.get()
    assert version.is_approved
    assert version.files == {"repro.py": "print('v1')\n", "reproducer.yaml": MANIFEST}
    assert version.default_steps == 5 and version.time_limit_seconds == 30
    from core.models import AuditEvent  # approved through code review: the load is on record

    [loaded] = AuditEvent.objects.about(version)
    assert loaded.action == "load" and loaded.actor is None and "reviewed and merged" in loaded.summary
    assert AuditEvent.objects.about(version.reproducer.bug).get().summary.startswith("added TEST-1")


def test_reloading_unchanged_files_creates_nothing(catalog):
    do_load_catalog(catalog)
    bug_updated = Bug.objects.get().updated_at
    summary = do_load_catalog(catalog)
    assert summary.bugs_created == [] and summary.bugs_updated == [] and summary.versions_created == []
    assert (Bug.objects.count(), Reproducer.objects.count(), ReproducerVersion.objects.count()) == (1, 1, 1)
    assert Bug.objects.get().updated_at == bug_updated


def test_changed_code_creates_a_new_version_and_keeps_the_old(catalog):
    do_load_catalog(catalog)
    first = ReproducerVersion.objects.get()
    (catalog / "TEST-1" / "cpu" / "repro.py").write_text("print('v2')\n")
    summary = do_load_catalog(catalog)
    assert len(summary.versions_created) == 1
    assert ReproducerVersion.objects.count() == 2
    first.refresh_from_db()
    assert first.files["repro.py"] == "print('v1')\n"  # never edited in place
    assert Reproducer.objects.get().latest_version().files["repro.py"] == "print('v2')\n"


def test_changed_metadata_updates_the_bug_without_a_new_version(catalog):
    do_load_catalog(catalog)
    (catalog / "TEST-1" / "bug.yaml").write_text(BUG_YAML.replace("A toy bug", "A renamed toy bug"))
    summary = do_load_catalog(catalog)
    assert summary.bugs_updated == ["TEST-1"] and summary.versions_created == []
    assert Bug.objects.get().title == "A renamed toy bug"


def test_versions_cannot_be_edited_in_place(catalog):
    do_load_catalog(catalog)
    version = ReproducerVersion.objects.get()
    version.files = {"repro.py": "print('sneaky')"}
    with pytest.raises(ValidationError, match="immutable"):
        version.save()


def test_bugs_cannot_be_deleted(catalog):
    do_load_catalog(catalog)
    with pytest.raises(ValidationError, match="deprecate"):
        Bug.objects.get().delete()


@pytest.mark.parametrize("broken, message", [
    (BUG_YAML.replace("id: TEST-1", "id: TEST-2"), "must equal the folder name"),
    (BUG_YAML.replace("framework: pytorch", "framework: theano"), "framework 'theano' is not one of"),
    (BUG_YAML.replace("symptom: Loss looks fine.\n", ""), "missing symptom"),
    ("id: [unclosed", "cannot read YAML"),
    (BUG_YAML.replace("A toy bug", "x" * 300), "title: Ensure this value has at most 200 characters"),
    (BUG_YAML + "upstream_issue_url: javascript:alert(1)\n", "must be an http\\(s\\) URL"),
])
def test_bad_bug_yaml_is_refused_with_the_reason_and_loads_nothing(catalog, broken, message):
    (catalog / "TEST-1" / "bug.yaml").write_text(broken)
    with pytest.raises(ValidationError, match=message):
        do_load_catalog(catalog)
    assert Bug.objects.count() == 0


def test_missing_entrypoint_is_refused(catalog):
    (catalog / "TEST-1" / "cpu" / "repro.py").unlink()
    with pytest.raises(ValidationError, match="entrypoint 'repro.py' is not among the files"):
        do_load_catalog(catalog)


def test_the_shipped_catalog_loads(settings, tmp_path):
    shutil.copytree(settings.SILENTBENCH_CATALOG_DIR, tmp_path / "catalog")
    summary = do_load_catalog(tmp_path / "catalog")
    assert len(summary.bugs_created) >= 30
    assert {"SO-60335387", "PT-FORUM-84911", "DS-1801"} <= set(
        ReproducerVersion.objects.values_list("reproducer__bug__bug_id", flat=True))
    bug_reproducers = Reproducer.objects.filter(bug__isnull=False)
    assert bug_reproducers.count() >= 29 and bug_reproducers.filter(needs_cuda=False).count() >= 26
    pipelines = set(Reproducer.objects.filter(bug__isnull=True).values_list("name", flat=True))
    assert {"mlp-adam", "cnn-sgd-momentum", "lstm-lm", "transformer-adamw", "autocast-bf16", "ddp-gloo"} <= pipelines
    for reproducer in Reproducer.objects.all():  # the protocol's promises that a file can break
        version = reproducer.latest_version()
        source = version.files[version.entrypoint]
        assert "--variant" in source and "--seed" in source and "--steps" in source, reproducer
        assert '"oracle"' in source and "SILENTBENCH_REPORT" in source, reproducer
        assert reproducer.strategy_note, reproducer
