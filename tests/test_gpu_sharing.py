"""Several runs on one GPU (SILENTBENCH_RUNS_PER_GPU): lease slots, memory per slot, what a worker says it offers.

As in test_routing.py, only ``nvidia-smi`` is faked (a stand-in script first on PATH); the flock leases, the
processes that hold them, the settings parser and the Celery worker are real.
"""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from benchmark_site.celery import app
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.actions.runs import do_flag_unservable_runs
from runners.actions.workers import do_register_worker
from runners.environments.host import gpu_inventory, host_capabilities
from runners.environments.routing import (
    DevicesBusy,
    Needs,
    NotEnoughDevices,
    describe_worker,
    device_lease,
    devices_for_run,
    queue_for,
    queues_for_worker,
)
from runners.models import CampaignPurpose, Run, RunStatus, Worker
from runners.plans import CampaignPlan
from runners.progress import wait_for_campaign
from runners.tasks import execute_run
from runners.worker.local import log_tail, start_worker, stop_process

from .factories import PROGRAM_PREAMBLE, MaintainerFactory, RunFactory, WorkerFactory
from .test_routing import TWO_A100, forget_host, two_gpus, version_needing  # noqa: F401 - two_gpus: the fixture
from .test_settings_parsing import child_env, run

ONE_H100 = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}]  # what nvidia-smi reports
H200 = {"index": 0, "name": "NVIDIA H200", "memory_mb": 143771}

# Holds its GPU for a while and says when, and which GPU it was given.
SLOW_REPRODUCER = PROGRAM_PREAMBLE + """
began = time.time()
report(event="start", time=began, variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
time.sleep(4)
for step in range(args.steps):
    report(event="step", step=step, rank=0, loss=1.0, time=time.time())
report(event="oracle", manifested=False, trigger_step=0, summary="which GPU, when",
       evidence={"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "began": began, "ended": time.time()})
"""


def busy(needs, gpus, locks, **options):
    """Whether a lease of ``needs`` is refused at once."""
    try:
        with device_lease(needs, gpus, locks, wait_seconds=0, **options):
            return False
    except DevicesBusy:
        return True


# --- Slots -----------------------------------------------------------------------------------------------------

def test_with_two_runs_per_gpu_two_leases_hold_one_gpu_at_once_and_a_third_waits(tmp_path, settings):
    settings.SILENTBENCH_RUNS_PER_GPU = 2
    locks = tmp_path / "locks"
    with device_lease(Needs(1), ONE_H100, locks) as first:
        with device_lease(Needs(1), ONE_H100, locks, wait_seconds=0) as second:
            assert first == second == (0,)
            assert sorted(os.listdir(locks)) == ["gpu0.lock", "gpu0.slot0.lock", "gpu0.slot1.lock"]
            assert {(locks / f"gpu0.slot{slot}.lock").read_text() for slot in (0, 1)} == {f"{os.getpid()}\n"}
            assert busy(Needs(1), ONE_H100, locks)

            got, done = [], threading.Event()

            def third():  # waits for a slot, and takes the one the first run leaves
                with device_lease(Needs(1), ONE_H100, locks, wait_seconds=30, poll_seconds=0.05) as held:
                    got.append(held)
                    done.wait(30)

            waiting = threading.Thread(target=third)
            waiting.start()
            time.sleep(0.3)
            assert not got  # still waiting: both slots are held
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == [(0,)]
        assert busy(Needs(1), ONE_H100, locks)  # the first and the third hold both slots
        done.set()
        waiting.join(10)
    with device_lease(Needs(1), ONE_H100, locks, wait_seconds=0) as again:
        assert again == (0,)


def test_a_run_needing_two_gpus_holds_a_slot_on_each_of_two_distinct_gpus(tmp_path, settings):
    settings.SILENTBENCH_RUNS_PER_GPU = 2
    locks = tmp_path / "locks"
    with device_lease(Needs(1), TWO_A100, locks) as first:
        with device_lease(Needs(1), TWO_A100, locks, wait_seconds=0) as second:
            assert (first, second) == ((0,), (1,))  # runs spread over the GPUs before they double up
            with device_lease(Needs(2), TWO_A100, locks, wait_seconds=0) as both:
                assert both == (0, 1)  # the second slot of each
                assert busy(Needs(1), TWO_A100, locks) and busy(Needs(2), TWO_A100, locks)
        # GPU 0: the first run; GPU 1: free. Two slots of GPU 0 never make a two-GPU lease.
        with device_lease(Needs(2), TWO_A100, locks, wait_seconds=0) as both:
            assert both == (0, 1)
            assert busy(Needs(2), TWO_A100, locks)
            with device_lease(Needs(1), TWO_A100, locks, wait_seconds=0) as last:
                assert last == (1,)
    settings.SILENTBENCH_RUNS_PER_GPU = 4
    with pytest.raises(NotEnoughDevices, match="needs 2 GPUs; this host has 0: NVIDIA H100 80GB HBM3 80 GB"):
        with device_lease(Needs(2), ONE_H100, locks):
            pass


def test_with_one_run_per_gpu_a_second_lease_is_refused_as_before(tmp_path, settings):
    assert settings.SILENTBENCH_RUNS_PER_GPU == 1  # the default
    locks = tmp_path / "locks"
    with device_lease(Needs(1), ONE_H100, locks) as held:
        assert held == (0,)
        assert busy(Needs(1), ONE_H100, locks)
        assert os.listdir(locks) == ["gpu0.lock"] and (locks / "gpu0.lock").read_text() == f"{os.getpid()}\n"


def test_shared_runs_never_sit_beside_a_run_that_has_the_gpu_to_itself(tmp_path):
    """Two workers on one lock directory, one with 1 run per GPU and one with 2: neither joins the other's GPU."""
    locks = tmp_path / "locks"
    with device_lease(Needs(1), ONE_H100, locks, runs=1):
        assert busy(Needs(1), ONE_H100, locks, runs=2)
    with device_lease(Needs(1), ONE_H100, locks, runs=2):
        assert busy(Needs(1), ONE_H100, locks, runs=1)
        assert not busy(Needs(1), ONE_H100, locks, runs=2)


@pytest.mark.django_db
def test_a_timed_run_has_its_gpu_to_itself_on_a_shared_worker(two_gpus, settings):  # noqa: F811
    """An overhead pair's run is timed: with runs sharing each GPU, it still waits for a GPU of its own, and none
    joins it; any other run shares."""
    settings.SILENTBENCH_RUNS_PER_GPU = 2
    version, plain = version_needing(cuda=True), do_record_detector("plain")
    timed = do_create_campaign("overhead", CampaignPlan.pairs(version, plain, [plain], 1), CampaignPurpose.OVERHEAD,
                               enqueue=False, acting_user=None).runs.first()
    shared = do_create_campaign("shared", CampaignPlan.build([version], [plain], ["fixed"], [0]),
                                acting_user=None).runs.first()
    settings.SILENTBENCH_GPU_LEASE_WAIT_SECONDS = 0
    with device_lease(Needs(2), gpu_inventory(), runs=2):  # a shared run on each GPU
        with pytest.raises(DevicesBusy):
            with devices_for_run(timed.pk):
                pass
        with devices_for_run(shared.pk) as devices:
            assert len(devices) == 1  # beside it, as SILENTBENCH_RUNS_PER_GPU allows
        execute_run(timed.pk)  # as evaluate times it, in its own process: it fails there, never goes to the broker
        timed.refresh_from_db()
        assert timed.status == RunStatus.FAILED and "a timed run needs GPUs of its own" in timed.failure_reason
    timed = do_create_campaign("overhead", CampaignPlan.pairs(version, plain, [plain], 1), CampaignPurpose.OVERHEAD,
                               enqueue=False, acting_user=None).runs.first()
    with devices_for_run(timed.pk) as devices:
        assert busy(Needs(1), [gpu for gpu in gpu_inventory() if gpu["index"] in devices], two_gpus, runs=2)


def test_a_slot_held_by_a_process_killed_by_kill_9_is_freed(tmp_path, settings):
    settings.SILENTBENCH_RUNS_PER_GPU = 2
    locks = tmp_path / "locks"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import django, time
        django.setup()
        from runners.environments.routing import Needs, device_lease
        with device_lease(Needs(1), {ONE_H100!r}, {str(locks)!r}) as one, \\
                device_lease(Needs(1), {ONE_H100!r}, {str(locks)!r}, wait_seconds=0) as two:
            print(one, two, flush=True)
            time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "benchmark_site.settings", "SILENTBENCH_RUNS_PER_GPU": "2"})
    try:
        assert holder.stdout.readline().strip() == "(0,) (0,)"  # both slots, by the setting read in the child
        assert (locks / "gpu0.slot1.lock").read_text() == f"{holder.pid}\n"
        assert busy(Needs(1), ONE_H100, locks)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with device_lease(Needs(1), ONE_H100, locks, wait_seconds=0) as one, \
            device_lease(Needs(1), ONE_H100, locks, wait_seconds=0) as two:
        assert one == two == (0,)


# --- Memory per slot -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("gpu", "runs", "served", "not_served"), [
    (ONE_H100[0], 1, "gpu1-80gb", None),
    (ONE_H100[0], 2, "gpu1-40gb", "gpu1-48gb"),  # 40 GB a run
    (H200, 2, "gpu1-48gb", "gpu1-80gb"),  # 70 GB a run
    (H200, 4, "gpu1-24gb", "gpu1-40gb"),  # 35 GB a run
])
def test_a_gpu_shared_by_k_runs_counts_as_its_memory_over_k(settings, gpu, runs, served, not_served):
    settings.SILENTBENCH_RUNS_PER_GPU = runs
    queues = queues_for_worker({"gpus": [gpu]})
    assert served in queues and not_served not in queues
    assert "gpu1" in queues and "gpu2" not in queues  # as many GPUs as before: a slot is not a GPU


@pytest.mark.django_db
def test_memory_per_slot_moves_a_48_gb_run_off_an_80_gb_gpu_shared_by_two(tmp_path, settings):
    version = version_needing(gpus=1, gpu_memory_gb=48)
    assert queue_for(version) == "gpu1-48gb"
    locks = tmp_path / "locks"
    with device_lease(Needs(1, 48), ONE_H100, locks) as held:  # one run per GPU: served
        assert held == (0,)
    assert "gpu1-48gb" in queues_for_worker({"gpus": ONE_H100})

    settings.SILENTBENCH_RUNS_PER_GPU = 2
    assert "gpu1-48gb" not in queues_for_worker({"gpus": ONE_H100})
    with pytest.raises(NotEnoughDevices, match="needs 1 GPU with 48 GB each; this host has 0: NVIDIA H100 80GB HBM3 "
                                               r"80 GB, each GPU shared by 2 runs \(SILENTBENCH_RUNS_PER_GPU\), each "
                                               r"counting on 1/2 of its memory\."):
        with device_lease(Needs(1, 48), ONE_H100, locks):
            pass
    with device_lease(Needs(1, 40), ONE_H100, locks) as one, device_lease(Needs(1, 40), ONE_H100, locks) as two:
        assert one == two == (0,)

    # The reconciler: no live worker consumes the run's queue, and the reason shows what the worker offers.
    now = timezone.now()
    WorkerFactory(hostname="shared", queues=queues_for_worker({"gpus": ONE_H100}),
                  capabilities={"gpus": ONE_H100, "runs_per_gpu": 2}, last_seen=now)
    run = RunFactory(reproducer_version=version, queue="gpu1-48gb")
    Run.objects.filter(pk=run.pk).update(queued_at=now - timedelta(minutes=20))
    assert do_flag_unservable_runs(now) == [run.pk]
    assert Run.objects.get(pk=run.pk).failure_reason == (
        "No worker can serve this run: it needs 1 GPU with 48 GB each (queue gpu1-48gb); workers seen in the last "
        "10 min: shared (1× NVIDIA H100 80GB HBM3 80 GB, 2 runs per GPU).")


# --- What a worker says it offers ------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_worker_records_and_shows_how_many_runs_share_each_gpu(two_gpus, settings, client):  # noqa: F811
    worker = do_register_worker("gpu@node1", queues_for_worker(host_capabilities()), concurrency=2)
    assert worker.capabilities["runs_per_gpu"] == 1
    assert describe_worker(worker) == "gpu@node1 (2× NVIDIA A100-SXM4-40GB 40 GB)"  # as before

    settings.SILENTBENCH_RUNS_PER_GPU = 2
    worker = do_register_worker("gpu@node1", queues_for_worker(host_capabilities()), concurrency=4)
    worker.refresh_from_db()
    assert worker.capabilities["runs_per_gpu"] == 2 and worker.gpu_count == 2 and worker.concurrency == 4
    assert describe_worker(worker) == "gpu@node1 (2× NVIDIA A100-SXM4-40GB 40 GB, 2 runs per GPU)"
    assert "gpu1-16gb" in worker.queues and "gpu1-24gb" not in worker.queues  # 20 GiB a run
    client.force_login(MaintainerFactory())
    assert "gpu@node1 (2× NVIDIA A100-SXM4-40GB 40 GB, 2 runs per GPU)" in client.get(
        reverse("runners:workers")).content.decode()


# --- The setting -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "explained"), [
    ("0", "is out of range: expected a whole number, from 1 to 64"),
    ("2.5", "is not a whole number: expected a whole number, from 1 to 64"),
    ("two", "is not a whole number"),
])
def test_runs_per_gpu_is_a_whole_number_of_at_least_one(tmp_path, value, explained):
    result = run(["manage.py", "check"], child_env(tmp_path / "var", SILENTBENCH_RUNS_PER_GPU=value))
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured: ")
    assert f"SILENTBENCH_RUNS_PER_GPU={value!r}" in last_line and explained in last_line


def test_runs_per_gpu_is_read_from_the_environment(tmp_path):
    script = "from django.conf import settings; print(settings.SILENTBENCH_RUNS_PER_GPU)"
    shared = run(["manage.py", "shell", "-c", script], child_env(tmp_path / "var", SILENTBENCH_RUNS_PER_GPU=" 3 "))
    assert shared.stdout.strip().splitlines()[-1] == "3", shared.stderr


# --- A real worker -------------------------------------------------------------------------------------------

def fake_one_h200(directory):
    """nvidia-smi of a host with one H200 (139 GiB)."""
    directory.mkdir(exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text(textwrap.dedent("""\
        #!/bin/sh
        # A stand-in for nvidia-smi on a host with one H200 (tests only).
        case "$*" in
          *--query-gpu*) echo "0, NVIDIA H200, 143771, GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d" ;;
          *-q*) printf 'Driver Version : 570.86.15\\nCUDA Version : 12.8\\nAttached GPUs : 1\\n'
                printf '    Product Name : NVIDIA H200\\n' ;;
          *) echo "NVIDIA-SMI 570.86.15" ;;
        esac
        """))
    script.chmod(0o755)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_worker_with_two_runs_per_gpu_runs_two_runs_on_one_gpu_at_once(tmp_path, monkeypatch):
    """A real `celery worker -Q auto-gpu --concurrency 2` on a one-H200 host with SILENTBENCH_RUNS_PER_GPU=2: two
    48 GB runs hold the same GPU at the same time; its queues stop at the 48 GB tier (70 GB a run)."""
    fake_one_h200(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("SILENTBENCH_GPU_SELF_CHECK", "false")  # a fake GPU: no CUDA here would pass the check
    monkeypatch.setenv("SILENTBENCH_RUNS_PER_GPU", "2")
    monkeypatch.setenv("SILENTBENCH_GPU_LOCK_DIR", str(tmp_path / "gpu-locks"))
    forget_host()
    app.control.purge()
    log = tmp_path / "worker.log"
    process = start_worker(log, queues="auto-gpu", name="sharing", concurrency=2)
    try:
        deadline = time.monotonic() + 120
        while not Worker.objects.filter(hostname__startswith="sharing@").exists():
            assert process.poll() is None and time.monotonic() < deadline, log_tail(log)
            time.sleep(0.5)
        worker = Worker.objects.get(hostname__startswith="sharing@")
        assert worker.concurrency == 2 and worker.capabilities["runs_per_gpu"] == 2
        assert "gpu1-48gb" in worker.queues and "gpu1-80gb" not in worker.queues
        assert describe_worker(worker).endswith("(1× NVIDIA H200 140 GB, 2 runs per GPU)")

        version = version_needing(files={"repro.py": SLOW_REPRODUCER}, gpus=1, gpu_memory_gb=48)
        campaign = do_create_campaign("shared", CampaignPlan.build([version], [do_record_detector("plain")],
                                                                   ["fixed"], [0, 1]), acting_user=None)
        progress = wait_for_campaign(campaign, lambda line: None, timeout=120)
        runs = list(campaign.runs.all())
        assert progress["done"] == 2, log_tail(log)
        for one in runs:
            assert one.status == RunStatus.SUCCEEDED and one.queue == "gpu1-48gb", (one.failure_reason, log_tail(log))
            assert one.oracle_evidence["visible"] == "0"
        first, second = (one.oracle_evidence for one in runs)
        assert max(first["began"], second["began"]) < min(first["ended"], second["ended"])  # at the same time
    finally:
        stop_process(process)
        forget_host()
