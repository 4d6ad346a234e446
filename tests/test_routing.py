"""Routing by need: capabilities, queues, runs nobody can serve, GPU leases and CUDA_VISIBLE_DEVICES.

The GPU is the one edge this machine cannot run, so exactly one thing is faked: ``nvidia-smi``. The
``two_gpus`` fixture puts a shell script of that name first on PATH that prints what a host with two
A100-SXM4-40GB cards prints (``-q`` and ``--query-gpu``). Everything else is real: the database, the
Celery worker process and its signals, the flock leases, the sandbox and the reproducer it runs.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from benchmark_site.celery import app
from runners.actions.campaigns import do_create_campaign
from runners.actions.detectors import do_record_detector
from runners.actions.runs import do_flag_unservable_runs
from runners.actions.workers import current_environment, do_register_worker
from runners.environments.host import forget_gpus, gpu_inventory, host_capabilities, host_facts
from runners.environments.routing import (
    DevicesBusy,
    Needs,
    NotEnoughDevices,
    device_lease,
    needs_of_queue,
    queue_for,
    queue_name,
    queues_for_worker,
)
from runners.models import Campaign, Run, RunStatus, Worker
from runners.plans import CampaignPlan
from runners.progress import wait_for_campaign
from runners.tasks import execute_run
from runners.worker.local import log_tail, start_worker, stop_process

from .factories import PROGRAM_PREAMBLE, ReproducerFactory, ReproducerVersionFactory, RunFactory, WorkerFactory

SMI_QUERY = """\
0, NVIDIA A100-SXM4-40GB, 40960, GPU-5f2a9d1c-0b7e-4c1e-9d1b-1a2b3c4d5e6f
1, NVIDIA A100-SXM4-40GB, 40960, GPU-8c7d6e5f-4a3b-2c1d-0e9f-8a7b6c5d4e3f
"""
SMI_Q = """\

==============NVSMI LOG==============

Timestamp                                 : Tue Mar  4 10:12:31 2025
Driver Version                            : 550.54.15
CUDA Version                              : 12.4

Attached GPUs                             : 2
GPU 00000000:07:00.0
    Product Name                          : NVIDIA A100-SXM4-40GB
    Product Brand                         : NVIDIA
    Product Architecture                  : Ampere
    GPU UUID                              : GPU-5f2a9d1c-0b7e-4c1e-9d1b-1a2b3c4d5e6f
    VBIOS Version                         : 92.00.36.00.01
    FB Memory Usage
        Total                             : 40960 MiB
        Used                              : 0 MiB
        Free                              : 40325 MiB
    Temperature
        GPU Current Temp                  : {temp} C

GPU 00000000:0F:00.0
    Product Name                          : NVIDIA A100-SXM4-40GB
    Product Brand                         : NVIDIA
    Product Architecture                  : Ampere
    GPU UUID                              : GPU-8c7d6e5f-4a3b-2c1d-0e9f-8a7b6c5d4e3f
    VBIOS Version                         : 92.00.36.00.01
    FB Memory Usage
        Total                             : 40960 MiB
        Used                              : 0 MiB
        Free                              : 40325 MiB
    Temperature
        GPU Current Temp                  : 29 C
"""

# Reports the GPUs it was given, through the reproducer protocol.
VISIBLE_DEVICES_REPRODUCER = PROGRAM_PREAMBLE + """
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    report(event="step", step=step, rank=0, loss=1.0, time=time.time())
report(event="oracle", manifested=False, trigger_step=0, summary="which GPUs",
       evidence={"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER")})
"""

TWO_A100 = [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960},
            {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960}]


def fake_nvidia_smi(directory, temperature=31):
    directory.mkdir(exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        # A stand-in for nvidia-smi on a host with two A100-SXM4-40GB (tests only).
        case "$*" in
          *--query-gpu*) cat <<'EOF'
        {textwrap.indent(SMI_QUERY, '        ').strip()}
        EOF
          ;;
          *-q*) cat <<'EOF'
        {textwrap.indent(SMI_Q.format(temp=temperature), '        ').lstrip()}
        EOF
          ;;
          *) echo "NVIDIA-SMI 550.54.15"; exit 0 ;;
        esac
        """))
    script.chmod(0o755)
    return script


def forget_host():
    forget_gpus()
    host_facts.cache_clear()


@pytest.fixture
def two_gpus(tmp_path, monkeypatch, settings):
    """This host has two A100 40 GB, as far as nvidia-smi says; GPU leases live in tmp_path."""
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    settings.SILENTBENCH_GPU_LOCK_DIR = tmp_path / "gpu-locks"
    forget_host()
    yield tmp_path / "gpu-locks"
    forget_host()


def version_needing(files=None, **needs):
    manifest = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 3,
                "needs": {"time_limit_seconds": 60, "memory_mb": 1024, **needs}}
    reproducer = ReproducerFactory(needs_cuda=bool(needs.get("cuda")))
    return ReproducerVersionFactory(reproducer=reproducer, manifest=manifest,
                                    files=files or {"repro.py": VISIBLE_DEVICES_REPRODUCER})


# --- Which queue, which worker --------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("needs, queue", [
    ({}, "cpu"),
    ({"gpus": 0, "cuda": False}, "cpu"),
    ({"cuda": True}, "gpu1"),  # CUDA means one GPU at least
    ({"cuda": True, "gpus": 1}, "gpu1"),
    ({"gpus": 2}, "gpu2"),
    ({"cuda": True, "gpus": 4}, "gpu4"),
    ({"gpus": 1, "gpu_memory_gb": 40}, "gpu1-40gb"),
    ({"gpus": 1, "gpu_memory_gb": 30}, "gpu1-40gb"),  # rounded up to a tier
    ({"gpus": 2, "gpu_memory_gb": 70}, "gpu2-80gb"),
    ({"gpus": 1, "gpu_memory_gb": 120}, "gpu1-120gb"),  # past the largest tier: the need itself
    ({"gpus": 0, "gpu_memory_gb": 40}, "cpu"),  # memory per GPU means nothing without a GPU
])
def test_a_run_goes_to_the_queue_of_what_it_declares(needs, queue):
    version = version_needing(**needs)
    assert queue_for(version) == queue
    campaign = do_create_campaign("c", CampaignPlan.build([version], [do_record_detector("plain")], ["buggy"], [0]),
                                  enqueue=False, acting_user=None)
    assert list(campaign.runs.values_list("queue", flat=True)) == [queue]


def test_a_worker_consumes_every_queue_it_can_serve_and_no_other():
    mixed = {"gpus": [{"index": i, "name": "H100", "memory_mb": 81559} for i in (0, 1)]
             + [{"index": i, "name": "L4", "memory_mb": 23034} for i in (2, 3)]}
    queues = queues_for_worker(mixed)
    assert queues[:5] == ["cpu", "gpu1", "gpu2", "gpu3", "gpu4"]
    assert {"gpu4-16gb", "gpu4-24gb", "gpu2-40gb", "gpu2-80gb"} <= set(queues)  # an L4 reports 22.5 GiB
    assert not {"gpu3-40gb", "gpu3-80gb", "gpu5"} & set(queues)
    assert queues_for_worker({"gpus": []}) == ["cpu"]
    assert queues_for_worker(mixed, cpu=False)[0] == "gpu1"
    # One rule, both directions: a worker consumes a need's queue exactly when it has enough GPUs for it.
    for gpus in range(0, 6):
        for memory in (0, 16, 24, 40, 48, 80):
            needs = Needs(gpus, memory if gpus else 0)
            able = sum(1 for gpu in mixed["gpus"] if not memory or gpu["memory_mb"] >= 0.92 * memory * 1024)
            assert (queue_name(needs) in queues) == (gpus <= able), needs
            assert needs_of_queue(queue_name(needs)) == needs
    assert needs_of_queue("gpu") == Needs(1)  # the one-GPU queue of earlier releases


@pytest.mark.django_db
def test_capabilities_come_from_nvidia_smi(two_gpus):
    worker = do_register_worker("gpu@node1", queues_for_worker(host_capabilities()), concurrency=2)
    worker.refresh_from_db()
    assert (worker.gpu_count, worker.gpu_model, worker.gpu_memory_mb) == (2, "NVIDIA A100-SXM4-40GB", 40960)
    assert worker.cuda == "12.4" and worker.torch.startswith("2.13") and worker.concurrency == 2
    assert worker.memory_mb > 0 and worker.registered_at is not None
    assert [gpu["uuid"] for gpu in worker.capabilities["gpus"]][0].startswith("GPU-5f2a")
    assert {"cpu", "gpu1", "gpu2", "gpu2-40gb"} <= set(worker.queues) and "gpu1-48gb" not in worker.queues


def test_a_worker_started_with_cuda_visible_devices_offers_only_those(two_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    forget_host()
    assert [gpu["index"] for gpu in gpu_inventory()] == [1]


@pytest.mark.django_db
def test_the_environment_records_nvidia_smi_and_the_run_page_shows_it_escaped(two_gpus, client):
    environment = current_environment()
    assert environment.gpu == "NVIDIA A100-SXM4-40GB" and environment.gpu_driver == "550.54.15"
    assert environment.cuda == "12.4" and "GPU Current Temp" in environment.facts["nvidia_smi"]
    # Temperatures and clocks change between calls; the same hardware stays one environment.
    fake_nvidia_smi(two_gpus.parent / "bin", temperature=77)
    forget_host()
    assert host_facts()["nvidia_smi"] != environment.facts["nvidia_smi"]
    assert current_environment() == environment

    environment.facts["nvidia_smi"] += "\n    Product Name : <script>alert(1)</script>"
    environment.save()
    run = RunFactory(environment=environment)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "nvidia-smi -q" in page and "Driver Version" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page


# --- Runs nobody can serve --------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_run_no_worker_can_serve_fails_with_the_reason(client):
    now = timezone.now()
    WorkerFactory(hostname="a", queues=["cpu"], last_seen=now - timedelta(minutes=1))
    WorkerFactory(hostname="b", queues=queues_for_worker({"gpus": TWO_A100[:1]}), capabilities={"gpus": TWO_A100[:1]},
                  last_seen=now)
    WorkerFactory(hostname="gone", queues=queues_for_worker({"gpus": TWO_A100 * 2}),
                  capabilities={"gpus": TWO_A100 * 2}, last_seen=now - timedelta(hours=1))
    detector = do_record_detector("plain")
    plan = CampaignPlan.build([version_needing(gpus=2, gpu_memory_gb=40), version_needing(gpus=1)], [detector],
                              ["buggy"], [0])
    campaign = do_create_campaign("<b>mixed</b>", plan, enqueue=False, acting_user=None)
    two, one = (campaign.runs.get(queue=queue) for queue in ("gpu2-40gb", "gpu1"))
    campaign.runs.update(queued_at=now - timedelta(minutes=20))
    fresh = RunFactory(campaign=campaign, reproducer_version=two.reproducer_version, queue="gpu2-40gb")  # in grace

    assert do_flag_unservable_runs(now) == [two.pk]
    two.refresh_from_db()
    assert two.status == RunStatus.FAILED and two.finished_at == now
    assert two.failure_reason == (
        "No worker can serve this run: it needs 2 GPUs with 40 GB each (queue gpu2-40gb); workers seen in the "
        "last 10 min: a (cpu); b (1× NVIDIA A100-SXM4-40GB 40 GB).")
    assert Run.objects.get(pk=one.pk).status == RunStatus.QUEUED  # b serves it
    assert Run.objects.get(pk=fresh.pk).status == RunStatus.QUEUED
    assert do_flag_unservable_runs(now) == []  # nothing twice

    page = client.get(campaign.get_absolute_url()).content.decode()
    assert "No worker can serve this run: it needs 2 GPUs with 40 GB each" in page

    Run.objects.filter(pk=one.pk).update(status=RunStatus.SUCCEEDED)
    assert do_flag_unservable_runs(now + timedelta(hours=1)) == [fresh.pk]  # nobody seen for an hour
    assert "workers seen in the last 10 min: none." in Run.objects.get(pk=fresh.pk).failure_reason
    assert Campaign.objects.get(pk=campaign.pk).completed_at is not None  # its last run ended here


# --- GPU leases and CUDA_VISIBLE_DEVICES -------------------------------------------------------------

def test_leases_never_share_a_gpu(tmp_path):
    locks = tmp_path / "locks"
    with device_lease(Needs(1), TWO_A100, locks) as first, device_lease(Needs(1), TWO_A100, locks) as second:
        assert first != second and set(first) | set(second) == {0, 1}
        with pytest.raises(DevicesBusy):
            with device_lease(Needs(1), TWO_A100, locks, wait_seconds=0):
                pass
    with device_lease(Needs(2), TWO_A100, locks, wait_seconds=0) as both:
        assert both == (0, 1)
        with pytest.raises(DevicesBusy):
            with device_lease(Needs(1), TWO_A100, locks, wait_seconds=0):
                pass
    with device_lease(Needs(0), TWO_A100, locks) as none:
        assert none == ()
    with pytest.raises(NotEnoughDevices, match="needs 3 GPUs; this host has 0: NVIDIA A100-SXM4-40GB 40 GB"):
        with device_lease(Needs(3), TWO_A100, locks):
            pass
    with pytest.raises(NotEnoughDevices, match="needs 1 GPU with 80 GB each"):
        with device_lease(Needs(1, 80), TWO_A100, locks):
            pass


def test_a_lease_held_by_another_process_ends_with_it_even_by_kill_9(tmp_path):
    locks = tmp_path / "locks"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import django, sys, time
        django.setup()
        from runners.environments.routing import Needs, device_lease
        with device_lease(Needs(2), {TWO_A100!r}, {str(locks)!r}) as held:
            print(held, flush=True)
            time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "benchmark_site.settings"})
    try:
        assert holder.stdout.readline().strip() == "(0, 1)"
        with pytest.raises(DevicesBusy):
            with device_lease(Needs(1), TWO_A100, locks, wait_seconds=0):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with device_lease(Needs(2), TWO_A100, locks, wait_seconds=0) as held:
        assert held == (0, 1)


@pytest.mark.django_db
def test_cuda_visible_devices_reaches_the_reproducer_through_the_sandbox(two_gpus):
    cpu_run = RunFactory(reproducer_version=version_needing(), queue="cpu")
    gpu2_run = RunFactory(reproducer_version=version_needing(gpus=2), queue="gpu2")
    gpu1_run = RunFactory(reproducer_version=version_needing(gpus=1), queue="gpu1")
    execute_run(cpu_run.pk)
    execute_run(gpu2_run.pk)
    with device_lease(Needs(1), gpu_inventory(), two_gpus) as held:  # another run holds one GPU
        execute_run(gpu1_run.pk)
    for run in (cpu_run, gpu2_run, gpu1_run):
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, run.failure_reason
        assert run.oracle_evidence["order"] == "PCI_BUS_ID"
    assert cpu_run.oracle_evidence["visible"] == ""  # a CPU run sees no GPU at all
    assert gpu2_run.oracle_evidence["visible"] == "0,1"
    assert gpu1_run.oracle_evidence["visible"] == str(1 - held[0])  # the free one


@pytest.mark.django_db
def test_a_gpu_run_on_a_worker_without_the_gpus_fails_with_the_reason(two_gpus):
    run = RunFactory(reproducer_version=version_needing(gpus=4), queue="gpu4")
    execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.exit_code is None
    assert run.failure_reason.startswith("This worker cannot serve the run: it needs 4 GPUs; this host has 0: ")


@pytest.mark.django_db
@override_settings(SILENTBENCH_GPU_LEASE_WAIT_SECONDS=0)
def test_a_gpu_run_whose_gpus_stay_busy_goes_back_to_its_queue(two_gpus):
    app.control.purge()
    run = RunFactory(reproducer_version=version_needing(gpus=1), queue="gpu1")
    with device_lease(Needs(2), gpu_inventory(), two_gpus):
        execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.attempts == 0
    with app.connection_for_read() as connection:
        message = connection.SimpleQueue("gpu1").get(timeout=5)
        assert message.payload[0] == [run.pk]
        message.ack()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_worker_started_with_queues_auto_registers_and_pins_its_runs(two_gpus, tmp_path, monkeypatch):
    """A real `celery worker -Q auto` process derives its queues from (fake) nvidia-smi, registers them on
    start, and runs a two-GPU run with CUDA_VISIBLE_DEVICES=0,1."""
    app.control.purge()
    log = tmp_path / "worker.log"
    monkeypatch.setenv("SILENTBENCH_GPU_SELF_CHECK", "false")  # fake GPUs: no CUDA here would pass the check
    process = start_worker(log, queues="auto", name="routing")
    try:
        deadline = time.monotonic() + 120
        while not Worker.objects.filter(hostname__startswith="routing@").exists():
            assert process.poll() is None and time.monotonic() < deadline, log_tail(log)
            time.sleep(0.5)
        worker = Worker.objects.get(hostname__startswith="routing@")
        assert worker.queues == sorted(queues_for_worker(host_capabilities()))
        assert worker.gpu_count == 2 and worker.concurrency == 1

        campaign = do_create_campaign("pinned",
                                      CampaignPlan.build([version_needing(gpus=2, gpu_memory_gb=40)],
                                                         [do_record_detector("plain")], ["fixed"], [0]),
                                      acting_user=None)
        progress = wait_for_campaign(campaign, lambda line: None, timeout=120)
        run = campaign.runs.get()
        assert progress["done"] == 1 and run.status == RunStatus.SUCCEEDED, (run.failure_reason, log_tail(log))
        assert run.queue == "gpu2-40gb" and run.worker == worker
        assert run.oracle_evidence["visible"] == "0,1"
    finally:
        stop_process(process)


def test_queues_auto_gpu_leaves_cpu_runs_to_others_and_keeps_other_names(two_gpus, settings):
    from types import SimpleNamespace

    from celery import Celery

    from runners.worker.startup import consume_auto_queues

    settings.SILENTBENCH_GPU_SELF_CHECK = False  # fake GPUs: no CUDA here would pass the check (test_gpu_check.py)
    worker_app = Celery("routing-test", set_as_current=False)
    worker_app.amqp.queues.select(["auto-gpu", "nightly"])
    consume_auto_queues(SimpleNamespace(app=worker_app))
    assert list(worker_app.amqp.queues.consume_from) == queues_for_worker(host_capabilities(), cpu=False) + ["nightly"]
    assert "cpu" not in worker_app.amqp.queues.consume_from


def test_worker_queues_command_prints_the_same_queues(two_gpus, capsys):
    from django.core.management import call_command

    call_command("worker_queues", "--no-cpu")
    assert capsys.readouterr().out.strip() == ",".join(queues_for_worker(host_capabilities(), cpu=False))


def test_a_submitted_manifest_declares_gpu_memory_as_a_number():
    from bugs.submissions import manifest_problems

    manifest = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 3, "needs": {"gpus": 1},
                "oracle": {"symptom": "loss", "check": "x"}, "fidelity_note": "x"}
    assert not manifest_problems({**manifest, "needs": {"gpus": 1, "gpu_memory_gb": 40}}, {"repro.py": ""})
    assert any("gpu_memory_gb" in problem for problem in
               manifest_problems({**manifest, "needs": {"gpus": 1, "gpu_memory_gb": "lots"}}, {"repro.py": ""}))
