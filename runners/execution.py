"""Execute one run: materialize the exact reproducer version, sandbox it, parse its report."""
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from django.conf import settings

from .detectors import get_plugin
from .detectors.base import RunContext
from .failures import no_oracle_report, offline_check_failed, sandbox_kind
from .models import RunFailureKind
from .report import parse_report
from .routing import visible_devices
from .sandbox import Limits, run_sandboxed

PROBE_DIR = Path(__file__).resolve().parent / "probe"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Passed through because some CPUs need them for correct BLAS results; nothing secret.
PASSTHROUGH_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG", "TZ")


@dataclass
class RunOutcome:
    succeeded: bool
    failure_reason: str
    failure_kind: str  # a RunFailureKind; '' when it succeeded
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
    analysis_seconds: float | None = None
    detector_summary: dict = field(default_factory=dict)


def materialize(files, workdir):
    """Write the version's files under ``workdir``, refusing any path that would escape it."""
    for relative, text in files.items():
        path = PurePosixPath(relative)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"refusing reproducer file path {relative!r}")
        target = Path(workdir, *path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def scrubbed_environment(workdir, report_path, detector_name, detector_config, instrumented, devices=()):
    """The run's whole environment: built from nothing, so no secret or credential leaks in. It sees only
    the GPUs it holds (``devices``, nvidia-smi's indices); none at all when it holds none."""
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(workdir),
        "TMPDIR": str(Path(workdir, "tmp")),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "SILENTBENCH_REPORT": str(report_path),
        "CUDA_VISIBLE_DEVICES": visible_devices(devices),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
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
        max_processes=settings.SILENTBENCH_MAX_PROCESSES,
        user=settings.SILENTBENCH_SANDBOX_USER,
    )


class UnapprovedVersion(PermissionError):
    """``execute`` was asked to run a version no maintainer approved."""


def execute(run, devices=()):
    """Run ``run`` to completion in a fresh directory, on the GPUs ``devices`` it holds; always returns
    an outcome, never a half state.

    A detector that works from outside (TrainCheck) wraps the command and checks the run's trace
    afterwards, while the directory still exists; its offline time is measured apart.
    """
    version = run.reproducer_version
    if not version.is_approved:  # every caller comes through here: unapproved code never starts
        raise UnapprovedVersion(f"{version} is not approved by a maintainer; it cannot run.")
    plugin = get_plugin(run.detector.name)
    base_limits = run_limits(version)
    limits = replace(base_limits, time_limit_seconds=base_limits.time_limit_seconds * plugin.time_limit_factor)
    settings.SILENTBENCH_RUN_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run.pk}-", dir=settings.SILENTBENCH_RUN_DIR))
    analysis_error, analysis_seconds, offline_alarms = "", None, []
    try:
        (workdir / "tmp").mkdir()
        report_path = workdir / ".silentbench-report.jsonl"
        materialize(version.files, workdir)
        env = scrubbed_environment(workdir, report_path, plugin.name, run.detector.config, plugin.instruments,
                                   devices)
        env.update(plugin.environment(run.detector.config))
        context = RunContext(workdir=workdir, entrypoint=version.entrypoint, config=run.detector.config, env=env,
                             limits=limits, fit_artifact=run.fit_artifact.content if run.fit_artifact else None)
        argv = [sys.executable, version.entrypoint, "--variant", run.variant,
                "--seed", str(run.seed), "--steps", str(run.steps)]
        result = run_sandboxed(plugin.command(argv, context), workdir, env, limits)
        report = parse_report(_read_capped(report_path, settings.SILENTBENCH_REPORT_CAP_BYTES))
        failure = result.failure(limits)
        if failure is None:
            started = time.monotonic()
            try:
                offline_alarms = plugin.analyze(context, report)
            except RuntimeError as error:
                analysis_error = offline_check_failed(error)
            analysis_seconds = time.monotonic() - started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    kind, reason = "", ""
    if failure is not None:
        kind, reason = sandbox_kind(failure), failure.reason
    elif analysis_error:
        kind, reason = RunFailureKind.INTERNAL, analysis_error
    elif report.oracle is None:
        kind, reason = RunFailureKind.PROTOCOL, no_oracle_report()
    return RunOutcome(
        succeeded=not reason,
        failure_reason=reason,
        failure_kind=kind,
        exit_code=result.exit_code,
        wall_seconds=result.wall_seconds,
        stdout=result.stdout,
        stderr=result.stderr,
        output_truncated=result.output_truncated,
        oracle=report.oracle,
        trigger_step=report.trigger_step,
        trigger_time=report.trigger_time(),
        steps=report.steps,
        alarms=report.alarms + offline_alarms,
        protocol_errors=report.errors,
        analysis_seconds=analysis_seconds,
        detector_summary=context.summary,
    )


def _read_capped(path, cap):
    if not path.exists():
        return ""
    with open(path, "rb") as report:
        return report.read(cap).decode("utf-8", "replace")
