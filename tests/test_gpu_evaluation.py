"""The GPU evaluation (issue 29): its observers watch each run together, in one bundle, and every table, filter and
list counts a bundle's run as each member's own; a GPU evaluation is set apart from the CPU one on every page."""
import re
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.http import QueryDict

from bugs.models import Bug, ReproducerVersion
from evaluation.actions import (
    do_load_published_evaluation,
    do_publish_evaluation,
    do_store_evaluation,
    run_tables,
)
from evaluation.models import Device, Evaluation
from evaluation.overhead import do_measure_overhead
from evaluation.published import read_snapshot
from evaluation.results import Results, latest_evaluation
from evaluation.tables import flakiness_table, judged_runs
from runners.actions.detectors import do_record_detector
from runners.management.commands import gpu_check as gpu_check_command
from runners.models import Run, StabilityCheck

from .factories import (
    AlarmFactory,
    BugFactory,
    EnvironmentFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    StabilityCheckFactory,
)
from .helpers import said, stored_evaluation, table
from .test_routing import two_gpus  # noqa: F401 - the fixture: two fake A100s

pytestmark = pytest.mark.django_db

RUN_TABLES = ("detection", "false_positives", "latency", "flakiness")


def without_run_ids(tables):
    """The run tables with the columns that name runs (a bundle's members share one) left out."""
    return {name: [{key: value for key, value in row.items() if key != "run"} for row in tables[name]]
            for name in RUN_TABLES}


def test_a_bundles_run_counts_in_every_table_as_each_members_own_run():
    apart = stored_evaluation()
    bundled = stored_evaluation(bundled=True, bugs=("BUN-1", "BUN-2"))
    assert bundled.campaign.runs.count() < apart.campaign.runs.count()  # one run where there were two
    renamed = {name: [{**row, "bug": row["bug"].replace("BUN", "PUB")} if row.get("bug") else row for row in rows]
               for name, rows in without_run_ids(run_tables(bundled.campaign.runs.all())).items()}
    assert renamed == without_run_ids(run_tables(apart.campaign.runs.all()))
    detectors = {row["detector__name"] for row, _, _ in judged_runs(bundled.campaign.runs.all())}
    assert detectors == {"nan_inf", "grad_health", "differential"}  # the bundle itself is never a row


def test_the_filter_and_the_run_lists_find_a_members_runs_inside_its_bundle(client):
    evaluation = stored_evaluation(bundled=True)
    narrowed = Results(QueryDict(f"evaluation={evaluation.pk}&detector=grad_health"))
    assert set(narrowed.table("detection")["detector"]) == {"grad_health"}
    assert list(narrowed.run_latencies()["detector"]) == ["grad_health"]  # nan_inf's detections left out
    listed = client.get("/results/runs/", {"evaluation": evaluation.pk, "detector": "grad_health",
                                           "variant": "buggy", "verdict": "detected"}).content.decode()
    rows = table(listed, "runs")
    assert [row["Bug"].split("/")[0] for row in rows] == ["PUB-1"]
    missed = table(client.get("/results/runs/", {"evaluation": evaluation.pk, "detector": "grad_health",
                                                 "variant": "buggy", "verdict": "missed"}).content.decode(), "runs")
    assert [row["Bug"].split("/")[0] for row in missed] == ["PUB-2"]
    # its row is judged by grad_health's alarms: nan_inf's, in the same run, detected it
    assert (missed[0]["Detector"], missed[0]["Alarms"], missed[0]["Detected"]) == (
        "bundle (grad_health's alarms)", "0", "missed")
    assert rows[0]["Detected"] == "at step 4"


H200 = {"gpu": "NVIDIA H200", "gpu_driver": "580.95.05", "cuda": "13.0", "torch": "2.11.0+cu130"}


def gpu_evaluation(**options):
    environment = EnvironmentFactory(host="gpu-node", torch=H200["torch"], gpu="1 x NVIDIA H200 (143771 MiB)",
                                     gpu_driver=H200["gpu_driver"], cuda=H200["cuda"])
    return stored_evaluation(bundled=True, environment=environment, bugs=("GPU-1", "GPU-2"), device="gpu",
                             **H200, **options)


def test_the_pages_show_the_cpu_evaluation_by_default_and_the_gpu_one_apart(client):
    cpu = stored_evaluation(torch="2.13.0+cpu")
    gpu = gpu_evaluation()  # the newer: still not "the latest" of the pages, which is the CPU one
    for page in ("/results/", "/leaderboard/"):
        shown = client.get(page).content.decode()
        assert f"?evaluation={cpu.pk}" in shown and f"?evaluation={gpu.pk}" in shown  # the switch links to both
        assert "CPU, torch 2.13.0+cpu" in shown
        on_gpu = client.get(page, {"evaluation": gpu.pk}).content.decode()
        assert "NVIDIA H200 (driver 580.95.05, CUDA 13.0), torch 2.11.0+cu130" in on_gpu
    bugs_shown = {evaluation: [row["Bug / reproducer"].split()[0] for row in table(client.get(
        "/results/", {"evaluation": evaluation.pk}).content.decode(), "detection-matrix")] for evaluation in (cpu, gpu)}
    assert bugs_shown[cpu] == ["PUB-1", "PUB-2"] and bugs_shown[gpu] == ["GPU-1", "GPU-2"], bugs_shown
    assert [row["Bug / reproducer"].split()[0] for row in table(client.get("/results/").content.decode(),
                                                                "detection-matrix")] == bugs_shown[cpu]
    board = client.get("/leaderboard/", {"evaluation": gpu.pk}).content.decode()
    row = next(row for row in table(board, "leaderboard") if row["Detector"] == "nan_inf")
    assert row["Bugs caught beyond the fixed twin"] == "2/2"  # a bundle member ranked from its bundle's runs


def test_without_a_gpu_evaluation_the_pages_say_how_to_make_one(client):
    stored_evaluation()
    shown = client.get("/results/").content.decode()
    assert "GPU: no evaluation yet" in shown and "bin/gpu-check --evaluate" in shown


def test_a_bug_that_only_gpus_run_shows_the_gpu_evaluations_detections(client):
    stored_evaluation()
    gpu = gpu_evaluation()
    page = client.get(Bug.objects.get(bug_id="GPU-1").get_absolute_url()).content.decode()
    assert f"evaluation <a href=\"{gpu.get_absolute_url()}\">{gpu.label}</a>" in page.replace("&amp;", "&")
    assert "NVIDIA H200 (driver 580.95.05, CUDA 13.0)" in page


def test_a_published_gpu_evaluation_loads_back_as_a_gpu_evaluation(tmp_path):
    gpu = gpu_evaluation()
    path = do_publish_evaluation(gpu, tmp_path, acting_user=None)
    campaign = gpu.campaign
    gpu.delete()
    campaign.delete()
    loaded, made = do_load_published_evaluation(read_snapshot(path), acting_user=None)
    assert made and loaded.device == Device.GPU and loaded.environment.startswith("NVIDIA H200")
    assert latest_evaluation(None) is None and latest_evaluation(None, Device.GPU) == loaded


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_evaluate_cuda_runs_the_gpu_track_bundled_on_gpu_workers_and_publishes_a_gpu_evaluation(
        two_gpus, tmp_path, monkeypatch):  # noqa: F811
    """``manage.py evaluate --cuda`` through a real worker consuming the GPU queues. The GPUs are the stand-in
    nvidia-smi's (there is none here: the edge of what runs on CPU), with the worker's CUDA self-check off, and the
    CUDA programs are ones that run on a CPU too; everything else is real: routing, leases, the bundle, the overhead
    pairs, the tables, the page and the snapshot."""
    monkeypatch.setenv("SILENTBENCH_GPU_SELF_CHECK", "false")  # the worker's own probe would fail on fake GPUs
    needs = {"time_limit_seconds": 60, "memory_mb": 1024, "cuda": True, "gpus": 1}
    manifest = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 3, "needs": needs}
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="GPU-TOY"), name="cuda",
                                                          needs_cuda=True), manifest=manifest)
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=None, name="toy-gpu-pipeline", needs_cuda=True),
                             manifest={**manifest, "default_steps": 8}, default_steps=8)
    page, published = tmp_path / "results-gpu.md", tmp_path / "published"
    out = StringIO()
    call_command("evaluate", "--cuda", "--bugs", "GPU-TOY", "--pipelines", "toy-gpu-pipeline", "--seeds", "1",
                 "--detectors", "nan_inf,grad_health,detect_anomaly", "--baseline-every", "2",
                 "--overhead-workload", "toy-gpu-pipeline", "--results", str(page), "--publish", str(published),
                 stdout=out)
    evaluation = Evaluation.objects.get()
    assert evaluation.device == Device.GPU and evaluation.parameters["gpu"] == "NVIDIA A100-SXM4-40GB"
    assert evaluation.parameters["gpus"] == 2 and evaluation.parameters["failed_runs"] == 0, out.getvalue()
    runs = evaluation.campaign.runs.all()
    assert sorted(set(runs.values_list("detector__name", flat=True))) == ["bundle", "detect_anomaly"]
    assert set(runs.values_list("queue", flat=True)) == {"gpu1"} and runs.count() == 2 * 2 + 2
    detection = {row["detector"]: row for row in evaluation.tables["detection"]}
    assert sorted(detection) == ["detect_anomaly", "grad_health", "nan_inf"] and detection["nan_inf"]["buggy_runs"] == 1
    assert {row["detector"]: row["clean_runs"] for row in evaluation.tables["false_positives"]} == {
        "detect_anomaly": 2, "grad_health": 2, "nan_inf": 2}  # the fixed variant and the CUDA pipeline
    overhead = {row["detector"]: row for row in evaluation.tables["overhead"]}
    assert sorted(overhead) == ["detect_anomaly", "grad_health", "nan_inf"]  # each member timed alone
    assert all(row["pairs"] == 1 and row["median_step_time_ratio"] > 0 for row in overhead.values())
    timed = list(evaluation.overhead_campaign.runs.order_by("id").values_list("detector__name", "status"))
    assert [name for name, _ in timed] == ["plain", "nan_inf", "grad_health", "plain", "detect_anomaly", "plain"]
    assert {status for _, status in timed} == {"succeeded"}  # 6 runs for 3 detectors, each with its GPU alone
    assert "# SilentBench results on a GPU" in page.read_text() and "NVIDIA A100-SXM4-40GB" in page.read_text()
    [snapshot] = published.glob("*.json.gz")
    assert read_snapshot(snapshot)["evaluation"]["device"] == "gpu"


def test_evaluate_cuda_on_a_node_without_gpus_says_so():
    with pytest.raises(CommandError, match="nvidia-smi lists none"):
        call_command("evaluate", "--cuda")


def test_the_api_says_where_an_evaluations_runs_ran(client):
    cpu, gpu = stored_evaluation(torch="2.13.0+cpu"), gpu_evaluation()
    latest = client.get("/api/results/").json()
    assert (latest["evaluation"], latest["device"], latest["environment"]) == (cpu.pk, "cpu", "CPU, torch 2.13.0+cpu")
    on_gpu = client.get("/api/results/", {"evaluation": gpu.pk}).json()
    assert on_gpu["device"] == "gpu" and on_gpu["environment"].startswith("NVIDIA H200 (driver 580.95.05")
    assert {row["detector"] for row in on_gpu["detection"]} == {"nan_inf", "grad_health", "differential"}


def test_a_gpu_evaluations_exports_and_citation_name_the_gpu(client):
    gpu = gpu_evaluation()
    caption = client.get("/results/detection.tex", {"evaluation": gpu.pk}).content.decode()
    assert "NVIDIA H200 (driver 580.95.05, CUDA 13.0), torch 2.11.0+cu130" in caption


GOOD_PROBE = {"cuinit": 0, "torch": "2.11.0+cu130", "cuda_available": True, "name": "NVIDIA A100-SXM4-40GB",
              "matmul_error": 2e-16, "free_mb": 40000, "total_mb": 40960, "error": ""}


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_gpu_check_verifies_then_evaluates_and_publishes_in_its_own_folder(  # noqa: F811
        two_gpus, tmp_path, monkeypatch, settings):  # noqa: F811
    """``gpu_check --evaluate`` as bin/gpu-check runs it (its own SQLite database and filesystem broker): the
    verification is recorded as a stability check, then the GPU evaluation is stored, written and published. The
    probe's result is replaced (no GPU here: the edge of what runs on CPU, as in test_gpu_check.py), the worker's own
    check is off, and the CUDA program is one that runs on a CPU too; gpu-transformer, the overhead's workload,
    refuses without CUDA as it would on a node whose GPU failed, and the overhead table says so."""
    if not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") or \
            not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("gpu_check runs only on a database and a broker of its own (bin/gpu-check's): the SQLite pass")
    monkeypatch.setattr(gpu_check_command, "probe_gpu", lambda gpu, sealed: {
        "index": gpu["index"], "name": gpu["name"], "sealed": sealed, "passed": True, "reason": "",
        "facts": GOOD_PROBE, "seconds": 1.0})
    monkeypatch.setenv("SILENTBENCH_GPU_SELF_CHECK", "false")
    manifest = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 3,
                "needs": {"time_limit_seconds": 60, "memory_mb": 1024, "cuda": True, "gpus": 1}}
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="GPU-TOY"), name="cuda",
                                                          needs_cuda=True), manifest=manifest)
    out = StringIO()
    call_command("gpu_check", "--scratch", "--bugs", "GPU-TOY", "--seeds", "1", "--evaluate", "--results-dir",
                 str(tmp_path / "out"), "--detectors", "nan_inf", stdout=out)
    text = out.getvalue()
    assert re.search(r"^ +GPU-TOY/cuda +1/1 +0/1 +verified$", text, re.M), text  # the tally
    assert text.rstrip().endswith("this node is ready for GPU runs")
    assert StabilityCheck.objects.get(reproducer_version__reproducer__bug__bug_id="GPU-TOY").verdict == "verified"
    evaluation = Evaluation.objects.get()
    assert evaluation.device == Device.GPU and evaluation.published_id
    assert [row["detector"] for row in evaluation.tables["detection"]] == ["nan_inf"]
    assert evaluation.tables["overhead"] == [{**evaluation.tables["overhead"][0], "detector": "nan_inf", "pairs": 0}]
    assert (tmp_path / "out" / "results-gpu.md").is_file()
    assert (tmp_path / "out" / f"{evaluation.published_id}.json.gz").is_file()


def test_a_detectors_page_keeps_its_cpu_standing_and_history_and_gives_the_gpu_one_apart(client):
    cpu = stored_evaluation(torch="2.13.0+cpu")
    gpu_evaluation()
    page = client.get("/detectors/grad_health/").content.decode()
    standing = said(page, "standing")
    assert f"Evaluation {cpu.label}" in standing and "1/2" in standing.split("On a GPU")[0]
    assert "On a GPU (the GPU track, evaluation" in standing and "NVIDIA H200" in standing
    assert "GPU-1" not in page.split('id="gpu-standing"')[0]  # its bugs are not the CPU standing's


@pytest.mark.django_db
def test_evaluate_cuda_refuses_what_it_cannot_run_before_it_runs_anything(two_gpus, settings):  # noqa: F811
    settings.SILENTBENCH_RUNS_PER_GPU = 2  # two A100 40 GB shared by two runs each: 20 GB a run
    with pytest.raises(CommandError) as refused:
        call_command("evaluate", "--cuda", "--bugs", "PT-191612,NO-SUCH-BUG", "--pipelines",
                     "gpu-transformer,mlp-adam")
    said = str(refused.value)
    assert "NO-SUCH-BUG: no CUDA reproducer that runs today" in said and "mlp-adam: no CUDA pipeline" in said
    assert "pipeline/gpu-transformer: it needs 1 GPU with 40 GB each" in said and "PT-191612" not in said
    assert not Evaluation.objects.exists() and not Run.objects.exists()


def test_a_bundles_run_whose_oracle_disagrees_is_one_row_of_the_flakiness_table():
    evaluation = stored_evaluation(bundled=True)
    Bug.objects.filter(bug_id="PUB-1").update(status="verified")
    run = evaluation.campaign.runs.get(detector__name="bundle", variant="buggy",
                                       reproducer_version__reproducer__bug__bug_id="PUB-1")
    Run.objects.filter(pk=run.pk).update(manifested=False)  # the bug did not show under the bundle
    rows = flakiness_table(evaluation.campaign.runs.all()).to_dict("records")
    assert [(row["bug"], row["detector"], row["members"], row["run"], row["disagrees_with"]) for row in rows] == [
        ("PUB-1", "bundle", "grad_health, nan_inf", run.pk, "verdict")]
    # narrowed to one of its members, the row stays; to another detector, it goes
    narrowed = {name: Results(QueryDict(f"campaign={evaluation.campaign_id}&detector={name}")).table("flakiness")
                for name in ("grad_health", "differential")}
    assert list(narrowed["grad_health"]["run"]) == [run.pk] and narrowed["differential"].empty


def test_the_latest_gpu_evaluation_is_asked_for_by_device_and_a_bad_device_is_a_clear_404(client):
    assert client.get("/api/results/", {"device": "gpu"}).status_code == 404  # none stored yet
    stored_evaluation()
    gpu = gpu_evaluation()
    assert client.get("/api/results/", {"device": "gpu"}).json()["evaluation"] == gpu.pk
    assert f"Evaluation <a href=\"{gpu.get_absolute_url()}\">" in client.get(
        "/leaderboard/", {"device": "gpu"}).content.decode().replace("&amp;", "&")
    for page in ("/api/results/", "/results/", "/leaderboard/"):
        response = client.get(page, {"device": "<tpu>"})
        assert response.status_code == 404 and "tpu" not in response.content.decode()  # not echoed


def test_a_bug_with_cpu_and_cuda_reproducers_shows_both_evaluations_apart_and_the_catalog_counts_a_gpu_only_bug(
        client):
    stored_evaluation(bugs=("PUB-1", "PUB-2"))
    gpu = gpu_evaluation()
    ReproducerVersionFactory(reproducer=ReproducerFactory(bug=Bug.objects.get(bug_id="PUB-1"), name="cuda",
                                                          needs_cuda=True))  # its CUDA reproducer, which GPUs run
    for row in gpu.tables["detection"]:  # the GPU evaluation ran PUB-1's CUDA reproducer (as it ran GPU-1's)
        if row["bug"] == "GPU-1":
            gpu.tables["detection"].append({**row, "bug": "PUB-1", "reproducer": "cuda"})
    gpu.save()
    page = client.get(Bug.objects.get(bug_id="PUB-1").get_absolute_url()).content.decode()
    assert "nan_inf" in said(page, "caught-by") and "NVIDIA H200" in said(page, "gpu-caught-by")
    assert {row["Reproducer"] for row in table(page, "bug-detections-gpu")} == {"cuda"}
    catalog = client.get("/catalog/").content.decode()
    row = next(row for row in table(catalog, "bug-list") if row["ID"].startswith("GPU-1"))
    assert "nan_inf" in row["Caught by"] and row["Caught by"].endswith("(GPU)"), row


@pytest.mark.parametrize("gpu_first", [False, True])
def test_a_bug_takes_the_worst_verdict_of_the_cpu_and_gpu_snapshots_whichever_loads_first(tmp_path, gpu_first):
    """PUB-1 is verified on the CPU and unreproducible on the GPU: on a fresh install it is unreproducible, in
    either order of loading; PUB-2, verified on both, stays verified; a verdict given by hand is kept."""
    cpu = stored_evaluation()
    gpu = stored_evaluation(device="gpu", reproducer="cuda", verdicts=("unreproducible", "verified"), **H200)
    paths = {evaluation.device: do_publish_evaluation(evaluation, tmp_path, acting_user=None)
             for evaluation in (cpu, gpu)}
    for evaluation in (cpu, gpu):
        campaign = evaluation.campaign
        evaluation.delete()
        campaign.delete()
    StabilityCheck.objects.all().delete()
    Bug.objects.update(status="approved")
    order = ["gpu", "cpu"] if gpu_first else ["cpu", "gpu"]
    do_load_published_evaluation(read_snapshot(paths[order[0]]), acting_user=None)
    Bug.objects.filter(bug_id="PUB-2").update(status="flaky")  # given by hand between two loads: kept
    do_load_published_evaluation(read_snapshot(paths[order[1]]), acting_user=None)
    assert dict(Bug.objects.filter(bug_id__startswith="PUB-").values_list("bug_id", "status")) == {
        "PUB-1": "unreproducible", "PUB-2": "flaky"}


def test_a_newer_snapshot_of_the_same_reproducers_gives_its_newer_verdict(tmp_path):
    """A snapshot ships every stability check of its versions: the second one re-ships the first one's check beside
    its newer one, whose verdict the bug then takes."""
    first = stored_evaluation()
    first_path = do_publish_evaluation(first, tmp_path, acting_user=None)
    for version in ReproducerVersion.objects.filter(reproducer__bug__bug_id="PUB-1"):
        StabilityCheckFactory(reproducer_version=version, buggy_manifested=2)  # a newer verification: flaky
    second = do_store_evaluation(first.campaign, None, [{"detector": "nan_inf", "median_step_time_ratio": 1.5}], [],
                                 {"seeds": 1}, 1.0, acting_user=None)
    second_path = do_publish_evaluation(second, tmp_path, acting_user=None)
    for evaluation in (first, second):
        evaluation.delete()
    first.campaign.delete()
    StabilityCheck.objects.all().delete()
    Bug.objects.update(status="approved")
    do_load_published_evaluation(read_snapshot(first_path), acting_user=None)
    assert Bug.objects.get(bug_id="PUB-1").status == "verified"
    do_load_published_evaluation(read_snapshot(second_path), acting_user=None)
    assert dict(Bug.objects.values_list("bug_id", "status")) == {"PUB-1": "flaky", "PUB-2": "verified"}


def test_past_the_overhead_deadline_no_pair_starts_and_nothing_is_left_queued():
    workload, plain = ReproducerVersionFactory(), do_record_detector("plain")
    campaign, records = do_measure_overhead(workload, [do_record_detector("nan_inf")], plain, pairs=2,
                                            deadline=time.monotonic() - 1)
    assert [(row["detector"], row["pairs"], row["pairs_planned"]) for row in records] == [("nan_inf", 0, 2)]
    assert set(campaign.runs.values_list("status", flat=True)) == {"cancelled"}


def test_the_cpu_commands_keep_to_the_cpu_evaluation(tmp_path, client):
    cpu = stored_evaluation()
    gpu = gpu_evaluation()
    call_command("publish_evaluation", directory=str(tmp_path), results=str(tmp_path / "written-page"),
                 stdout=StringIO())
    cpu.refresh_from_db()
    gpu.refresh_from_db()
    assert cpu.published_id and not gpu.published_id  # the latest CPU one, not the newer GPU one
    with pytest.raises(CommandError, match="--apart is for --cuda"):
        call_command("evaluate", "--apart")
    export = client.get("/results/detection.csv", {"device": "gpu"}).content.decode()
    assert "GPU-1" in export and "PUB-1" not in export


def test_with_a_shared_baseline_each_detector_is_timed_once_against_the_plain_runs_around_it():
    """Real runs (on the CPU, in this process, as evaluate times them): B d1 d2 B d3 B for three detectors."""
    workload = ReproducerVersionFactory(default_steps=9)
    plain = do_record_detector("plain")
    detectors = [do_record_detector(name) for name in ("nan_inf", "grad_health", "loss_spike_zscore")]
    campaign, records = do_measure_overhead(workload, detectors, plain, steps=9, baseline_every=2)
    order = list(campaign.runs.order_by("id").values_list("detector__name", "status"))
    assert order == [(name, "succeeded") for name in ("plain", "nan_inf", "grad_health", "plain",
                                                       "loss_spike_zscore", "plain")]
    assert [(row["detector"], row["pairs"], row["pairs_planned"]) for row in records] == [
        ("nan_inf", 1, 1), ("grad_health", 1, 1), ("loss_spike_zscore", 1, 1)]
    assert all(row["median_step_time_ratio"] > 0 and row["median_plain_step_ms"] > 0 for row in records)
    with pytest.raises(CommandError, match="--pairs times the CPU evaluation's overhead"):
        call_command("evaluate", "--cuda", "--pairs", "2")


def test_a_bundle_recorded_without_members_is_judged_as_its_own_detector():
    run = RunFactory(detector=do_record_detector("bundle"), status="succeeded", steps=10, trigger_step=3,
                     manifested=True)
    AlarmFactory(run=run, step=5, rule="noise")
    [(row, verdict, alarms)] = judged_runs(Run.objects.filter(pk=run.pk))
    assert (row["detector__name"], verdict.detected, alarms) == ("bundle", True, 1)
