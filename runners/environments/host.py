"""What a worker host is: recorded with every run so that results can be compared across setups."""
import functools
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RECORDED_PACKAGES = ("torch", "numpy", "traincheck", "celery", "django")
GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits"]
# The lines of `nvidia-smi -q` that name the hardware and driver; the rest (temperatures, clocks,
# memory in use, timestamps) changes from one call to the next and stays out of the fingerprint.
STABLE_SMI_FIELDS = ("Attached GPUs", "Product Name", "GPU UUID", "VBIOS Version", "Driver Version", "CUDA Version",
                     "Total")


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_smi():
    """``nvidia-smi -q`` where a GPU driver exists; empty on CPU-only hosts."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        return subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def _nvidia_smi_gpus():
    """Every GPU ``nvidia-smi --query-gpu`` lists, as [{index, name, memory_mb, uuid}]; [] without a driver."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        output = subprocess.run(GPU_QUERY, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        memory = cells[2].split()[0] if cells[2] else ""
        gpus.append({"index": int(cells[0]), "name": cells[1],
                     "memory_mb": int(float(memory)) if memory.replace(".", "", 1).isdigit() else 0,
                     "uuid": cells[3] if len(cells) > 3 else ""})
    return gpus


_withheld_gpus: set[int] = set()  # GPUs this worker's self-check failed (runners.environments.gpu_check)


def withhold_gpus(indices):
    """As a worker sets up (before its pool forks): the GPUs it does not offer, whatever nvidia-smi says."""
    _withheld_gpus.clear()
    _withheld_gpus.update(indices)


def forget_gpus():
    """Read nvidia-smi again on the next call, and withhold nothing (tests that change the host)."""
    _nvidia_smi_gpus.cache_clear()
    _withheld_gpus.clear()


def gpu_inventory():
    """This host's GPUs that this worker offers, as [{index, name, memory_mb, uuid}] from nvidia-smi; [] without
    a driver. A worker started with ``CUDA_VISIBLE_DEVICES=2,3`` offers only those (nvidia-smi's indices are PCI bus
    order, as runs see them: the sandbox sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), and none its self-check failed."""
    gpus = [gpu for gpu in _nvidia_smi_gpus() if gpu["index"] not in _withheld_gpus]
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if allowed is not None and all(part.strip().isdigit() for part in allowed.split(",") if part.strip()):
        indices = {int(part) for part in allowed.split(",") if part.strip()}
        gpus = [gpu for gpu in gpus if gpu["index"] in indices]
    return gpus


def host_memory_mb():
    """Physical memory, or the container's memory limit when that is lower."""
    total = 0
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) // 1024
                    break
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text(encoding="utf-8").strip()
    except OSError:
        limit = ""
    if limit.isdigit():
        total = min(total, int(limit) // 2**20) if total else int(limit) // 2**20
    return total


def torch_cuda(torch_version):
    """The CUDA a torch wheel was built for, from its local version label (``2.13.0+cu128`` → ``12.8``)."""
    label = torch_version.partition("+")[2]
    if label.startswith("cu") and label[2:].isdigit() and len(label) >= 4:
        return f"{label[2:-1]}.{label[-1]}"
    return ""


def _stable_smi(smi_text):
    return "\n".join(line.strip() for line in smi_text.splitlines() if line.strip().startswith(STABLE_SMI_FIELDS))


def _field(smi_text, name):
    for line in smi_text.splitlines():
        if line.strip().startswith(name) and ":" in line:
            return line.split(":", 1)[1].strip()
    return ""


@functools.cache
def host_facts():
    packages = {}
    for name in RECORDED_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    smi = _nvidia_smi()
    facts = {
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": packages,
        "gpu": _field(smi, "Product Name"),
        "gpu_driver": _field(smi, "Driver Version"),
        "cuda": _field(smi, "CUDA Version"),
        "nvidia_smi": smi[:20000],
    }
    stable = {**facts, "nvidia_smi": _stable_smi(smi)}
    facts["fingerprint"] = hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()
    return facts


CAPABILITY_FACTS = ("cpu", "cpu_count", "gpu", "cuda", "python", "packages")


def host_capabilities():
    """What this host offers runs: its GPUs (nvidia-smi), memory, CUDA and torch, besides the host facts."""
    facts = host_facts()
    torch = facts["packages"].get("torch", "")
    return {**{key: facts[key] for key in CAPABILITY_FACTS}, "gpus": gpu_inventory(), "memory_mb": host_memory_mb(),
            "torch": torch, "torch_cuda": torch_cuda(torch)}


_worker_concurrency = 1  # runs this process's worker runs at once (share_cores_among); 1 outside a worker


def share_cores_among(concurrency: int) -> None:
    """As a worker sets up (before its pool forks): its runs share this host's cores ``concurrency`` ways."""
    global _worker_concurrency
    _worker_concurrency = max(1, concurrency)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or a numactl's cpuset)."""
    return len(os.sched_getaffinity(0))


def cores_per_run() -> int:
    """Each run's share of the cores: max(1, cores // the worker's concurrency)."""
    return max(1, usable_cores() // _worker_concurrency)
