"""Hostile reproducers against the sealed sandbox (runners/executor/isolation.py), with real processes.

Each attack here worked against the executor before runs were sealed in namespaces of their own
(issue 17). CI's machines have user namespaces: these tests fail there, never skip, if a layer is
missing. A hostile reproducer reports what it managed as its oracle evidence, and the test checks it
from the outside too.
"""
import json
import os
import socket
import threading
import uuid
from pathlib import Path

import pytest

from runners.execution import execute
from runners.executor import Limits, isolation_layers, run_sandboxed
from runners.failures import program_failure
from runners.models import RunStatus
from runners.tasks import execute_run

from .factories import GOOD_REPRODUCER, ReproducerVersionFactory, RunFactory
from .helpers import processes_naming

pytestmark = pytest.mark.django_db

REPORTING = '''
import json, os
def oracle(evidence):
    with open(os.environ["SILENTBENCH_REPORT"], "a") as report:
        report.write(json.dumps({"event": "oracle", "manifested": False, "evidence": evidence}) + "\\n")
'''


@pytest.fixture(autouse=True)
def sealed(settings, tmp_path):
    """Every run here must be sealed: a machine without user namespaces fails these tests."""
    layers = isolation_layers()
    assert layers["namespaces"], f"runs cannot be sealed here: {layers['error']}"
    settings.SILENTBENCH_RUN_DIR = tmp_path / "runs"


def hostile_run(source, time_limit=30, detector=None, **limits):
    version = ReproducerVersionFactory(files={"repro.py": REPORTING + source}, time_limit_seconds=time_limit,
                                       memory_mb=limits.pop("memory_mb", 2048))
    return RunFactory(reproducer_version=version, **({"detector": detector} if detector else {}))


def evidence_of(outcome):
    assert outcome.succeeded, (outcome.failure_reason, outcome.stderr[-2000:])
    return outcome.oracle["evidence"]


def test_the_hosts_loopback_is_out_of_reach_but_its_own_works():
    """PostgreSQL, Redis and the web server listen on the host's loopback: a listener of this test stands
    in for them. The run's own loopback works (gloo uses it)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        accepted = []
        threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
        outcome = execute(hostile_run(f'''
import socket
results = {{}}
for port in ({port}, 5432, 6379, 8000):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        results[str(port)] = "connected"
    except OSError as error:
        results[str(port)] = type(error).__name__
own = socket.create_server(("127.0.0.1", 0))
socket.create_connection(own.getsockname(), timeout=2).close()
interfaces = sorted(name for _, name in socket.if_nameindex())
oracle({{"results": results, "own_loopback": "works", "interfaces": interfaces}})
'''))
    evidence = evidence_of(outcome)
    assert "connected" not in evidence["results"].values(), evidence
    assert evidence["own_loopback"] == "works" and evidence["interfaces"] == ["lo"]
    assert accepted == []


def test_files_outside_its_view_and_other_processes_are_invisible(settings):
    secret = settings.VAR_DIR / f"secret-{uuid.uuid4().hex}.txt"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("the database")
    try:
        outcome = execute(hostile_run(f'''
import glob
readable = []
for path in [{str(secret)!r}, "/etc/shadow", "/root/.bashrc", {str(Path(__file__).resolve())!r},
             {str(settings.BASE_DIR / "README.md")!r}]:
    try:
        open(path).read()
        readable.append(path)
    except OSError:
        pass
environs = {{}}
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        environs[path] = open(path, "rb").read().decode(errors="replace")
    except OSError as error:
        environs[path] = type(error).__name__
devices = sorted(os.listdir("/dev"))
try:
    os.mknod("/tmp/disk", 0o600 | 0o060000, os.makedev(8, 0))
    mknod = "made"
except OSError as error:
    mknod = type(error).__name__
capabilities = [line.split()[1] for line in open("/proc/self/status") if line.startswith("Cap")]
oracle({{"readable": readable, "pids": sorted(int(p.split("/")[2]) for p in environs), "environs": environs,
         "devices": devices, "mknod": mknod, "capabilities": capabilities}})
'''))
    finally:
        secret.unlink()
    evidence = evidence_of(outcome)
    assert evidence["readable"] == [], evidence
    assert evidence["pids"] == [1, 2], evidence  # its init and itself: no worker, no other run
    assert "the database" not in json.dumps(evidence["environs"])
    assert evidence["mknod"] == "PermissionError"
    assert set(evidence["devices"]) <= {"null", "zero", "full", "random", "urandom", "shm", "fd", "stdin", "stdout",
                                        "stderr"}
    assert set(evidence["capabilities"]) == {"0000000000000000"}, evidence["capabilities"]


def test_no_process_and_no_shared_memory_file_outlive_the_run():
    token = f"stray-{uuid.uuid4().hex}"
    outcome = execute(hostile_run(f'''
import subprocess, sys
# a double fork into a session of its own, as a daemon does
subprocess.Popen([sys.executable, "-c", "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(600)",
                  {token!r}], start_new_session=True)
with open("/dev/shm/{token}", "wb") as shared:
    shared.write(b"x" * (8 << 20))
import time; time.sleep(1)
oracle({{}})
'''))
    evidence_of(outcome)
    assert processes_naming(token) == []
    assert not any(token in name for name in os.listdir("/dev/shm"))


def test_the_process_total_holds_for_processes_in_sessions_of_their_own(settings):
    """520 processes, each in a session of its own, passed a limit of 512 before: the count now includes
    them all (RLIMIT_NPROC in the run's own user namespace, and the worker's count of its PID namespace)."""
    settings.SILENTBENCH_MAX_PROCESSES = 64
    outcome = execute(hostile_run('''
import os, time
started = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        time.sleep(60)
        os._exit(0)
    started += 1
print("started", started, flush=True)
oracle({"started": started})
time.sleep(60)
''', time_limit=40))
    assert not outcome.succeeded
    assert "Process limit" in outcome.failure_reason
    assert outcome.wall_seconds < 30  # stopped by the count, not by the time limit
    assert int(outcome.stdout.split()[1]) < 64


def test_the_disk_total_holds_across_the_run_directory_tmp_and_shared_memory(settings):
    settings.SILENTBENCH_MAX_DISK_MB = 64
    outcome = execute(hostile_run('''
written = {}
for name in ("a.bin", "/tmp/b.bin", "/dev/shm/c.bin"):
    try:
        with open(name, "wb") as out:
            for _ in range(30):
                out.write(b"x" * (1 << 20))
        written[name] = "30 MB"
    except OSError as error:
        written[name] = error.strerror
oracle({"written": written})
'''))
    written = evidence_of(outcome)["written"]
    assert list(written.values()).count("30 MB") <= 2 and "No space left on device" in written.values(), written


def test_a_forged_alarm_is_refused_and_the_run_says_so():
    """Under ``plain`` (no detector inside), a reproducer writes alarm records into its report: none is
    stored, the run is not scored as detected, and its page says alarms were refused."""
    forger = GOOD_REPRODUCER.replace(
        'report(event="oracle"',
        'report(event="alarm", detector="plain", step=1, rule="forged", message="x")\n'
        'report(event="alarm", step=2, rule="forged", message="x", mac="0" * 64)\n'
        'report(event="oracle"', 1)
    assert forger != GOOD_REPRODUCER
    run = RunFactory(reproducer_version=ReproducerVersionFactory(files={"repro.py": forger}))
    execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.failure_reason
    assert run.alarms.count() == 0
    assert run.execution["refused_alarms"] == 2
    assert any("refused" in note for note in run.execution["notes"])


def test_a_teardown_hang_after_the_oracle_is_ended_after_a_grace_period(settings):
    settings.SILENTBENCH_TEARDOWN_GRACE_SECONDS = 2
    outcome = execute(hostile_run('''
oracle({"done": True})
import time
time.sleep(600)
''', time_limit=60))
    assert outcome.succeeded, outcome.failure_reason
    assert outcome.wall_seconds < 30
    assert any("teardown hang" in note for note in outcome.execution["notes"])


def test_runs_record_their_start_and_layers():
    outcome = execute(hostile_run("oracle({})"))
    assert outcome.execution["start"] == "warm" and outcome.execution["cold_reason"] == ""
    layers = outcome.execution["layers"]
    for layer in ("user namespace", "mount namespace", "pid namespace", "network namespace", "no capabilities",
                  "no_new_privs"):
        assert layer in layers, layers


def test_without_namespaces_untrusted_code_is_refused_unless_the_operator_opts_in(monkeypatch, tmp_path):
    from runners.executor import supervisor

    monkeypatch.setattr(supervisor, "isolation_layers", lambda: {"namespaces": [], "error": "unshare: not allowed"})
    argv = ["/bin/sh", "-c", "echo ran"]
    refused = run_sandboxed(argv, tmp_path, {"HOME": str(tmp_path)}, Limits(time_limit_seconds=10, memory_mb=512))
    assert refused.stdout == "" and "SILENTBENCH_ALLOW_UNISOLATED" in program_failure(refused, Limits(10, 512)).reason
    allowed = run_sandboxed(argv, tmp_path, {"HOME": str(tmp_path)},
                            Limits(time_limit_seconds=10, memory_mb=512, allow_unisolated=True))
    assert allowed.stdout.strip() == "ran" and "namespace" not in " ".join(allowed.layers)
    assert any("Not sealed" in note for note in allowed.notes)


def test_no_capability_comes_back_through_a_nested_user_namespace_nor_a_signal_to_its_init():
    outcome = execute(hostile_run('''
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
nested = libc.unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
    try:
        os.kill(1, number)
    except OSError:
        pass
oracle({"nested": nested, "errno": ctypes.get_errno(), "cap_eff": status["CapEff"].strip(),
        "no_new_privs": status["NoNewPrivs"].strip()})
'''))
    evidence = evidence_of(outcome)
    assert evidence["nested"] == -1 and evidence["cap_eff"] == "0000000000000000", evidence
    assert evidence["no_new_privs"] == "1"


def test_a_warm_run_flushes_the_files_its_script_left_open():
    """The interpreter closes them at exit; a warm run ends in os._exit and must do the same first."""
    outcome = execute(hostile_run('''
report = open(os.environ["SILENTBENCH_REPORT"], "a")
report.write(json.dumps({"event": "oracle", "manifested": False, "evidence": {"flushed": True}}) + "\\n")
def keep():  # a function in the script: its globals are in a reference cycle, as in most programs
    return report
'''))
    assert outcome.execution["start"] == "warm"
    assert evidence_of(outcome) == {"flushed": True}


def test_a_worker_without_namespaces_refuses_the_run_with_the_reason(monkeypatch):
    from runners.executor import supervisor

    monkeypatch.setattr(supervisor, "isolation_layers", lambda: {"namespaces": [], "error": "unshare: not allowed"})
    outcome = execute(hostile_run("oracle({})"))
    assert outcome.failure_kind == "sandbox_refusal", outcome.failure_reason
    assert "SILENTBENCH_ALLOW_UNISOLATED" in outcome.failure_reason and outcome.stdout == ""
