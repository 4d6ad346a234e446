"""What one sealed run may use: time, memory, output, files, processes, disk."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    time_limit_seconds: float
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
    own_cgroup: bool = True  # a cgroup of its own where the worker can make one (runners.executor.cgroups)
    allow_unisolated: bool = False  # run without namespaces where the kernel has none (an operator's opt-in)
    teardown_grace_seconds: float = 10.0  # after the oracle record, how long its processes may take to end
    report_cap_bytes: int = 16 * 1024 * 1024
    warm_start: bool = True  # a detector's own phases (TrainCheck's) may fork from a zygote (sealed runs only)
    # Added to ``memory_mb`` in the per-process address-space limit (RLIMIT_AS) only: what the libraries of
    # another Python environment map beyond the default one's (a CUDA build of torch maps 2.3 to 3.7 GB more on import:
    # runners.environments.python_environments). The watch of the run's real memory stays at ``memory_mb``.
    address_space_extra_mb: int = 0

    @property
    def address_space_mb(self) -> int:
        """The per-process address-space limit (RLIMIT_AS)."""
        return self.memory_mb + self.address_space_extra_mb
