"""Each run's CPU threads: its share of the worker's cores, set for OpenMP, MKL and torch before the program runs,
warm or cold; more where the reproducer declares more; recorded on the run and shown on its page."""
import sys

import pytest
from django.urls import reverse

from bugs.submissions import manifest_problems
from runners.environments import host
from runners.execution import execute, run_threads
from runners.executor import Limits, Preload, run_sandboxed
from runners.tasks import execute_run

from .factories import ReproducerVersionFactory, RunFactory

pytestmark = pytest.mark.django_db

THREADS_SEEN = '''
import json, os, numpy, torch
from threadpoolctl import threadpool_info
pools = {f"{pool['user_api']}:{pool['internal_api']}": pool["num_threads"] for pool in threadpool_info()}
with open(os.environ["SILENTBENCH_REPORT"], "a") as report:
    report.write(json.dumps({"event": "oracle", "manifested": False, "evidence": {
        "torch": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
        "mkl": os.environ.get("MKL_NUM_THREADS"), "pools": pools}}) + "\\n")
'''


@pytest.fixture
def concurrency():
    """The worker's concurrency, as its set-up shares the cores; back to 1 after the test."""
    yield host.share_cores_among
    host.share_cores_among(1)


def version_with(**needs):
    manifest = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 3,
                "needs": {"time_limit_seconds": 60, "memory_mb": 1024, **needs}}
    return ReproducerVersionFactory(manifest=manifest, files={"repro.py": THREADS_SEEN})


def test_a_run_gets_its_share_of_the_cores_and_may_declare_more(concurrency, settings, monkeypatch):
    monkeypatch.setattr(host, "usable_cores", lambda: 16)  # the arithmetic of a 16-core GPU node
    concurrency(14)
    assert run_threads(version_with()) == 1
    assert run_threads(version_with(threads=4)) == 4
    assert run_threads(version_with(threads=64)) == 16  # never more than the cores
    concurrency(2)
    assert run_threads(version_with()) == 8
    assert run_threads(version_with(threads=4)) == 8  # a declaration asks for more, never for fewer
    settings.SILENTBENCH_RUN_THREADS = 3  # the operator's figure replaces the share
    assert run_threads(version_with()) == 3


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_the_budget_reaches_openmp_mkl_and_torch_before_the_program_runs(start, concurrency, settings):
    """torch's own default is one thread per core; the budget is 1 here, set in a warm start's fork (torch was
    imported before the run was known) and in a cold start's environment."""
    assert host.usable_cores() >= 2, "one core: the budget cannot differ from torch's default"
    concurrency(host.usable_cores())
    needs = {"environment": {"SOMETHING": "1"}} if start == "cold" else {}
    outcome = execute(RunFactory(reproducer_version=version_with(**needs)))
    assert outcome.succeeded, outcome.failure_reason
    assert outcome.execution["start"] == start
    evidence = outcome.oracle["evidence"]
    assert (evidence["torch"], evidence["omp"], evidence["mkl"]) == (1, "1", "1")
    assert "blas:openblas" in evidence["pools"] and set(evidence["pools"].values()) == {1}, evidence["pools"]
    assert outcome.execution["threads"] == 1


def test_a_preload_that_wraps_torch_does_not_take_the_budget_through_its_wrapper(tmp_path):
    """TrainCheck's instrumented zygote wraps torch's functions, and its tracer fails when called before the program
    names its trace folder: a warm child sizes torch's pool with torch's own function, taken before the preload
    (every fit of TrainCheck failed so on a worker whose runs had a thread budget)."""
    (tmp_path / "repro.py").write_text("import torch\nprint(torch.get_num_threads())\n")
    limits = Limits(time_limit_seconds=60, memory_mb=2048, threads=2)  # the zygote's own is 1
    result = run_sandboxed([sys.executable, str(tmp_path / "repro.py")], tmp_path, {"HOME": str(tmp_path)}, limits,
                           warm=True, preload=Preload("traced", "tests.zygote_preloads:torch_with_every_call_traced"))
    assert result.ending() is None, result.stderr
    assert result.started_warm and result.stdout.strip() == "2"


def test_the_run_page_shows_the_threads(client, concurrency):
    concurrency(host.usable_cores())
    run = RunFactory(reproducer_version=version_with())
    execute_run(run.pk)
    page = client.get(reverse("runners:run", args=[run.pk])).content.decode()
    assert '<dd id="threads">1 (OpenMP, MKL, torch' in page


@pytest.mark.parametrize("threads", [-1, "4", 2.5, True])
def test_a_declared_thread_count_must_be_a_whole_number(threads):
    manifest = {"entrypoint": "repro.py", "needs": {"threads": threads}}
    assert any("needs.threads must be a whole number" in problem
               for problem in manifest_problems(manifest, {"repro.py": "pass"}))


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_shares_its_cores_among_its_concurrent_runs(tmp_path):
    """``celery worker --concurrency 2`` on this machine's cores: each run gets cores // 2 threads, from the worker's
    set-up through its pool processes to the run's torch."""
    from benchmark_site.celery import app
    from runners.actions.campaigns import do_create_campaign
    from runners.actions.detectors import do_record_detector
    from runners.plans import CampaignPlan
    from runners.progress import wait_for_campaign
    from runners.worker.local import log_tail, start_worker, stop_process

    app.control.purge()
    expected = max(1, host.usable_cores() // 2)
    campaign = do_create_campaign("threads", CampaignPlan.build([version_with()], [do_record_detector("plain")],
                                                               ["buggy"], [0]), acting_user=None)
    log = tmp_path / "worker.log"
    process = start_worker(log, name="threads", concurrency=2)
    try:
        progress = wait_for_campaign(campaign, lambda line: None, timeout=240)
        assert progress["done"] == progress["total"] == 1, log_tail(log)
    finally:
        stop_process(process)
    run = campaign.runs.get()
    assert run.execution["threads"] == expected, (run.failure_reason, log_tail(log))
    assert run.oracle_evidence["torch"] == expected and set(run.oracle_evidence["pools"].values()) == {expected}
