"""Inductor's compile cache per reproducer version (runners/compile_cache.py): a version's later runs reuse what
its first run compiled and report the same run; what a run leaves in its cache reaches no other version; links,
files being written and files over the budget never come back."""
import os

import pytest

from bugs.catalog import do_load_catalog
from runners import compile_cache
from runners.actions.detectors import do_record_detector
from runners.execution import execute
from runners.models import Run

from .factories import PROGRAM_PREAMBLE, ReproducerVersionFactory
from .test_warm_start import catalog_version, losses

pytestmark = pytest.mark.django_db

# Writes into the cache folder that the worker names, as Inductor would, then a link to a host file.
CACHE_WRITER = PROGRAM_PREAMBLE + """
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
os.makedirs(os.path.join(cache, "fxgraph", "ab"), exist_ok=True)
seen = sorted(os.listdir(os.path.join(cache, "fxgraph", "ab")))
with open(os.path.join(cache, "fxgraph", "ab", f"entry-{args.seed}"), "w") as f:
    f.write("compiled " * 100)
os.symlink("/etc/passwd", os.path.join(cache, "fxgraph", "ab", "link"))
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
report(event="oracle", manifested=False, trigger_step=None, summary="cache writer", evidence={"seen": seen})
"""


def run(version, seed=0, variant="buggy"):
    return execute(Run(reproducer_version=version, detector=do_record_detector("plain"), variant=variant, seed=seed,
                       steps=version.default_steps))


@pytest.fixture
def cache_dir(settings, tmp_path):
    settings.SILENTBENCH_COMPILE_CACHE_DIR = tmp_path / "compile-cache"
    return settings.SILENTBENCH_COMPILE_CACHE_DIR


@pytest.mark.integration
def test_a_versions_runs_share_its_cache_and_no_other_version_sees_it(cache_dir):
    writer = ReproducerVersionFactory(files={"repro.py": CACHE_WRITER})
    first = run(writer, seed=1)
    assert first.succeeded, first.failure_reason + first.stderr
    assert first.oracle["evidence"]["seen"] == []
    assert first.execution["compile_cache"] == {"files_in": 0, "files_added": 1}  # the link stayed behind
    assert not (cache_dir / writer.content_hash / "inductor" / "fxgraph" / "ab" / "link").exists()

    second = run(writer, seed=2)
    assert second.oracle["evidence"]["seen"] == ["entry-1"]
    assert second.execution["compile_cache"] == {"files_in": 1, "files_added": 1}

    other = ReproducerVersionFactory(files={"repro.py": CACHE_WRITER + "\n# another version\n"})
    assert run(other, seed=3).oracle["evidence"]["seen"] == []


@pytest.mark.integration
def test_a_run_that_does_not_end_well_keeps_nothing(cache_dir):
    failing = ReproducerVersionFactory(files={"repro.py": CACHE_WRITER + "\nraise SystemExit(3)\n"})
    outcome = run(failing, seed=1)
    assert not outcome.succeeded and outcome.execution["compile_cache"] == {"files_in": 0, "files_added": 0}
    assert not (cache_dir / failing.content_hash).exists()


@pytest.mark.integration
def test_a_budget_of_zero_turns_the_cache_off(cache_dir, settings):
    settings.SILENTBENCH_COMPILE_CACHE_MB = 0
    writer = ReproducerVersionFactory(files={"repro.py": CACHE_WRITER})
    assert run(writer, seed=1).execution["compile_cache"] == {"files_in": 0, "files_added": 0}
    assert run(writer, seed=2).oracle["evidence"]["seen"] == []
    assert not cache_dir.exists()


def test_keep_stops_at_the_budget_and_never_replaces_a_file(cache_dir, settings, tmp_path):
    settings.SILENTBENCH_COMPILE_CACHE_MB = 1
    version = ReproducerVersionFactory()
    workdir = tmp_path / "run"
    run_cache = workdir / compile_cache.RUN_CACHE_NAME / "inductor"
    run_cache.mkdir(parents=True)
    (run_cache / "small").write_bytes(b"x" * 1000)
    (run_cache / "large").write_bytes(b"y" * (1024 * 1024 + 1))  # over the budget, whichever comes first
    assert compile_cache.keep(workdir, version) == (1, "")
    kept = cache_dir / version.content_hash / "inductor"
    assert sorted(os.listdir(kept)) == ["small"]

    (run_cache / "small").write_bytes(b"changed")
    assert compile_cache.keep(workdir, version) == (0, "")
    assert (kept / "small").read_bytes() == b"x" * 1000


def test_keep_takes_regular_files_only_never_links_fifos_or_what_a_writer_left_half_done(cache_dir, tmp_path):
    version = ReproducerVersionFactory()
    workdir = tmp_path / "run"
    run_cache = workdir / compile_cache.RUN_CACHE_NAME / "inductor"
    (run_cache / "ab").mkdir(parents=True)
    (run_cache / "ab" / "kernel.so").write_bytes(b"whole")
    secret = tmp_path / "host-secret"
    secret.write_text("secret")
    (run_cache / "ab" / "link").symlink_to(secret)
    (run_cache / "linked-folder").symlink_to(tmp_path)
    os.mkfifo(run_cache / "ab" / "fifo")
    (run_cache / "ab" / "kernel.so.123.456.tmp").write_bytes(b"half")  # Inductor's write_atomic, cut short
    (run_cache / "build_tmp").mkdir()  # a C++ build's folder, cut short
    (run_cache / "build_tmp" / "kernel.so").write_bytes(b"half")
    (run_cache / "ab" / (compile_cache.INCOMING_PREFIX + "x")).write_bytes(b"half")
    assert compile_cache.keep(workdir, version) == (1, "")
    kept = cache_dir / version.content_hash
    assert [path.relative_to(kept).as_posix() for path in kept.rglob("*") if not path.is_dir()] == [
        "inductor/ab/kernel.so"]


def test_a_file_that_cannot_be_kept_is_skipped_and_said_never_fatal(cache_dir, tmp_path):
    version = ReproducerVersionFactory()
    kept = cache_dir / version.content_hash / "inductor"
    kept.mkdir(parents=True)
    (kept / "ab").write_text("a file where the run has a folder")
    workdir = tmp_path / "run"
    run_cache = workdir / compile_cache.RUN_CACHE_NAME / "inductor"
    (run_cache / "ab").mkdir(parents=True)
    (run_cache / "ab" / "kernel.so").write_bytes(b"x")
    (run_cache / "other.so").write_bytes(b"y")
    added, error = compile_cache.keep(workdir, version)
    assert added == 1 and error.startswith("inductor/ab/kernel.so: ")
    assert (kept / "other.so").read_bytes() == b"y"


def test_seed_leaves_out_a_file_still_being_added(cache_dir, tmp_path):
    version = ReproducerVersionFactory()
    kept = cache_dir / version.content_hash / "inductor"
    kept.mkdir(parents=True)
    (kept / "done").write_text("whole")
    (kept / (compile_cache.INCOMING_PREFIX + "half")).write_text("ha")
    workdir = tmp_path / "run"
    workdir.mkdir()
    assert compile_cache.seed(workdir, version) == 1
    assert os.listdir(workdir / compile_cache.RUN_CACHE_NAME / "inductor") == ["done"]


@pytest.mark.integration
@pytest.mark.once
def test_a_compiled_reproducer_reuses_its_cache_and_reports_the_same_run(cache_dir, settings):
    """PT-197888 compiles with Inductor in every run: its second run loads the first one's graphs, and gives
    the same verdict and bitwise the same losses."""
    do_load_catalog(settings.SILENTBENCH_CATALOG_DIR)
    version = catalog_version("PT-197888/cpu")
    first, second = run(version), run(version)
    assert first.succeeded and second.succeeded, first.failure_reason + second.failure_reason
    assert first.execution["compile_cache"]["files_in"] == 0
    assert first.execution["compile_cache"]["files_added"] > 0
    assert second.execution["compile_cache"]["files_in"] == first.execution["compile_cache"]["files_added"]
    assert second.execution["compile_cache"]["files_added"] == 0  # it compiled nothing new: every graph was a hit
    assert second.oracle["manifested"] is first.oracle["manifested"] is True
    assert losses(second) == losses(first)
