"""A GPU node checks itself: before a worker offers a GPU, a CUDA probe runs on it as a run would (sealed, holding
that GPU's device nodes), and a GPU that fails it is not offered (runners.worker.startup); ``bin/gpu-check`` runs the
same probe unsealed and sealed for an operator.

The probe: ``cuInit`` through the driver library (its return code is the first thing a failed seal shows: 304,
CUDA_ERROR_OPERATING_SYSTEM), then torch: a matrix product on the GPU compared with the CPU's, and the GPU's free
memory. A GPU passes when all three hold.
"""
import json
import math
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings

from ..executor import Limits, run_sandboxed
from .routing import device_nodes

PROBE_SECONDS = 180  # a first CUDA context on a big GPU takes seconds; the import of a CUDA build of torch too
PROBE_MEMORY_MB = 8192  # what the probe may hold on the host: CUDA's context and torch's CUDA libraries
MATMUL_TOLERANCE = 1e-3  # the largest difference allowed between the GPU's product and the CPU's, relative to its size
CUDA_PROBE = r'''
import ctypes, json, sys
facts = {"cuinit": None, "torch": None, "cuda_available": False, "name": "", "matmul_error": None, "free_mb": None,
         "total_mb": None, "error": ""}
try:
    driver = ctypes.CDLL("libcuda.so.1")
    facts["cuinit"] = driver.cuInit(0)
except OSError as error:
    facts["error"] = f"the CUDA driver library does not load: {error}"
if facts["cuinit"] == 0:
    try:
        import torch
        facts["torch"] = torch.__version__
        facts["cuda_available"] = torch.cuda.is_available()
        if facts["cuda_available"]:
            facts["name"] = torch.cuda.get_device_name(0)
            generator = torch.Generator().manual_seed(0)
            a, b = (torch.randn(512, 512, generator=generator, dtype=torch.float64) for _ in range(2))
            on_cpu = a @ b
            on_gpu = (a.cuda() @ b.cuda()).cpu()
            facts["matmul_error"] = ((on_gpu - on_cpu).abs().max() / on_cpu.abs().max()).item()
            free, total = torch.cuda.mem_get_info()
            facts["free_mb"], facts["total_mb"] = free // 2**20, total // 2**20
        else:
            facts["error"] = "torch.cuda.is_available() is False"
    except Exception as error:  # noqa: BLE001 - the probe reports whatever went wrong
        facts["error"] = f"{type(error).__name__}: {error}"
print(json.dumps(facts))
'''


def verdict(facts):
    """'' when the probe's ``facts`` show a usable GPU, else why not (a sentence)."""
    if facts.get("error") and facts.get("cuinit") is None:
        return facts["error"]
    if facts.get("cuinit") != 0:
        return f"cuInit returned {facts.get('cuinit')}" + (" (CUDA_ERROR_OPERATING_SYSTEM)"
                                                           if facts.get("cuinit") == 304 else "")
    if facts.get("error"):
        return facts["error"]
    error = facts.get("matmul_error")
    if error is None or not math.isfinite(error) or error > MATMUL_TOLERANCE:  # NaN compares as small
        return f"a matrix product on the GPU differs from the CPU's by {facts.get('matmul_error')} (relative)"
    if not facts.get("free_mb"):
        return "the GPU has no free memory"
    return ""


def probe_limits():
    """The probe's limits: a run's, as this worker's settings make them (its sandbox user, cgroups, whether it may
    run without namespaces), with the probe's own time and memory. A cold start: warm runs fork from a zygote that
    imported torch without touching CUDA, into the same sealed view."""
    return Limits(time_limit_seconds=PROBE_SECONDS, memory_mb=PROBE_MEMORY_MB, threads=1,
                  user=settings.SILENTBENCH_SANDBOX_USER, own_cgroup=settings.SILENTBENCH_RUN_CGROUPS,
                  allow_unisolated=settings.SILENTBENCH_ALLOW_UNISOLATED, disk_mb=settings.SILENTBENCH_MAX_DISK_MB,
                  max_processes=settings.SILENTBENCH_MAX_PROCESSES, open_files=settings.SILENTBENCH_OPEN_FILES)


def probe_gpu(gpu, sealed=True):
    """Run the probe on ``gpu`` (an entry of gpu_inventory) with this interpreter, sealed as a run holding it or as a
    plain process; a record of what it found: index, name, sealed, passed, reason, the probe's facts, its seconds."""
    index = gpu["index"]
    env = {"PATH": "/usr/bin:/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(index)}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{index}-") as folder:
        (Path(folder) / "probe.py").write_text(CUDA_PROBE)
        env["HOME"] = folder
        limits = probe_limits()
        if sealed:
            result = run_sandboxed([sys.executable, "probe.py"], folder, env, limits, devices=device_nodes([index]))
            ended, stdout, stderr = result.ending(), result.stdout, result.refused or result.stderr
        else:
            try:
                done = subprocess.run([sys.executable, "probe.py"], cwd=folder, env=env, capture_output=True, text=True,
                                      timeout=PROBE_SECONDS)
                ended, stdout, stderr = (None if done.returncode == 0 else f"exit code {done.returncode}",
                                         done.stdout, done.stderr)
            except subprocess.TimeoutExpired:
                ended, stdout, stderr = f"still running after {PROBE_SECONDS} s", "", ""
    try:
        facts = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    except ValueError:
        facts = {}
    reason = verdict(facts) if facts else (f"the probe did not report ({ended or 'no output'}): "
                                           f"{stderr.strip()[-500:]}")
    return {"index": index, "name": facts.get("name") or gpu.get("name", ""), "sealed": sealed, "passed": not reason,
            "reason": reason, "facts": facts, "seconds": round(time.monotonic() - started, 1)}


def check_gpus(gpus, sealed=True):
    """The probe on every GPU of ``gpus`` at once (each on its own device)."""
    if not gpus:
        return []
    with ThreadPoolExecutor(len(gpus)) as pool:
        return list(pool.map(lambda gpu: probe_gpu(gpu, sealed=sealed), gpus))
