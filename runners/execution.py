"""Execute one run: materialize the exact reproducer version, sandbox it, parse its report."""
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from django.conf import settings

from .detectors import get_plugin
from .report import parse_report
from .sandbox import Limits, run_sandboxed

PROBE_DIR = Path(__file__).resolve().parent / "probe"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Passed through because some CPUs need them for correct BLAS results; nothing secret.
PASSTHROUGH_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG", "TZ")


@dataclass
class RunOutcome:
    succeeded: bool
    failure_reason: str
    exit_code: int | None
    wall_seconds: float
    stdout: str
    stderr: str
    output_truncated: bool
    oracle: dict | None = None
    trigger_step: int | None = None
    trigger_time: float | None = None
    steps: list = field(default_factory=list)
    alarms: list = field(default_factory=list)
    protocol_errors: list = field(default_factory=list)


def materialize(files, workdir):
    """Write the version's files under ``workdir``, refusing any path that would escape it."""
    for relative, text in files.items():
        path = PurePosixPath(relative)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"refusing reproducer file path {relative!r}")
        target = Path(workdir, *path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def scrubbed_environment(workdir, report_path, detector_name, detector_config, instrumented):
    """The run's whole environment: built from nothing, so no secret or credential leaks in."""
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(workdir),
        "TMPDIR": str(Path(workdir, "tmp")),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "SILENTBENCH_REPORT": str(report_path),
    }
    env.update({name: os.environ[name] for name in PASSTHROUGH_ENV if name in os.environ})
    if instrumented:
        env["PYTHONPATH"] = os.pathsep.join([str(PROBE_DIR), str(REPO_ROOT)])
        env["SILENTBENCH_DETECTOR"] = detector_name
        env["SILENTBENCH_DETECTOR_CONFIG"] = json.dumps(detector_config)
    return env


def run_limits(version):
    return Limits(
        time_limit_seconds=min(version.time_limit_seconds, settings.SILENTBENCH_MAX_TIME_LIMIT),
        memory_mb=min(version.memory_mb, settings.SILENTBENCH_MAX_MEMORY_MB),
        log_cap_bytes=settings.SILENTBENCH_LOG_CAP_BYTES,
        flood_bytes=settings.SILENTBENCH_OUTPUT_FLOOD_BYTES,
    )


def execute(run):
    """Run ``run`` to completion in a fresh directory; always returns an outcome, never a half state."""
    version = run.reproducer_version
    plugin = get_plugin(run.detector.name)
    limits = run_limits(version)
    settings.SILENTBENCH_RUN_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run.pk}-", dir=settings.SILENTBENCH_RUN_DIR))
    try:
        (workdir / "tmp").mkdir()
        report_path = workdir / ".silentbench-report.jsonl"
        materialize(version.files, workdir)
        env = scrubbed_environment(workdir, report_path, plugin.name, run.detector.config, plugin.instruments)
        argv = [sys.executable, version.entrypoint, "--variant", run.variant,
                "--seed", str(run.seed), "--steps", str(run.steps)]
        result = run_sandboxed(argv, workdir, env, limits)
        report_text = _read_capped(report_path, settings.SILENTBENCH_REPORT_CAP_BYTES)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    report = parse_report(report_text)
    reason = result.failure_reason(limits)
    if not reason and report.oracle is None:
        reason = ("No oracle report: the reproducer exited normally but wrote no 'oracle' record "
                  "(see docs/reproducer-protocol.md).")
    return RunOutcome(
        succeeded=not reason,
        failure_reason=reason,
        exit_code=result.exit_code,
        wall_seconds=result.wall_seconds,
        stdout=result.stdout,
        stderr=result.stderr,
        output_truncated=result.output_truncated,
        oracle=report.oracle,
        trigger_step=report.trigger_step,
        trigger_time=report.trigger_time(),
        steps=report.steps,
        alarms=report.alarms,
        protocol_errors=report.errors,
    )


def _read_capped(path, cap):
    if not path.exists():
        return ""
    with open(path, "rb") as report:
        return report.read(cap).decode("utf-8", "replace")
