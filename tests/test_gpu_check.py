"""A GPU node checks itself before it takes GPU runs: the CUDA probe runs sealed on each GPU, and a GPU that fails is
not offered, with the reason in the log, on the Worker row and on the workers page.

There is no GPU here. The GPUs are fake (a stand-in nvidia-smi, tests/test_routing.py), and the probe, which runs
for real and sealed, fails on them as it would on a node whose driver does not load. The one test of a GPU that
passes replaces the probe's result (the edge of what cannot run here); ``bin/gpu-check`` runs it on a real GPU.
"""
import time
from types import SimpleNamespace

import pytest
from celery import Celery
from django.urls import reverse

from benchmark_site.celery import app
from runners.environments import gpu_check
from runners.environments.gpu_check import probe_gpu, verdict
from runners.environments.host import gpu_inventory, host_capabilities
from runners.environments.routing import queues_for_worker
from runners.models import Worker
from runners.worker import startup
from runners.worker.local import log_tail, start_worker, stop_process

from .factories import MaintainerFactory, UserFactory
from .test_routing import two_gpus  # noqa: F401 - the fixture: two fake A100s
from .test_sandbox import sealed  # noqa: F401 - the fixture seals every run

GOOD = {"cuinit": 0, "torch": "2.11.0+cu130", "cuda_available": True, "name": "NVIDIA H200", "matmul_error": 2e-16,
        "free_mb": 140000, "total_mb": 143771, "error": ""}


@pytest.mark.parametrize("facts, reason", [
    (GOOD, ""),
    ({**GOOD, "cuinit": 304, "cuda_available": False}, "cuInit returned 304 (CUDA_ERROR_OPERATING_SYSTEM)"),
    ({**GOOD, "cuinit": None, "error": "the CUDA driver library does not load: libcuda.so.1"},
     "the CUDA driver library does not load: libcuda.so.1"),
    ({**GOOD, "cuda_available": False, "error": "torch.cuda.is_available() is False"},
     "torch.cuda.is_available() is False"),
    ({**GOOD, "matmul_error": 0.5}, "a matrix product on the GPU differs from the CPU's by 0.5 (relative)"),
    ({**GOOD, "matmul_error": float("nan")}, "a matrix product on the GPU differs from the CPU's by nan (relative)"),
    ({**GOOD, "free_mb": 0}, "the GPU has no free memory"),
])
def test_a_gpu_passes_only_when_cuda_starts_computes_right_and_has_memory(facts, reason):
    assert verdict(facts) == reason


def test_the_probe_runs_sealed_and_says_why_a_gpu_fails(two_gpus):  # noqa: F811
    [first, _] = gpu_inventory()
    check = probe_gpu(first, sealed=True)
    assert (check["index"], check["sealed"], check["passed"]) == (0, True, False)
    assert check["reason"].startswith("the CUDA driver library does not load"), check


@pytest.mark.django_db
def test_a_worker_withholds_a_gpu_that_fails_and_offers_the_one_that_passes(two_gpus, monkeypatch,  # noqa: F811
                                                                           settings):
    def probe(gpu, **options):  # GPU 0 passes (a stand-in: no GPU here), GPU 1 fails as the probe reports it
        facts = GOOD if gpu["index"] == 0 else {**GOOD, "cuinit": 304}
        return {"index": gpu["index"], "name": gpu["name"], "sealed": True, "passed": not verdict(facts),
                "reason": verdict(facts), "facts": facts, "seconds": 1.0}

    monkeypatch.setattr(gpu_check, "probe_gpu", probe)
    settings.SILENTBENCH_GPU_SELF_CHECK = True
    worker_app = Celery("gpu-check-test", set_as_current=False)
    worker_app.amqp.queues.select(["auto", "gpu2", "gpu1.py3.11-torch2.11.0"])  # named: kept where servable
    try:
        startup.consume_auto_queues(SimpleNamespace(app=worker_app))
        assert [gpu["index"] for gpu in gpu_inventory()] == [0]  # leases take only the GPU that passed
        consumed = list(worker_app.amqp.queues.consume_from)
        assert consumed == [*queues_for_worker(host_capabilities()), "gpu1.py3.11-torch2.11.0"]
        assert "gpu1" in consumed and "gpu2" not in consumed
        assert [check["passed"] for check in startup._gpu_checks] == [True, False]
    finally:
        startup._gpu_checks.clear()  # this process is no worker: nothing of the check stays for other tests


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_on_gpus_that_fail_serves_cpu_and_shows_why(two_gpus, tmp_path, client):  # noqa: F811
    """``celery worker -Q auto-gpu`` on a node whose two GPUs fail the probe: it offers no GPU queue, serves cpu
    instead, and its Worker row and the workers page say why."""
    app.control.purge()
    log = tmp_path / "worker.log"
    process = start_worker(log, queues="auto-gpu", name="selfcheck")
    try:
        deadline = time.monotonic() + 180
        while not Worker.objects.filter(hostname__startswith="selfcheck@").exists():
            assert process.poll() is None and time.monotonic() < deadline, log_tail(log)
            time.sleep(0.5)
    finally:
        stop_process(process)
    worker = Worker.objects.get(hostname__startswith="selfcheck@")
    assert worker.queues == ["cpu"] and worker.gpu_count == 0, log_tail(log)
    assert [(check["index"], check["sealed"], check["passed"]) for check in worker.gpu_checks] == [
        (0, True, False), (1, True, False)]
    assert "is not offered: the CUDA driver library does not load" in log.read_text()
    client.force_login(UserFactory())
    assert client.get(reverse("runners:workers")).status_code == 403  # only those who may queue runs
    maintainer = MaintainerFactory()
    client.force_login(maintainer)
    page = client.get(reverse("runners:workers")).content.decode()
    assert "GPU 1" in page and "<strong>not offered</strong>: the CUDA driver library does not load" in page


@pytest.mark.django_db
def test_gpu_check_prints_every_probe_and_fails_on_a_node_whose_gpus_fail(two_gpus):  # noqa: F811
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    with pytest.raises(CommandError, match="not ready for GPU runs"):
        call_command("gpu_check", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("node ") and "2 GPU(s) NVIDIA A100-SXM4-40GB" in lines[0]
    assert lines[1].startswith("driver    550.54.15") and "sandbox   runs sealed" in lines[2]
    probes = [line.split()[:3] for line in lines if line.startswith("          ")]
    assert probes == [["0", "no", "FAILED:"], ["0", "yes", "FAILED:"], ["1", "no", "FAILED:"], ["1", "yes", "FAILED:"]]
    assert lines[-1].startswith("runs      none: no GPU passed its sealed probe")


@pytest.mark.django_db
def test_a_reproducer_is_verified_only_at_every_buggy_run_manifested_and_no_fixed_one():
    from runners.management.commands.gpu_check import as_expected, tallies
    from runners.models import RunStatus

    from .factories import ReproducerVersionFactory, RunFactory

    def runs_of(buggy, fixed, status=None):
        version = ReproducerVersionFactory()
        return [RunFactory(reproducer_version=version, variant=variant, seed=seed, manifested=shown,
                           status=status if (variant, seed) == ("fixed", 2) and status else RunStatus.SUCCEEDED)
                for variant, shown_by_seed in (("buggy", buggy), ("fixed", fixed))
                for seed, shown in enumerate(shown_by_seed)]

    verified, flaky, leaky = (runs_of([True] * 3, [False] * 3), runs_of([True, False, True], [False] * 3),
                              runs_of([True] * 3, [False, True, False]))
    broken, late = (runs_of([True] * 3, [False] * 3, RunStatus.FAILED),
                    runs_of([True] * 3, [False] * 3, RunStatus.QUEUED))
    found = tallies(verified + flaky + leaky + broken + late)
    assert [(t["buggy"], t["buggy_runs"], t["fixed"], t["fixed_runs"], t["verdict"]) for t in found.values()] == [
        (3, 3, 0, 3, "verified"), (2, 3, 0, 3, "not verified"), (3, 3, 1, 3, "not verified"),
        (3, 3, 0, 3, "runs failed"), (3, 3, 0, 3, "runs not finished in time (--timeout)")]
    assert all(map(as_expected, verified))
    assert not any(all(map(as_expected, runs)) for runs in (flaky, leaky, broken, late))
