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

RECORDED_PACKAGES = ("torch", "numpy", "traincheck", "celery", "django")


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
    facts["fingerprint"] = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
    return facts
