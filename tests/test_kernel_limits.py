"""Limits the kernel enforces, with real processes: each run's cgroup (memory with kernel memory, processes, CPU
share), its open files, its session keyring and its system-call filter, and the worker's watch of its memory where
it has no cgroup, which fails closed. Each attack here worked before (issue 27): a run queued 1.5 GB in socket
buffers under a 1 GB limit, raised its open files to the worker's hard limit, shared a keyring with the next run,
and, under an unprivileged worker, hid its processes from the memory watch with ``PR_SET_DUMPABLE``.

CI's machines have cgroups v1 that a root worker may write, seccomp and user namespaces: these tests fail there,
never skip, if a layer is missing."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from runners.execution import execute
from runners.executor import Limits, cgroups, describe_confinement, seccomp

from .test_sandbox import REPORTING, evidence_of, hostile_run, sealed  # noqa: F401 - the fixture seals every run

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's: a user other than root can run it (the project's lies under /root)
UNPRIVILEGED_UID = 1000  # the workers' user in the Docker images

SOCKET_BUFFERS = '''
import socket
import time
pairs, queued = [], 0
try:
    for _ in range(20000):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        mine.setblocking(False)
        try:
            while True:
                queued += mine.send(b"x" * 200000)
        except BlockingIOError:
            pass
        pairs.append((mine, theirs))
except OSError as error:
    print("stopped by", error.strerror, "after", queued // 2**20, "MB", flush=True)
time.sleep(3)  # held, as memory taken from the host would be: the worker reads the run's account every 0.2 s
oracle({"queued_mb": queued // 2**20})
'''


def test_the_kernel_counts_a_runs_socket_buffers_against_its_memory():
    """A few MB resident, hundreds of MB queued in socket buffers: the run's cgroup counts them, and the run fails
    as out of memory instead of taking the host's memory unnoticed."""
    assert cgroups.support().version, f"no cgroup per run here: {cgroups.support().error}"
    outcome = execute(hostile_run(SOCKET_BUFFERS, memory_mb=256))
    assert (outcome.succeeded, outcome.failure_kind) == (False, "memory"), outcome.failure_reason
    assert outcome.failure_reason.startswith("Out of memory: exceeded the memory limit of 256 MB")
    assert "cgroup v1" in outcome.execution["layers"] or "cgroup v2" in outcome.execution["layers"]


RESERVES_AND_TOUCHES = '''
import mmap, os, sys, time
reserved = mmap.mmap(-1, {reserve_mb} * 2**20, prot=0)  # PROT_NONE: address space only, as CUDA reserves it
children = []
for _ in range({parts} - 1):  # the rest of the memory in processes of their own, each under any per-process limit
    pid = os.fork()
    if pid == 0:
        held = b"x" * ({touch_mb} // {parts} * 2**20)
        time.sleep(4)
        os._exit(0)
    children.append(pid)
touched = b"x" * ({touch_mb} // {parts} * 2**20)  # written: resident memory
time.sleep(4)  # held long enough for the watch's samples
for pid in children:
    os.waitpid(pid, 0)
oracle({{"reserved_mb": len(reserved) // 2**20, "touched_mb": len(touched) // 2**20 * {parts}}})
'''


@pytest.mark.parametrize("own_cgroup", [True, False], ids=["cgroup", "watch"])
def test_address_space_is_not_memory_but_memory_is(own_cgroup, settings):
    """The limit of record is what a run holds, by its cgroup or by the watch of its processes' PSS, never its
    address space: a CUDA process reserves tens of GB it never touches, and RLIMIT_AS had broken CUDA. The 1.5 GB
    are held by three processes of 512 MB, each under the per-process backstop (RLIMIT_DATA) of a run without a
    cgroup: the total is what fails."""
    settings.SILENTBENCH_RUN_CGROUPS = own_cgroup
    reserving = execute(hostile_run(RESERVES_AND_TOUCHES.format(reserve_mb=16384, touch_mb=50, parts=1),
                                    memory_mb=1024))
    assert evidence_of(reserving) == {"reserved_mb": 16384, "touched_mb": 50}
    assert any(layer.startswith("cgroup v") for layer in reserving.execution["layers"]) == own_cgroup
    touching = execute(hostile_run(RESERVES_AND_TOUCHES.format(reserve_mb=1, touch_mb=1536, parts=3),
                                   memory_mb=1024))
    assert (touching.succeeded, touching.failure_kind) == (False, "memory"), touching.failure_reason
    assert touching.failure_reason.startswith("Out of memory: exceeded the memory limit of 1024 MB")
    assert "MemoryError" not in touching.stderr  # the total was stopped, not one process's allocation


def test_a_process_may_not_take_more_than_the_run_between_two_samples_of_the_watch(settings):
    """Without a cgroup, the watch samples; one process writing 1.5 GB under 1024 MB is stopped as it allocates
    (RLIMIT_DATA beyond what the warm start inherited from its zygote), not a second later."""
    settings.SILENTBENCH_RUN_CGROUPS = False
    outcome = execute(hostile_run(RESERVES_AND_TOUCHES.format(reserve_mb=1, touch_mb=1536, parts=1), memory_mb=1024))
    assert (outcome.succeeded, outcome.failure_kind) == (False, "memory"), outcome.failure_reason
    assert "MemoryError" in outcome.stderr


def test_a_run_cannot_raise_its_open_files_and_runs_out_of_them():
    evidence = evidence_of(execute(hostile_run('''
import resource, socket
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
    raised = True
except (ValueError, OSError):
    raised = False
held = []
try:
    for _ in range(6000):
        held.append(socket.socketpair())
except OSError as error:
    stopped = error.strerror
oracle({"soft": soft, "hard": hard, "raised": raised, "pairs": len(held), "stopped": stopped})
''')))
    assert (evidence["soft"], evidence["hard"], evidence["raised"]) == (4096, 4096, False), evidence
    assert evidence["pairs"] < 2048 and evidence["stopped"] == "Too many open files", evidence


def test_the_system_call_filter_refuses_what_a_training_program_never_needs():
    assert seccomp.available(), "libseccomp is not installed: runs get no system-call filter"
    evidence = evidence_of(execute(hostile_run('''
import ctypes, errno, os, platform, threading
libc = ctypes.CDLL(None, use_errno=True)
numbers = {"x86_64": {"io_uring_setup": 425, "keyctl": 250, "add_key": 248, "request_key": 249, "ptrace": 101,
                      "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "unshare": 272, "setns": 308}}
refused = {}
for name, number in numbers[platform.machine()].items():
    result = libc.syscall(number, 0, 0, 0, 0, 0)
    refused[name] = errno.errorcode.get(ctypes.get_errno()) if result < 0 else "allowed"
refused["unshare(CLONE_NEWUSER)"] = "EPERM" if libc.unshare(0x10000000) < 0 and ctypes.get_errno() == 1 else "allowed"
refused["prctl(PR_SET_DUMPABLE, 0)"] = "EPERM" if libc.prctl(4, 0, 0, 0, 0) < 0 else "allowed"
child = os.fork()
if child == 0:
    os._exit(7)
forked = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
thread = threading.Thread(target=lambda: None)
thread.start()
thread.join()
oracle({"refused": refused, "forked": forked, "dumpable": libc.prctl(3, 0, 0, 0, 0)})
''')))
    assert set(evidence["refused"].values()) == {"EPERM"}, evidence["refused"]  # every one refused, none allowed
    assert evidence["forked"] == 7 and evidence["dumpable"] == 1  # what programs do still works


def test_a_key_of_one_run_is_not_there_for_the_next():
    """Under runc every container has a session keyring that its runs shared: run A's key was read by run B."""
    source = '''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
added = libc.syscall(248, b"user", b"silentbench-shared", b"secret", 6, -3)  # add_key to the session keyring
found = libc.syscall(249, b"user", b"silentbench-shared", None, 0)  # request_key
oracle({"added": added, "found": found, "errno": ctypes.get_errno()})
'''
    first, second = (evidence_of(execute(hostile_run(source))) for _ in range(2))
    assert first["added"] == -1 and second["found"] == -1 and second["errno"] == 1, (first, second)


MEMORY_HIDERS = '''
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        hidden = libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0: the worker may no longer read this process
        block = bytearray(300 * 2**20)  # touched: resident
        for offset in range(0, len(block), 4096):
            block[offset] = 1
        print("hidden" if hidden else "visible", flush=True)
        time.sleep(60)
        os._exit(0)
    children.append(pid)
time.sleep(30)
report = os.environ["SILENTBENCH_REPORT"]
with open(report, "a") as out:
    out.write('{"event": "oracle", "manifested": false}\\n')
'''


@pytest.fixture
def unprivileged():
    """The executor, copied where the unprivileged user can read it (the checkout may lie under /root), and a
    folder of that user's for its run directories: (the folder to put on PYTHONPATH, a run directory)."""
    assert os.geteuid() == 0, "these tests start a worker as another user"
    assert os.path.exists(SYSTEM_PYTHON), f"{SYSTEM_PYTHON} is needed to run a worker as uid {UNPRIVILEGED_UID}"
    base = Path(tempfile.mkdtemp(prefix="silentbench-unprivileged-", dir="/tmp"))
    package = base / "package" / "runners"
    shutil.copytree(ROOT / "runners" / "executor", package / "executor", ignore=shutil.ignore_patterns("__pycache__"))
    (package / "__init__.py").write_text("")
    for path in (base, package.parent, *package.parent.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    runs = base / "runs"
    workdir = runs / "run"
    workdir.mkdir(parents=True)
    (workdir / "hiders.py").write_text(MEMORY_HIDERS)
    (workdir / "honest.py").write_text(HONEST)
    for path in (runs, workdir, workdir / "hiders.py", workdir / "honest.py"):
        os.chown(path, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    yield package.parent, workdir
    shutil.rmtree(base, ignore_errors=True)


HONEST = '''
import os, time
block = bytearray(50 * 2**20)
for _ in range(3):  # a few seconds: the watch reads the run's processes many times
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    time.sleep(1)
print("trained", flush=True)
'''


WATCHED_AS_UNPRIVILEGED = '''
import json, sys
from runners.executor import Limits, Preload, run_sandboxed, isolation_layers
from runners.executor import cgroup_support
workdir, program = sys.argv[1], sys.argv[2]
limits = Limits(time_limit_seconds=60, memory_mb=768, user="")
environment = {"HOME": workdir, "PATH": "/usr/bin:/bin", "SILENTBENCH_REPORT": workdir + "/report"}
result = run_sandboxed(["/usr/bin/python3", program], workdir, environment, limits,
                       preload=Preload("none", "os:getpid", packages=()))
print(json.dumps({"ending": result.ending(), "layers": result.layers, "notes": result.notes, "stdout": result.stdout,
                  "cgroups": cgroup_support().version, "namespaces": isolation_layers()["namespaces"]}))
'''


def as_unprivileged(script, package, *arguments):
    """``script`` run by Debian's Python as uid 1000, with the copied executor importable; its last line, as JSON."""
    process = subprocess.run([SYSTEM_PYTHON, "-c", script, *arguments], user=UNPRIVILEGED_UID, group=UNPRIVILEGED_UID,
                             extra_groups=[], cwd=package, capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package), "HOME": str(package)})
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


def test_an_unprivileged_worker_still_counts_every_process_of_a_run(unprivileged):
    """The Docker images' worker runs as uid 1000, with no cgroup of its own to give runs. Four children hid
    themselves from its memory watch with PR_SET_DUMPABLE and held 4 x 300 MB under a 768 MB limit: the run
    ended well. Now the filter refuses to hide them, and the watch counts every process of the run."""
    package, workdir = unprivileged
    result = as_unprivileged(WATCHED_AS_UNPRIVILEGED, package, str(workdir), "hiders.py")
    assert result["namespaces"] and result["cgroups"] == 0, result  # sealed, but no cgroup: the watch decides
    assert "hidden" not in result["stdout"], result["stdout"]
    assert result["ending"] == "memory_exceeded", result
    assert not result["notes"], result["notes"]  # counted, not failed closed: no process of it hid
    assert "seccomp" in result["layers"], result["layers"]


def test_an_unprivileged_worker_runs_an_honest_program_to_its_end(unprivileged):
    """The run's own init makes itself unreadable to the worker (so that the program cannot trace it): the watch
    leaves it out, and a program that stays within its memory ends well."""
    package, workdir = unprivileged
    result = as_unprivileged(WATCHED_AS_UNPRIVILEGED, package, str(workdir), "honest.py")
    assert (result["ending"], result["stdout"].strip(), result["notes"]) == (None, "trained", []), result


HIDDEN_WORKER = '''
import json, sys
from runners.executor import Limits, Preload, hide_from_reproducers, isolation_layers, run_sandboxed
hide_from_reproducers()  # as a worker does as it starts (runners.worker)
workdir = sys.argv[1]
limits = Limits(time_limit_seconds=60, memory_mb=768, user="")
result = run_sandboxed(["/usr/bin/python3", "honest.py"], workdir, {"HOME": workdir, "PATH": "/usr/bin:/bin"}, limits,
                       preload=Preload("none", "os:getpid", packages=()))
print(json.dumps({"namespaces": isolation_layers()["namespaces"], "error": isolation_layers()["error"],
                  "layers": result.layers, "ending": result.ending(), "stdout": result.stdout}))
'''


def test_an_unprivileged_worker_that_hid_itself_still_seals_its_runs(unprivileged):
    """The images' worker (uid 1000) hides itself from its runs as it starts: not dumpable, its /proc files belong to
    root, and a run's child could not write its own user map (EACCES on /proc/self/setgroups). In a container the
    worker refused every run as unsealable; the child is dumpable for the three writes only."""
    package, workdir = unprivileged
    result = as_unprivileged(HIDDEN_WORKER, package, str(workdir))
    assert "user" in result["namespaces"] and not result["error"], result
    assert {"user namespace", "pid namespace", "network namespace"} <= set(result["layers"]), result
    assert (result["ending"], result["stdout"].strip()) == (None, "trained"), result


FAIL_CLOSED = '''
import ctypes, json, os, signal, socket, sys, time
from runners.executor.supervisor import _SealedRun
libc = ctypes.CDLL(None, use_errno=True)
init = os.fork()
if init == 0:
    child = os.fork()
    if child == 0:
        libc.prctl(4, 0, 0, 0, 0)  # outside any filter: this process makes itself unreadable to its own user
        time.sleep(30)
        os._exit(0)
    time.sleep(30)
    os._exit(0)
time.sleep(1)
watch = _SealedRun(socket.socketpair()[0])
watch.init_pid, watch.pidfd = init, os.pidfd_open(init)
print(json.dumps({"members": len(watch.members()), "memory": str(watch.memory_mb()), "note": watch.unreadable}))
os.kill(init, signal.SIGKILL)
'''


def test_the_memory_watch_fails_closed_on_a_process_it_cannot_read(unprivileged):
    """Without a cgroup the watch reads each process of the run; one it may not read counts as over any limit."""
    package, _ = unprivileged
    seen = as_unprivileged(FAIL_CLOSED, package)
    assert seen["members"] == 2 and seen["memory"] == "inf", seen
    assert "could not read the memory of process" in seen["note"]


def run_cgroups():
    return {os.path.join(directory, name) for directory in cgroups.support().parents.values()
            for name in os.listdir(directory) if name.startswith(cgroups.RUN_PREFIX)}


def test_a_runs_cgroup_is_rooted_at_its_own_and_removed_after_it():
    """The run executes in this process, whose PID names its cgroup; other processes' runs (a killed worker's
    leftovers, another suite on the machine) are not this test's."""
    mine = f"{cgroups.RUN_PREFIX}{os.getpid()}-"
    before = {path for path in run_cgroups() if os.path.basename(path).startswith(mine)}
    evidence = evidence_of(execute(hostile_run('oracle({"cgroup": open("/proc/self/cgroup").read()})')))
    lines = evidence["cgroup"].split()
    assert lines and all(line.endswith(":/") for line in lines), lines  # its own cgroup namespace, at its cgroup
    assert {path for path in run_cgroups() if os.path.basename(path).startswith(mine)} <= before


def test_the_empty_cgroups_of_a_dead_worker_are_removed_once_stale():
    """A worker killed with -9 cannot remove its run's cgroup; the next run of any worker removes it, once stale."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    hour_ago = time.time() - 3600
    made = {}
    for kind, owner, age in (("stale", dead.pid, hour_ago), ("fresh", dead.pid, None),
                             ("alive", os.getpid(), hour_ago)):
        made[kind] = [os.path.join(parent, f"{cgroups.RUN_PREFIX}{owner}-test{kind}")
                      for parent in cgroups.support().parents.values()]
        for path in made[kind]:
            os.mkdir(path)
            if age is not None:
                os.utime(path, (age, age))
    busy = [path + "-busy" for path in made["stale"]]  # a stale one that still holds a process stays
    sleeper = None
    try:
        for path in busy:
            os.mkdir(path)
            os.utime(path, (hour_ago, hour_ago))
        sleeper = subprocess.Popen(["sleep", "60"])
        for path in busy:
            Path(path, "cgroup.procs").write_text(str(sleeper.pid))
        execute(hostile_run('oracle({"ok": 1})'))
        left = run_cgroups()
        assert not set(made["stale"]) & left
        assert set(made["fresh"] + made["alive"] + busy) <= left
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        for path in made["fresh"] + made["alive"] + made["stale"] + busy:
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def test_a_runs_cgroup_holds_its_limits_and_the_same_cpu_share_as_every_run():
    support = cgroups.support()
    assert support.version, support.error
    cgroup = cgroups.RunCgroup(support, memory_mb=300, disk_mb=100, max_processes=64)
    try:
        read = {name: Path(directory, name).read_text().strip() for directory in cgroup.directories.values()
                for name in ("memory.limit_in_bytes", "pids.max", "cpu.shares", "memory.max", "cpu.weight")
                if Path(directory, name).exists()}
    finally:
        assert cgroup.remove() == ""
    if support.version == 1:
        assert read == {"memory.limit_in_bytes": str(400 * 2**20), "pids.max": "66", "cpu.shares": "1024"}, read
    else:
        assert read["memory.max"] == str(400 * 2**20) and read["pids.max"] == "66", read
    assert not any(os.path.exists(directory) for directory in cgroup.directories.values())


def test_a_reproducer_may_declare_more_open_files(settings):
    from runners.execution import run_limits

    from .factories import ReproducerVersionFactory

    version = ReproducerVersionFactory(manifest={"entrypoint": "repro.py", "needs": {"open_files": 10000}})
    assert run_limits(version).open_files == 10000
    settings.SILENTBENCH_MAX_OPEN_FILES = 8192
    assert run_limits(version).open_files == 8192
    assert run_limits(ReproducerVersionFactory()).open_files == settings.SILENTBENCH_OPEN_FILES == 4096


def test_the_workers_log_names_every_layer():
    line = describe_confinement(Limits(10, 512))
    assert "seccomp" in line and "session keyring" in line and "a cgroup v" in line, line


def test_a_run_without_namespaces_is_limited_in_memory_too(monkeypatch, tmp_path):
    """An operator's opt-in to runs without namespaces (no cgroup, no watch of a PID namespace): each process's
    private writable memory is limited (RLIMIT_DATA), so 1 GB under 256 MB fails as memory."""
    from runners.executor import run_sandboxed, supervisor
    from runners.failures import program_failure

    monkeypatch.setattr(supervisor, "isolation_layers", lambda: {"namespaces": [], "error": "unshare: not allowed"})
    (tmp_path / "big.py").write_text("block = bytearray(b'x' * 2**30)\nprint('held', len(block))\n")
    limits = Limits(time_limit_seconds=30, memory_mb=256, allow_unisolated=True)
    result = run_sandboxed([sys.executable, str(tmp_path / "big.py")], tmp_path, {"HOME": str(tmp_path)}, limits)
    assert "held" not in result.stdout
    failure = program_failure(result, limits)
    assert failure is not None and failure.kind == "memory", (failure, result.stderr[-2000:])
