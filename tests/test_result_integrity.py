"""What a run stores is what happened: alarms only from detectors (signed by the probe), a bounded number of
records, no NaN or Infinity in the database, a result that cannot be stored fails the run saying why, and a
run that keeps losing its worker is given up instead of queued for ever."""
import json
import math
import os
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError
from django.utils import timezone

from runners.actions import runs as run_actions
from runners.actions.runs import (
    MAX_ATTEMPTS,
    LostRuns,
    do_claim_run,
    do_finish_run,
    do_requeue_lost_runs,
    do_requeue_stale_runs,
)
from runners.detectors.base import ALARM_KEY_ENV, Probe, alarm_mac
from runners.execution import PROBE_DIR, REPO_ROOT, RunOutcome
from runners.failures import kind_of, lost_again, too_many_records
from runners.models import Alarm, Run, RunFailureKind, RunStatus
from runners.reconciler import do_requeue_runs_of_restarted_worker, reconcile
from runners.report import MAX_STEPS, RecordCaps, json_safe, parse_report

from .factories import CampaignFactory, RunFactory, WorkerFactory

KEY = secrets.token_hex(16)  # as the runner makes one for each run


def alarm_line(key=KEY, **fields):
    """An alarm record as the probe writes it, signed with ``key`` (unsigned when None)."""
    record = {"event": "alarm", "detector": "nan_inf", "step": 3, "rank": 0, "rule": "loss_nonfinite",
              "message": "backward() called on a non-finite loss", "evidence": {}, "time": 100.0, **fields}
    if key:
        record["mac"] = alarm_mac(key, record)
    return json.dumps(record)


def step_line(step, **fields):
    return json.dumps({"event": "step", "step": step, "rank": 0, "loss": 1.0, "time": 100.0 + step, **fields})


def compare_line(step):
    return json.dumps({"event": "compare", "step": step, "quantity": "grad", "value": 1.0, "reference": 1.0})


# --- Alarms come only from detectors ---------------------------------------------------------------------

def test_only_alarms_signed_with_the_runs_key_count():
    altered = json.loads(alarm_line())
    altered["step"] = 0  # a genuine alarm moved earlier
    lines = [
        alarm_line(),
        alarm_line(key=None),  # the reproducer's own line
        alarm_line(key=secrets.token_hex(16)),  # signed with another run's key
        json.dumps(altered),
        alarm_line(key=None, mac=12),
        alarm_line(key=None, mac="é" * 64),
    ]
    report = parse_report("\n".join(lines), alarm_key=KEY)
    assert [(alarm["step"], alarm["rule"]) for alarm in report.alarms] == [(3, "loss_nonfinite")]
    assert report.refused_alarms == 5 and report.errors == []


def test_without_a_key_no_alarm_counts():
    report = parse_report(alarm_line(), alarm_key=None)
    assert (report.alarms, report.refused_alarms) == ([], 1)


def test_the_probe_signs_what_it_writes(tmp_path):
    report_path = tmp_path / "report.jsonl"
    probe = Probe("grad_health", {}, str(report_path), alarm_key=KEY)
    probe.alarm("ratio", "the update ratio went NaN",
                {"ratio": math.nan, "shape": (2, 3), 7: "an int key", "where": Path("/dev/shm")})
    report = parse_report(report_path.read_text(), alarm_key=KEY)
    assert report.refused_alarms == 0
    [alarm] = report.alarms
    assert alarm["evidence"] == {"ratio": "NaN", "shape": [2, 3], "7": "an int key", "where": "/dev/shm"}
    assert parse_report(report_path.read_text(), alarm_key=secrets.token_hex(16)).refused_alarms == 1


NAN_BACKWARD = """
import json, math, multiprocessing, os, pathlib, sys
import torch

def nan_backward():
    (torch.tensor(1.0, requires_grad=True) * math.nan).backward()

def rank(path):
    nan_backward()
    pathlib.Path(path).write_text(json.dumps("SILENTBENCH_ALARM_KEY" in os.environ))

if __name__ == "__main__":
    with open(os.environ["SILENTBENCH_REPORT"], "a") as report:
        report.write(json.dumps({"event": "alarm", "detector": "nan_inf", "step": 0, "rank": 0, "rule": "forged",
                                 "message": "caught it", "evidence": {}, "time": 1.0, "mac": "0" * 64}) + "\\n")
    nan_backward()
    child = multiprocessing.get_context("spawn").Process(target=rank, args=(sys.argv[1],))  # as mp.spawn starts ranks
    child.start()
    child.join()
    print(json.dumps({"parent_sees_key": "SILENTBENCH_ALARM_KEY" in os.environ, "child_exit": child.exitcode}))
"""


def probe_environment(tmp_path, **extra):
    """The environment of an instrumented run under nan_inf, as the runner builds it."""
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
            "PYTHONPATH": os.pathsep.join([str(PROBE_DIR), str(REPO_ROOT)]), "SILENTBENCH_DETECTOR": "nan_inf",
            "SILENTBENCH_REPORT": str(tmp_path / "report.jsonl"), **extra}


@pytest.mark.integration
def test_a_real_probe_signs_in_every_rank_and_the_key_is_not_in_os_environ(tmp_path):
    (tmp_path / "repro.py").write_text(NAN_BACKWARD)
    seen_by_child = tmp_path / "child.json"
    result = subprocess.run([sys.executable, "repro.py", str(seen_by_child)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env=probe_environment(tmp_path, **{ALARM_KEY_ENV: KEY}))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"parent_sees_key": False, "child_exit": 0}
    assert json.loads(seen_by_child.read_text()) is False
    report = parse_report((tmp_path / "report.jsonl").read_text(), alarm_key=KEY)
    assert [alarm["rule"] for alarm in report.alarms] == ["loss_nonfinite", "loss_nonfinite"]  # parent and rank
    assert report.refused_alarms == 1  # the reproducer's "forged"


@pytest.mark.integration
def test_a_warm_started_process_passes_the_key_it_holds(tmp_path):
    source = ("import math, torch\nfrom runners.detectors.base import start_probe\n"
              f"start_probe(alarm_key={KEY!r})\n"
              "(torch.tensor(1.0, requires_grad=True) * math.nan).backward()\n")
    environment = probe_environment(tmp_path, PYTHONPATH=str(REPO_ROOT))  # no sitecustomize, no key in it
    result = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=environment)
    assert result.returncode == 0, result.stderr
    report = parse_report((tmp_path / "report.jsonl").read_text(), alarm_key=KEY)
    assert [alarm["rule"] for alarm in report.alarms] == ["loss_nonfinite"] and report.refused_alarms == 0


# --- Records per run are capped ----------------------------------------------------------------------------

def test_records_past_a_cap_are_dropped_and_named():
    lines = ([step_line(step) for step in range(8)] + [alarm_line(step=step) for step in range(3)]
             + [compare_line(step) for step in range(4)])
    report = parse_report("\n".join(lines), alarm_key=KEY,
                          caps=RecordCaps(max_steps=5, max_alarms=2, max_comparisons=3))
    assert [record["step"] for record in report.steps] == [0, 1, 2, 3, 4]
    assert [alarm["step"] for alarm in report.alarms] == [0, 1]
    assert [comparison["step"] for comparison in report.comparisons] == [0, 1, 2]
    assert report.over_cap == ("Too many step records: 8 written, at most 5 are kept per run. "
                               "Too many alarm records: 3 written, at most 2 are kept per run. "
                               "Too many compare records: 4 written, at most 3 are kept per run.")
    assert kind_of(too_many_records) == RunFailureKind.PROTOCOL


def test_the_default_step_cap():
    report = parse_report("\n".join(step_line(step) for step in range(MAX_STEPS + 1)))
    assert len(report.steps) == MAX_STEPS == 10_000
    assert report.over_cap == "Too many step records: 10001 written, at most 10000 are kept per run."
    assert parse_report(step_line(0)).over_cap == ""


# --- Non-finite numbers are stored as JSON ----------------------------------------------------------------

def test_json_safe_spells_non_finite_numbers_one_way_at_any_depth():
    value = {"a": [math.nan, {"b": (math.inf, -math.inf)}], 1: Path("/x"), "kept": [1, 2.5, True, None, "s"],
             "nul": "a\x00b"}
    assert json_safe(value) == {"a": ["NaN", {"b": ["Infinity", "-Infinity"]}], "1": "/x",
                                "kept": [1, 2.5, True, None, "s"], "nul": "a\ufffdb"}
    json.dumps(json_safe(value), allow_nan=False)


def test_everything_parsed_is_valid_json():
    nan, inf = math.nan, math.inf
    lines = [
        json.dumps({"event": "start", "time": nan}),
        step_line(0, loss=nan, time=nan, metrics={"grad_norm": inf, "lr": 0.1}),
        step_line(1, loss=10 ** 400),  # an integer no float holds
        json.dumps({"event": "oracle", "manifested": True, "trigger_step": 0, "summary": "s",
                    "evidence": {"ratio": nan, "norms": [1.0, -inf]}}),
        alarm_line(evidence={"ratio": nan}, time=inf),
        json.dumps({"event": "compare", "step": 0, "quantity": "q", "value": [nan, "Infinity"], "reference": [1, 2]}),
        '{"event": "step", "step": 2, "loss": ' + "9" * 5000 + "}",  # past Python's digit limit
        '{"event": "step", "step": 3, "metrics": ' + "[" * 5000 + "]" * 5000 + "}",
        json.dumps({"event": "compare", "step": 1, "quantity": "q", "value": [[1.0]], "reference": [1.0]}),
    ]
    report = parse_report("\n".join(lines), alarm_key=KEY)
    for part in (report.steps, report.oracle, report.alarms):
        json.dumps(part, allow_nan=False)
    assert report.steps[0]["loss"] == "NaN" and report.steps[0]["time"] is None
    assert report.steps[0]["metrics"] == {"grad_norm": "Infinity", "lr": 0.1}
    assert report.steps[1]["loss"] == "Infinity"
    assert report.oracle["evidence"] == {"ratio": "NaN", "norms": [1.0, "-Infinity"]}
    assert report.alarms[0]["evidence"] == {"ratio": "NaN"} and report.alarms[0]["time"] is None
    assert report.trigger_time() is None
    [comparison] = report.comparisons  # floats for the differential detector, stored only through its alarms
    assert math.isnan(comparison["value"][0]) and comparison["value"][1] == inf
    assert report.errors[:2] == ["line 7: not JSON", "line 8: not JSON"]
    assert report.errors[2].startswith("line 9: compare record needs 'value' and 'reference' as numbers")


def test_a_record_nested_too_deeply_is_an_error_not_a_crash():
    deep = json.dumps({"event": "oracle", "manifested": True, "evidence": {"x": json.loads("[" * 700 + "]" * 700)}})
    report = parse_report(deep)
    # json.loads may take it (its limit is the C stack's on Python 3.12) where json_safe's recursion cannot
    assert report.oracle is None and report.errors[0] in ("line 1: nested too deeply", "line 1: not JSON")


# --- Finishing a run never fails silently ----------------------------------------------------------------

def outcome(**fields):
    return RunOutcome(**{"succeeded": True, "failure_reason": "", "failure_kind": "", "exit_code": 0,
                         "wall_seconds": 1.5, "stdout": "the log", "stderr": "", "output_truncated": False,
                         "oracle": {"manifested": True, "summary": "s", "evidence": {}}, **fields})


def alarm(**fields):
    return {"step": 0, "rank": 0, "rule": "grad_health", "message": "m", "evidence": {}, "time": 1.0, **fields}


def running_run(**fields):
    return RunFactory(**{"status": RunStatus.RUNNING, "attempts": 1, "started_at": timezone.now(), **fields})


@pytest.mark.django_db
def test_non_finite_values_are_stored():
    """What a stranger's reproducer did: NaN in an alarm's evidence made bulk_create raise on SQLite."""
    run = running_run()
    assert do_finish_run(run, outcome(
        oracle={"manifested": True, "summary": "s", "evidence": {"ratio": math.nan}},
        steps=[{"step": 0, "rank": 0, "loss": math.nan, "time": 1.0, "metrics": {"g": math.inf}}],
        alarms=[alarm(evidence={"ratio": math.nan})],  # as an offline check may make them
        detector_summary={"worst": -math.inf}, protocol_errors=["line 1: not JSON"],
        execution={"start": "warm", "refused_alarms": 1}))
    run.refresh_from_db()
    assert (run.status, run.failure_reason) == (RunStatus.SUCCEEDED, "")
    assert run.oracle_evidence == {"ratio": "NaN"} and run.detector_summary == {"worst": "-Infinity"}
    assert run.step_records == [{"step": 0, "rank": 0, "loss": "NaN", "time": 1.0, "metrics": {"g": "Infinity"}}]
    assert [a.evidence for a in run.alarms.all()] == [{"ratio": "NaN"}]
    assert run.execution == {"start": "warm", "refused_alarms": 1}


@pytest.mark.django_db
def test_a_result_the_database_refuses_fails_the_run_saying_why(monkeypatch):
    # Simulated (every value json_safe lets through is storable): the database refuses the alarms.
    def refuse(*args, **kwargs):
        raise IntegrityError('CHECK constraint failed: (JSON_VALID("evidence") OR "evidence" IS NULL)')

    monkeypatch.setattr(Alarm.objects, "bulk_create", refuse)
    run = running_run()
    assert do_finish_run(run, outcome(steps=[{"step": 0, "rank": 0, "loss": 1.0}], alarms=[alarm()],
                                      execution={"start": "cold"}))
    run.refresh_from_db()  # the connection is usable: the first transaction was rolled back whole
    assert (run.status, run.failure_kind) == (RunStatus.FAILED, RunFailureKind.INTERNAL)
    assert run.failure_reason == ('Storing the result failed: IntegrityError: CHECK constraint failed: '
                                  '(JSON_VALID("evidence") OR "evidence" IS NULL)')
    assert (run.stdout, run.exit_code, run.wall_seconds, run.execution) == ("the log", 0, 1.5, {"start": "cold"})
    assert (run.step_records, run.manifested, run.alarms.count()) == ([], None, 0)
    assert not do_finish_run(run, outcome())  # that attempt is over


@pytest.mark.django_db
def test_a_value_the_database_cannot_hold_fails_the_run_and_keeps_the_logs():
    run = running_run()
    assert do_finish_run(run, outcome(alarms=[alarm(step=2 ** 70)]))  # past a 64-bit integer column
    run.refresh_from_db()
    assert (run.status, run.failure_kind, run.stdout) == (RunStatus.FAILED, RunFailureKind.INTERNAL, "the log")
    assert run.failure_reason.startswith("Storing the result failed: ") and not run.alarms.exists()


@pytest.mark.django_db
def test_logs_the_database_cannot_hold_are_left_out_of_the_failure():
    run = running_run()
    assert do_finish_run(run, outcome(stdout="half a character: \ud800"))
    run.refresh_from_db()
    assert (run.status, run.failure_kind, run.stdout, run.exit_code) == (
        RunStatus.FAILED, RunFailureKind.INTERNAL, "", 0)
    assert run.failure_reason.startswith("Storing the result failed: UnicodeEncodeError: ")


# --- A run that keeps losing its worker is given up ------------------------------------------------------

@pytest.mark.django_db
def test_a_run_lost_on_its_second_attempt_fails_and_its_campaign_completes(
        settings, monkeypatch, django_capture_on_commit_callbacks):
    enqueued = []
    monkeypatch.setattr(run_actions, "enqueue_runs", enqueued.extend)
    settings.SILENTBENCH_WORKER_STALE_SECONDS = 60
    now = timezone.now()
    worker = WorkerFactory()
    campaign = CampaignFactory()
    run = RunFactory(campaign=campaign)

    def claimed_then_silent():
        assert do_claim_run(run.pk, worker) is not None
        type(worker).objects.filter(pk=worker.pk).update(last_seen=now - timedelta(seconds=61))
        with django_capture_on_commit_callbacks(execute=True):
            return reconcile(now)

    first = claimed_then_silent()
    run.refresh_from_db()
    assert first["requeued_from_silent_workers"] == [run.pk] and first["lost_runs_given_up"] == []
    assert (run.status, run.attempts, enqueued) == (RunStatus.QUEUED, 1, [run.pk])

    second = claimed_then_silent()
    run.refresh_from_db()
    campaign.refresh_from_db()
    assert second["requeued_from_silent_workers"] == [] and second["lost_runs_given_up"] == [run.pk]
    assert (run.status, run.failure_kind, run.attempts) == (RunStatus.FAILED, RunFailureKind.LOST, MAX_ATTEMPTS)
    assert run.failure_reason == lost_again(2) == (
        "Lost again: its worker stopped while running it (the worker died, or the run took it down); "
        "a run lost after 2 attempts is not retried again.")
    assert enqueued == [run.pk]  # not queued a third time
    assert campaign.completed_at is not None


@pytest.mark.django_db
def test_the_time_limit_reaper_and_a_restarted_worker_give_up_a_second_loss_too(
        monkeypatch, django_capture_on_commit_callbacks):
    monkeypatch.setattr(run_actions, "enqueue_runs", lambda run_ids: None)
    long_ago = timezone.now() - timedelta(days=1)
    worker = WorkerFactory()
    first, second = (RunFactory(campaign=CampaignFactory(), status=RunStatus.RUNNING, worker=worker,
                                started_at=long_ago, attempts=attempts) for attempts in (1, 2))
    with django_capture_on_commit_callbacks(execute=True):
        assert do_requeue_stale_runs() == LostRuns(requeued=[first.pk], given_up=[second.pk])
    assert first.campaign.runs.get().status == RunStatus.QUEUED
    second.campaign.refresh_from_db()
    assert second.campaign.completed_at is not None

    restarted = RunFactory(status=RunStatus.RUNNING, worker=worker, started_at=timezone.now(), attempts=3)
    assert do_requeue_runs_of_restarted_worker(worker.hostname) == LostRuns(requeued=[], given_up=[restarted.pk])


@pytest.mark.django_db
def test_a_run_seen_on_an_earlier_attempt_is_left_alone():
    run = running_run(attempts=2)  # seen lost on attempt 1, claimed again since
    assert do_requeue_lost_runs({run.pk: 1}) == LostRuns(requeued=[], given_up=[])
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING
