"""Warm starts change nothing a run reports: every CPU reproducer of the catalog and every clean pipeline, both
variants, seed 0, under ``plain``, executed cold (``SILENTBENCH_WARM_START=False``: ``python repro.py`` in the
sandbox) and warm (forked from the zygote that has imported torch), give the same oracle verdict and bitwise the
same per-step losses. Multi-rank reproducers' ranks are forked from the warm process too (runners.executor), which
the last test sees from inside the ranks."""
import struct
import sys
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from bugs.catalog import PIPELINES_DIR, do_load_catalog
from runners.actions.detectors import do_record_detector
from runners.execution import execute
from runners.executor import Limits, Preload, run_sandboxed
from runners.models import Run
from runners.selectors import runnable_versions

from .factories import PROGRAM_PREAMBLE, ReproducerVersionFactory

pytestmark = [pytest.mark.django_db, pytest.mark.integration, pytest.mark.once]

COLD_REASON = "warm starts are turned off on this worker (SILENTBENCH_WARM_START=false)"


def cpu_reproducers():
    """"<BUG-ID>/<name>" of every CPU reproducer in catalog/, and "pipeline/<name>" of every clean pipeline."""
    found = []
    for manifest in sorted(Path(settings.SILENTBENCH_CATALOG_DIR).glob("*/*/reproducer.yaml")):
        needs = yaml.safe_load(manifest.read_text(encoding="utf-8")).get("needs") or {}
        if not needs.get("cuda"):
            owner = manifest.parent.parent.name
            found.append(f"{'pipeline' if owner == PIPELINES_DIR else owner}/{manifest.parent.name}")
    return found


REPRODUCERS = cpu_reproducers()


def catalog_version(key):
    owner, name = key.split("/")
    versions = runnable_versions(pipelines=True) if owner == "pipeline" else runnable_versions([owner])
    [version] = [version for version in versions if version.reproducer.name == name]
    return version


def exact(value):
    """A loss as its exact bits (float.hex tells -0.0 from 0.0 and compares NaN with NaN); others as repr."""
    return struct.pack("<d", value).hex() if isinstance(value, float) else repr(value)


def losses(outcome):
    return sorted((record["step"], record["rank"], exact(record["loss"])) for record in outcome.steps)


def run_once(version, variant, warm, settings, steps=None):
    settings.SILENTBENCH_WARM_START = warm
    run = Run(reproducer_version=version, detector=do_record_detector("plain"), variant=variant, seed=0,
              steps=steps or version.default_steps)
    outcome = execute(run)
    mode = "warm" if warm else "cold"
    assert outcome.succeeded, (
        f"{version.reproducer} {variant} {mode}: {outcome.failure_reason}\n{outcome.stderr[-3000:]}")
    assert outcome.execution["start"] == mode, outcome.execution
    assert outcome.execution["cold_reason"] == ("" if warm else COLD_REASON)
    return outcome


def test_the_catalog_has_cpu_reproducers_and_pipelines():
    assert len(REPRODUCERS) >= 20 and sum(key.startswith("pipeline/") for key in REPRODUCERS) >= 5
    assert "DS-1801/cpu" in REPRODUCERS  # a 2-rank one: its ranks run warm too


@pytest.mark.parametrize("key", REPRODUCERS)
def test_warm_and_cold_starts_report_the_same_run(key, settings):
    do_load_catalog(settings.SILENTBENCH_CATALOG_DIR)
    version = catalog_version(key)
    world_size = version.reproducer.world_size
    for variant in version.reproducer.variants:
        cold = run_once(version, variant, warm=False, settings=settings)
        warm = run_once(version, variant, warm=True, settings=settings)
        assert cold.oracle["manifested"] == warm.oracle["manifested"], (variant, cold.oracle, warm.oracle)
        assert cold.trigger_step == warm.trigger_step
        assert losses(cold), f"{key} {variant}: no step records"
        assert {record["rank"] for record in warm.steps} == set(range(world_size)), (variant, world_size)
        different = [(c, w) for c, w in zip(losses(cold), losses(warm)) if c != w]
        assert losses(cold) == losses(warm), f"{key} {variant}: cold and warm losses differ, first {different[:5]}"


RANKS = PROGRAM_PREAMBLE + """
import torch
import torch.multiprocessing as mp


def rank_main(rank, steps):
    # A forked rank keeps the warm process's modules; a spawned one starts a new interpreter that imports this
    # file again, as __mp_main__.
    forked = float(__name__ == "__main__")
    for step in range(steps):
        report(event="step", step=step, rank=rank, loss=float(torch.ones(3).sum()) / (step + 1), time=time.time(),
               metrics={"forked": forked})


if __name__ == "__main__":
    report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=2)
    mp.spawn(rank_main, args=(args.steps,), nprocs=2, join=True)
    report(event="oracle", manifested=False, trigger_step=1, summary="ranks")
"""


def test_the_ranks_of_a_warm_run_are_forked_from_it_and_those_of_a_cold_one_spawned(settings):
    version = ReproducerVersionFactory(files={"repro.py": RANKS}, time_limit_seconds=120, memory_mb=4096)
    for warm in (False, True):
        outcome = run_once(version, "fixed", warm=warm, settings=settings, steps=2)
        assert sorted((record["step"], record["rank"]) for record in outcome.steps) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert {record["metrics"]["forked"] for record in outcome.steps} == {float(warm)}, outcome.steps


def test_a_warm_run_inherits_a_frozen_heap_and_still_runs_every_finalizer_but_torchs(tmp_path):
    """The zygote freezes what it imported for the collector and keeps torch's library finalizers from a run's exit
    (runners.executor.zygote._settle_for_forks); the run's own finalizers and atexit functions run, and so do the
    preload's other finalizers."""
    (tmp_path / "repro.py").write_text(
        "import atexit, gc, weakref\n"
        "class Held: pass\n"
        "held = Held()\n"
        "weakref.finalize(held, print, 'the run\\'s finalizer ran')\n"
        "atexit.register(print, 'the run\\'s atexit function ran')\n"
        "print('frozen objects:', gc.get_freeze_count())\n")
    result = run_sandboxed([sys.executable, str(tmp_path / "repro.py")], tmp_path, {"HOME": str(tmp_path)},
                           Limits(time_limit_seconds=60, memory_mb=2048), warm=True,
                           preload=Preload("flushed", "tests.zygote_preloads:torch_with_a_flush_at_exit"))
    assert result.ending() is None and result.started_warm, result.stderr
    lines = result.stdout.splitlines()
    assert int(lines[0].removeprefix("frozen objects: ")) > 10_000  # torch's objects, frozen in the zygote
    assert set(lines[1:]) == {"the run's atexit function ran", "the run's finalizer ran",
                              "the preload's finalizer ran"}
