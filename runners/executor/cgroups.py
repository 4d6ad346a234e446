"""Each sealed run's own cgroup: the kernel's account of its memory (kernel memory such as socket buffers and pipe
buffers included), of its processes, and its share of the CPU.

Where the worker may create cgroups below its own (a root worker; or an operator's delegation), every run gets one
child cgroup per controller, which its launcher joins before it seals the run (so the run's own cgroup namespace is
rooted at it, and everything the run starts is in it):

- **memory**: the kernel's limit is the run's ``memory_mb`` plus its ``disk_mb`` (the files of its tmpfs are memory
  too, and are charged to it), and the worker watches what the cgroup holds *besides* those files against
  ``memory_mb``: resident memory, kernel memory and socket buffers alike;
- **pids**: at most ``max_processes`` tasks (processes and threads) of the program, whatever user they run as, and
  the run's launcher and init besides (``OWN_TASKS``);
- **cpu**: the same share for every run (``cpu.shares`` 1024, or ``cpu.weight`` 100): a run with many threads no
  longer takes more of the CPU than a run beside it with one.

Two layouts: cgroup v1, the controllers mounted apart (``/sys/fs/cgroup/memory`` and so on, as on these machines),
where a child of the worker's cgroup is made in each; and cgroup v2, one hierarchy, where the worker's cgroup, or the
parent of the leaf it lives in, delegates ``memory`` and ``pids`` to its children (their ``cgroup.subtree_control``
lists them: systemd's ``Delegate=yes`` with the worker in a leaf of its own, or a container's cgroup prepared so by
its entry point). Without either, runs get no cgroup and
the worker's watch of their memory reads each process (``supervisor``), failing closed.
"""
import functools
import logging
import os
import time
import uuid
from dataclasses import dataclass, field

CONTROLLERS = ("memory", "pids", "cpu")  # cgroup v1: one hierarchy each; v2: one hierarchy for all
CPU_SHARES, CPU_WEIGHT = 1024, 100  # every run the same share (the defaults of a new cgroup, stated)
OWN_TASKS = 2  # the run's launcher and its init, in its cgroup with the program
REMOVE_WAIT_SECONDS = 5.0  # how long a run's cgroup may take to empty after its last process died
RUN_PREFIX = "silentbench-run-"  # then the PID of the worker that made it, and a random part
STALE_AFTER_SECONDS = 600.0  # a leftover is removed only this long after it was made (a worker's first zygote
# start, between the cgroup's making and the run's joining it, takes well under this)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Support:
    """What this worker can do with cgroups: ``version`` 1 or 2 (0: none, ``error`` says why), and the directory of
    its own cgroup in each hierarchy it makes runs' cgroups in."""

    version: int
    parents: dict[str, str] = field(default_factory=dict)  # controller (v2: "unified") -> the worker's cgroup
    error: str = ""

    def describe(self) -> str:
        if not self.version:
            return f"no cgroup per run ({self.error})"
        return f"a cgroup v{self.version} per run ({', '.join(CONTROLLERS)})"


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, options) of the cgroup file systems this process sees."""
    mounts = []
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            before, _, after = line.partition(" - ")
            fields, rest = before.split(), after.split()
            if rest and rest[0] in ("cgroup", "cgroup2"):
                options = set(fields[5].split(",")) | set(rest[2].split(",") if len(rest) > 2 else [])
                mounts.append((fields[4], rest[0], options))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """{controller or "unified": path} of this process's cgroups, from /proc/self/cgroup."""
    own = {}
    with open("/proc/self/cgroup", encoding="utf-8") as cgroups:
        for line in cgroups:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if number == "0" and not controllers:
                own["unified"] = path
            for controller in controllers.split(","):
                if controller:
                    own[controller] = path
    return own


def _can_make_children(directory: str) -> str:
    """'' when a child cgroup can be made (and removed) in ``directory``, else why not."""
    probe = os.path.join(directory, f"silentbench-probe-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as error:
        return f"{directory}: {error.strerror}"
    return ""


@functools.cache
def support() -> Support:
    """Which cgroups this worker can give its runs; probed once."""
    try:
        mounts, own = _mounts(), _own_cgroups()
    except OSError as error:
        return Support(0, error=str(error))
    v1 = {controller: mount for mount, kind, options in mounts if kind == "cgroup"
          for controller in CONTROLLERS if controller in options}
    if all(controller in v1 and controller in own for controller in CONTROLLERS):
        parents = {controller: os.path.join(v1[controller], own[controller].lstrip("/")) for controller in CONTROLLERS}
        problems = [problem for problem in map(_can_make_children, parents.values()) if problem]
        return Support(1, parents) if not problems else Support(0, error="; ".join(problems))
    unified = next((mount for mount, kind, _ in mounts if kind == "cgroup2"), None)
    if unified is None or "unified" not in own:
        return Support(0, error="no cgroup v1 memory, pids and cpu hierarchies, and no cgroup v2")
    worker = os.path.join(unified, own["unified"].lstrip("/"))
    problems = []
    # The worker's own cgroup, where it may enable controllers for children (a cgroup namespace's root); else its
    # parent, where the worker lives in a leaf of a delegated subtree (the kernel lets no cgroup that holds processes
    # enable controllers for its children, so a delegation puts the worker in a leaf beside its runs).
    for parent in dict.fromkeys([worker, os.path.dirname(worker)]):
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), encoding="utf-8") as control:
                delegated = set(control.read().split())
        except OSError as error:
            problems.append(f"{parent}: {error.strerror}")
            continue
        if not {"memory", "pids"} <= delegated:
            problems.append(f"{parent} does not delegate memory and pids to its children "
                            f"(cgroup.subtree_control: {' '.join(sorted(delegated)) or 'empty'})")
            continue
        problem = _can_make_children(parent)
        if not problem:
            return Support(2, {"unified": parent})
        problems.append(problem)
    return Support(0, error="; ".join(problems))


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_leftovers(support: Support) -> list[str]:
    """Remove the empty cgroups that runs of a dead worker left behind, and return their paths.

    A worker removes each run's cgroup after the run, but one killed with -9 (or by the kernel's OOM killer) cannot;
    its runs die with it (``PR_SET_PDEATHSIG``), so what stays is an empty directory. One is removed when the worker
    named in it is no longer a process here and it was made ``STALE_AFTER_SECONDS`` ago; a cgroup that still holds a
    process is never touched (the kernel refuses to remove it)."""
    removed = []
    now = time.time()
    for parent in support.parents.values():
        try:
            names = [name for name in os.listdir(parent) if name.startswith(RUN_PREFIX)]
        except OSError:
            continue
        for name in names:
            owner = name[len(RUN_PREFIX):].split("-", 1)[0]
            path = os.path.join(parent, name)
            try:
                if (not owner.isdigit() or _process_exists(int(owner))
                        or now - os.stat(path).st_mtime < STALE_AFTER_SECONDS):
                    continue
                os.rmdir(path)
            except OSError:
                continue  # still in use, or another worker removed it first
            removed.append(path)
    return removed


def _write(directory: str, name: str, value: str | int) -> None:
    with open(os.path.join(directory, name), "w", encoding="ascii") as control:
        control.write(str(value))


def _read_stat(path: str) -> dict[str, int]:
    values = {}
    with open(path, encoding="ascii") as stat:
        for line in stat:
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                values[key] = int(value)
    return values


class RunCgroup:
    """The cgroup(s) of one run, made by the worker before the run and removed after it."""

    def __init__(self, support: Support, memory_mb: int, disk_mb: int, max_processes: int) -> None:
        self.version = support.version
        for leftover in remove_leftovers(support):
            logger.info("removed the cgroup %s, left behind by a worker that is gone", leftover)
        name = f"{RUN_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.directories = {controller: os.path.join(parent, name) for controller, parent in support.parents.items()}
        limit = (memory_mb + disk_mb) * 1024 * 1024
        try:
            for directory in self.directories.values():
                os.mkdir(directory)
            if self.version == 1:
                memory = self.directories["memory"]
                _write(memory, "memory.limit_in_bytes", limit)
                if os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")):
                    _write(memory, "memory.memsw.limit_in_bytes", limit)  # no swap beyond the limit either
                _write(self.directories["pids"], "pids.max", max_processes + OWN_TASKS)
                _write(self.directories["cpu"], "cpu.shares", CPU_SHARES)
            else:
                unified = self.directories["unified"]
                _write(unified, "memory.max", limit)
                if os.path.exists(os.path.join(unified, "memory.swap.max")):
                    _write(unified, "memory.swap.max", 0)
                _write(unified, "pids.max", max_processes + OWN_TASKS)
                if os.path.exists(os.path.join(unified, "cpu.weight")):
                    _write(unified, "cpu.weight", CPU_WEIGHT)
        except BaseException:
            self.remove(wait=False)
            raise

    @property
    def procs_files(self) -> list[str]:
        """What the run's launcher writes its PID to, to join (``cgroup.procs`` of each)."""
        return [os.path.join(directory, "cgroup.procs") for directory in self.directories.values()]

    def _memory_directory(self) -> str:
        return self.directories["memory" if self.version == 1 else "unified"]

    def memory_mb(self) -> float:
        """What the run holds now besides files: resident memory, kernel memory, socket and pipe buffers. The files of
        its tmpfs (shmem) and the page cache of files it read or wrote, which the kernel reclaims as it needs, are
        left out."""
        directory = self._memory_directory()
        usage = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        with open(os.path.join(directory, usage), encoding="ascii") as current:
            total = int(current.read())
        stat = _read_stat(os.path.join(directory, "memory.stat"))
        prefix = "total_" if self.version == 1 else ""  # v1: the cgroup and its children, as usage counts them
        files = sum(stat.get(prefix + name, stat.get(name, 0)) for name in ("shmem", "active_file", "inactive_file"))
        return max(0, total - files) / 2**20

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run at its memory limit."""
        directory = self._memory_directory()
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            return _read_stat(os.path.join(directory, name)).get("oom_kill", 0) > 0
        except OSError:
            return False

    def remove(self, wait: bool = True) -> str:
        """Remove the run's cgroups once its last process has left them; '' or why one stays."""
        deadline = time.monotonic() + (REMOVE_WAIT_SECONDS if wait else 0)
        left = ""
        for directory in self.directories.values():
            while True:
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError as error:
                    if time.monotonic() >= deadline:
                        left = f"{directory}: {error.strerror}"
                        break
                    time.sleep(0.05)
        return left
