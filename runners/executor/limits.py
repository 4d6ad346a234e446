"""What one sealed run may use: time, memory, output, files, processes, threads, disk."""
from dataclasses import dataclass

# Read by OpenMP (and so torch's intra-op pool), MKL and OpenBLAS as they load: a cold start gets its budget here.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class Limits:
    time_limit_seconds: float
    # What the run holds in memory, all its processes together: the kernel's account of its cgroup where the worker
    # can make one, else the PSS of each of its processes (runners.executor.supervisor). Never address space.
    memory_mb: int
    log_cap_bytes: int = 64 * 1024
    flood_bytes: int = 32 * 1024 * 1024
    file_size_mb: int = 256
    # Processes and threads of the program's user (RLIMIT_NPROC counts per user: all of the worker's
    # when it runs unprivileged, only the sandbox's when a root worker switches to ``user``).
    max_processes: int = 512
    user: str = "nobody"  # who runs the program when the worker is root ("" keeps root: tests only)
    disk_mb: int = 1024  # the run directory, /tmp and /dev/shm together (sealed runs)
    open_files: int = 4096  # file descriptors a process of the run may hold (RLIMIT_NOFILE)
    threads: int = 0  # its CPU threads (OpenMP, MKL, OpenBLAS, torch's intra-op pool); 0 leaves the libraries' default
    own_cgroup: bool = True  # a cgroup of its own where the worker can make one (runners.executor.cgroups)
    allow_unisolated: bool = False  # run without namespaces where the kernel has none (an operator's opt-in)
    teardown_grace_seconds: float = 10.0  # after the oracle record, how long its processes may take to end
    report_cap_bytes: int = 16 * 1024 * 1024
    warm_start: bool = True  # a detector's own phases (TrainCheck's) may fork from a zygote (sealed runs only)


def thread_environment(threads: int) -> dict[str, str]:
    """The variables that give a program ``threads`` CPU threads as its libraries load (none for 0)."""
    return {name: str(threads) for name in THREAD_VARIABLES} if threads else {}
