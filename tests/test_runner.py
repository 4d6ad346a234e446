"""The runner against reproducers that misbehave: each becomes a failed run with a clear reason."""
import os
import uuid
from pathlib import Path

import pytest

from runners.actions.runs import do_claim_run
from runners.actions.workers import current_worker
from runners.execution import execute
from runners.models import RunStatus
from runners.tasks import execute_run

from .factories import GOOD_REPRODUCER, AlarmFactory, CampaignFactory, ReproducerVersionFactory, RunFactory
from .helpers import processes_naming

pytestmark = pytest.mark.django_db


def run_with(source, time_limit=20, memory_mb=1024, **run_fields):
    version = ReproducerVersionFactory(files={"repro.py": source}, time_limit_seconds=time_limit, memory_mb=memory_mb)
    return RunFactory(reproducer_version=version, **run_fields)


def test_good_reproducer_succeeds_and_reports():
    outcome = execute(run_with(GOOD_REPRODUCER))
    assert outcome.succeeded, outcome.failure_reason
    assert outcome.oracle["manifested"] is True
    assert outcome.trigger_step == 1
    assert [s["step"] for s in outcome.steps] == [0, 1, 2]
    assert outcome.trigger_time == outcome.steps[0]["time"]  # trigger step 1 begins when step 0 ends


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "super-secret")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:password@db/silentbench")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://secret-host:6379/0")
    outcome = execute(run_with(GOOD_REPRODUCER))
    seen = outcome.oracle["evidence"]["environment"]
    assert "SILENTBENCH_REPORT" in seen
    for secret in ("DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL"):
        assert secret in os.environ and secret not in seen


def test_crash_is_a_failed_run_with_the_exception():
    outcome = execute(run_with("raise RuntimeError('boom in the reproducer')"))
    assert not outcome.succeeded
    assert outcome.exit_code == 1
    assert "exited with code 1" in outcome.failure_reason
    assert "boom in the reproducer" in outcome.failure_reason


def test_non_zero_exit_is_a_failed_run():
    outcome = execute(run_with("import sys; sys.exit(3)"))
    assert not outcome.succeeded
    assert outcome.exit_code == 3
    assert "exited with code 3" in outcome.failure_reason


def test_hang_past_the_time_limit_is_killed():
    outcome = execute(run_with("import time\nwhile True: time.sleep(1)", time_limit=2))
    assert not outcome.succeeded
    assert "Time limit exceeded" in outcome.failure_reason
    assert outcome.wall_seconds < 15


def test_children_of_a_hanging_reproducer_are_killed_too():
    token = f"child-{uuid.uuid4().hex}"
    source = ("import subprocess, sys, time\n"
              f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {token!r}])\n"
              "time.sleep(600)\n")
    outcome = execute(run_with(source, time_limit=3))
    assert "Time limit exceeded" in outcome.failure_reason
    assert processes_naming(token) == []


def test_huge_output_is_capped_and_a_flood_is_killed(settings):
    settings.SILENTBENCH_LOG_CAP_BYTES = 4096
    settings.SILENTBENCH_OUTPUT_FLOOD_BYTES = 2 * 1024 * 1024
    outcome = execute(run_with("import sys\nwhile True: sys.stdout.write('x' * 65536)"))
    assert not outcome.succeeded
    assert "Output flood" in outcome.failure_reason
    assert len(outcome.stdout) < 4096 + 200
    assert outcome.output_truncated


def test_large_but_bounded_output_keeps_head_and_tail(settings):
    settings.SILENTBENCH_LOG_CAP_BYTES = 1000
    source = GOOD_REPRODUCER + "\nprint('FIRST'); print('y' * 100000); print('LAST')\n"
    outcome = execute(run_with(source))
    assert outcome.succeeded
    assert outcome.stdout.startswith("FIRST") and outcome.stdout.rstrip().endswith("LAST")
    assert "bytes not kept" in outcome.stdout


def test_memory_limit_turns_into_out_of_memory():
    outcome = execute(run_with("block = bytearray(1024 * 1024 * 1024)", memory_mb=256))
    assert not outcome.succeeded
    assert "Out of memory" in outcome.failure_reason


def test_no_oracle_report_is_a_failed_run():
    outcome = execute(run_with("print('I trained, trust me')"))
    assert not outcome.succeeded
    assert outcome.exit_code == 0
    assert "No oracle report" in outcome.failure_reason


def test_garbage_in_the_report_is_recorded_not_fatal():
    source = GOOD_REPRODUCER + "\nwith open(os.environ['SILENTBENCH_REPORT'], 'a') as f: f.write('not json\\n')\n"
    outcome = execute(run_with(source))
    assert outcome.succeeded
    assert outcome.protocol_errors == ["line 6: not JSON"]


def test_path_escaping_file_names_are_refused():
    run = run_with(GOOD_REPRODUCER)
    run.reproducer_version.files = {"../escape.py": "print(1)", "repro.py": GOOD_REPRODUCER}
    with pytest.raises(ValueError, match="refusing"):
        execute(run)


def test_task_records_a_crash_and_keeps_going():
    crashing = run_with("raise SystemExit('bad things')")
    good = run_with(GOOD_REPRODUCER)
    execute_run(crashing.pk)
    execute_run(good.pk)
    crashing.refresh_from_db()
    good.refresh_from_db()
    assert crashing.status == RunStatus.FAILED and "bad things" in crashing.failure_reason
    assert good.status == RunStatus.SUCCEEDED and good.manifested is True


def test_task_refuses_an_unapproved_version():
    run = run_with("open('/tmp/silentbench-should-not-exist', 'w')")
    run.reproducer_version.review_state = "pending"
    run.reproducer_version.save()
    execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "not approved" in run.failure_reason
    assert run.stdout == "" and run.exit_code is None


def test_a_run_is_claimed_once():
    run = run_with(GOOD_REPRODUCER)
    worker = current_worker()
    assert do_claim_run(run.pk, worker) is not None
    assert do_claim_run(run.pk, worker) is None


def test_retrying_failed_runs_queues_new_attempts_and_keeps_what_they_were(client, django_capture_on_commit_callbacks):
    from core.models import AuditEvent
    from runners.actions.campaigns import do_retry_failed_runs

    from .factories import MaintainerFactory, UserFactory

    campaign = CampaignFactory(name="c")
    failed = RunFactory(campaign=campaign, status=RunStatus.FAILED, failure_reason="Crashed", attempts=1)
    AlarmFactory(run=failed, step=0, rule="r", message="m")
    done = RunFactory(campaign=campaign, status=RunStatus.SUCCEEDED)
    client.force_login(UserFactory())  # the edge checks the permission
    assert client.post(f"/campaigns/{campaign.pk}/retry/").status_code == 403
    maintainer = MaintainerFactory()
    with django_capture_on_commit_callbacks() as callbacks:
        assert do_retry_failed_runs(campaign, acting_user=maintainer) == [failed.pk]
    assert len(callbacks) == 1  # enqueued once the transaction commits
    failed.refresh_from_db()
    done.refresh_from_db()
    assert (failed.status, failed.failure_reason, failed.attempts) == (RunStatus.QUEUED, "", 1)
    assert not failed.alarms.exists() and done.status == RunStatus.SUCCEEDED
    [event] = AuditEvent.objects.about(campaign).filter(action="retry")
    assert event.actor == maintainer and event.detail["alarms_cleared"] == 1
    assert [(run["id"], run["status"], run["failure_reason"]) for run in event.detail["runs"]] == [
        (failed.pk, "failed", "Crashed")]


def test_a_campaign_counts_as_stalled_only_after_its_slowest_run_could_have_finished():
    from runners.actions.detectors import do_record_detector
    from runners.progress import stall_limit

    campaign = CampaignFactory(name="c")
    version = ReproducerVersionFactory(time_limit_seconds=60)
    RunFactory(campaign=campaign, reproducer_version=version, detector=do_record_detector("plain"))
    assert stall_limit(campaign) == 2 * 60 + 120
    # TrainCheck may run 8x longer and fit first: waiting only 240 s would call a healthy fit a stall
    RunFactory(campaign=campaign, reproducer_version=version, detector=do_record_detector("traincheck"))
    assert stall_limit(campaign) == 2 * (60 * 8 * 2) + 120


def test_fork_bomb_is_stopped_at_the_process_limit(settings):
    settings.SILENTBENCH_MAX_PROCESSES = 64
    outcome = execute(run_with("import os, time\nwhile True:\n    try:\n        os.fork()\n"
                               "    except OSError:\n        time.sleep(0.01)\n", time_limit=20))
    assert not outcome.succeeded
    assert "Process limit" in outcome.failure_reason and "64" in outcome.failure_reason
    assert outcome.wall_seconds < 15  # stopped by the count, not by the time limit


def test_writing_outside_the_run_directory_is_refused(tmp_path):
    """The interpreter's own folder is in the run's view, read-only; the test's folder is not in it at all."""
    import sys

    inside_view = Path(sys.prefix) / f"escaped-{uuid.uuid4().hex}.txt"
    outcome = execute(run_with(GOOD_REPRODUCER + f"\nopen({str(inside_view)!r}, 'w').write('pwned')\n"))
    assert not outcome.succeeded
    assert "Refused by the sandbox" in outcome.failure_reason and "Read-only file system" in outcome.failure_reason
    assert not inside_view.exists()
    outside = tmp_path / "escaped.txt"
    outcome = execute(run_with(GOOD_REPRODUCER + f"\nopen({str(outside)!r}, 'w').write('pwned')\n"))
    assert not outcome.succeeded and "No such file or directory" in outcome.failure_reason
    assert not outside.exists()


def test_a_reproducer_cannot_signal_its_worker():
    from runners.executor import landlock_abi

    if landlock_abi() < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    source = GOOD_REPRODUCER + "\nimport signal\nos.kill(os.getppid(), signal.SIGTERM)\n"
    outcome = execute(run_with(source))  # the worker here is this test process: it lives on
    assert not outcome.succeeded and "Refused by the sandbox" in outcome.failure_reason


def test_a_root_worker_runs_reproducers_as_an_unprivileged_user(settings):
    """As root, the program is user 1000 of its own user namespace, which is ``nobody`` on the host (the
    project's Python under /root stays readable: the set-up binds it before the switch)."""
    import pwd
    import sys

    from runners.executor import Limits, run_sandboxed

    if os.geteuid() != 0:
        pytest.skip("needs a root worker")
    workdir = settings.SILENTBENCH_RUN_DIR / f"uid-test-{uuid.uuid4().hex}"
    workdir.mkdir(parents=True)
    (workdir / "made-by-root").write_text("x")
    script = ("import os; open('mine', 'w').write('y'); open('made-by-root').read();"
              "print(os.getuid(), os.getgroups(), open('/proc/self/uid_map').read().split())")
    result = run_sandboxed([sys.executable, "-c", script], workdir, {"HOME": str(workdir)},
                           Limits(time_limit_seconds=20, memory_mb=2048))
    nobody = pwd.getpwnam("nobody")
    assert result.exit_code == 0, result.stderr
    uid, groups, mapping = result.stdout.split(" ", 2)
    assert uid == "1000" and groups == "[]" and f"'1000', '{nobody.pw_uid}', '1'" in mapping
    assert (workdir / "mine").read_text() == "y"  # copied back out of the sealed run directory


def test_a_reproducer_dies_with_the_process_that_started_it(tmp_path):
    """PR_SET_PDEATHSIG: a worker killed with -9 leaves no reproducer behind (its own session would
    otherwise keep it alive)."""
    import signal
    import subprocess
    import sys
    import time

    token = f"sleeper-{uuid.uuid4().hex}"
    starter = ("import sys\nfrom pathlib import Path\nfrom runners.executor import Limits, run_sandboxed\n"
               "d = Path(sys.argv[1])\n"
               f"run_sandboxed([sys.executable, '-c', 'import time; time.sleep(600)', {token!r}], d, "
               "{'HOME': str(d)}, Limits(time_limit_seconds=600, memory_mb=2048))\n")
    worker = subprocess.Popen([sys.executable, "-c", starter, str(tmp_path)], cwd=os.getcwd())
    for _ in range(600):
        if processes_naming(token):
            break
        time.sleep(0.05)
    assert processes_naming(token)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    for _ in range(100):
        if not processes_naming(token):
            break
        time.sleep(0.05)
    assert processes_naming(token) == []
