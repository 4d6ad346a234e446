"""Execute one run: materialize the exact reproducer version, sandbox it, parse its report."""
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from django.conf import settings

from bugs.submissions import MANIFEST_NAME

from . import compile_cache
from .detector_versions.registry import plugin_for
from .detector_versions.submitted import SubmittedPlugin
from .detectors.base import DETECTOR_MODULE_ENV, PROBE_START, RunContext
from .environments import host
from .environments.python_environments import environment_python, is_default, missing_packages
from .environments.routing import device_nodes, visible_devices
from .executor import Limits, run_sandboxed
from .failures import (
    DetectorSetupFailed,
    RunRefused,
    Unapproved,
    Unservable,
    environment_lacks_packages,
    error_text,
    kind_of,
    no_oracle_report,
    offline_check_failed,
    program_failure,
    too_many_records,
)
from .report import MAX_ALARMS, RecordCaps, parse_report

PROBE_DIR = Path(__file__).resolve().parent / "detectors" / "probe"
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
    execution: dict = field(default_factory=dict)  # how it ran: start, layers, notes (Run.execution)


def materialize(files, workdir):
    """Write the version's files under ``workdir``, refusing any path that would escape it. Its manifest stays out:
    the program needs its code only, and a clean pipeline's manifest would tell it from a bug's reproducer to code in
    its process (the canaries: evaluation.integrity)."""
    for relative, text in files.items():
        if relative == MANIFEST_NAME:
            continue
        path = PurePosixPath(relative)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"refusing reproducer file path {relative!r}")
        target = Path(workdir, *path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def scrubbed_environment(workdir, report_path, detector_name, detector_config, instrumented, devices=(),
                         alarm_key="", python=None):
    """The run's whole environment: built from nothing, so no secret or credential leaks in. It sees only
    the GPUs it holds (``devices``, nvidia-smi's indices); none at all when it holds none. ``python``: the
    interpreter it runs on, first on its PATH (None: this process's own)."""
    env = {
        "PATH": os.pathsep.join([str(Path(python or sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
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
        env["SILENTBENCH_ALARM_KEY"] = alarm_key  # the probe takes it out of the environment as it starts
    return env


# Names a reproducer's declared environment may not set: the runner's own, and what finds the interpreter.
RESERVED_ENV = re.compile(r"^(SILENTBENCH_|PYTHON|LD_|PATH$|HOME$|TMPDIR$|CUDA_VISIBLE_DEVICES$)")


def declared_environment(version):
    """The environment variables the version's manifest declares (``needs.environment``), reserved names left
    out. They must be set before torch is imported, so such a run starts cold."""
    declared = (version.manifest.get("needs") or {}).get("environment") or {}
    if not isinstance(declared, dict):
        return {}
    return {str(name): str(value) for name, value in declared.items() if not RESERVED_ENV.match(str(name))}


def cold_start_reason(plugin, argv, command, declared, devices=()):
    """Why a run cannot start warm (forked from the zygote), or '' when it can."""
    if not settings.SILENTBENCH_WARM_START:
        return "warm starts are turned off on this worker (SILENTBENCH_WARM_START=false)"
    if devices:
        return "it holds GPUs: CUDA does not survive a fork, and its ranks must start anew"
    if command[0] != argv[0]:  # not ``python script args``: an outside tool's own command
        return f"the detector {plugin.name} runs the reproducer through its own command"
    if declared:
        return "the reproducer declares environment variables, which must be set before torch is imported"
    return ""


def open_files(version):
    """The open files a run of ``version`` may hold: SILENTBENCH_OPEN_FILES, or more where its manifest declares more
    (``needs.open_files``), up to SILENTBENCH_MAX_OPEN_FILES."""
    declared = (version.manifest.get("needs") or {}).get("open_files")
    wanted = declared if isinstance(declared, int) and not isinstance(declared, bool) else 0
    return min(max(settings.SILENTBENCH_OPEN_FILES, wanted), settings.SILENTBENCH_MAX_OPEN_FILES)


def run_threads(version):
    """The CPU threads a run of ``version`` gets: SILENTBENCH_RUN_THREADS, else its share of the worker's cores; more
    where its manifest declares more (``needs.threads``), up to the cores."""
    declared = (version.manifest.get("needs") or {}).get("threads")
    wanted = declared if isinstance(declared, int) and not isinstance(declared, bool) else 0
    return max(settings.SILENTBENCH_RUN_THREADS or host.cores_per_run(), min(wanted, host.usable_cores()))


def run_limits(version):
    return Limits(
        time_limit_seconds=min(version.time_limit_seconds, settings.SILENTBENCH_MAX_TIME_LIMIT),
        memory_mb=min(version.memory_mb, settings.SILENTBENCH_MAX_MEMORY_MB),
        log_cap_bytes=settings.SILENTBENCH_LOG_CAP_BYTES,
        flood_bytes=settings.SILENTBENCH_OUTPUT_FLOOD_BYTES,
        max_processes=settings.SILENTBENCH_MAX_PROCESSES,
        open_files=open_files(version),
        threads=run_threads(version),
        own_cgroup=settings.SILENTBENCH_RUN_CGROUPS,
        user=settings.SILENTBENCH_SANDBOX_USER,
        disk_mb=settings.SILENTBENCH_MAX_DISK_MB,
        allow_unisolated=settings.SILENTBENCH_ALLOW_UNISOLATED,
        teardown_grace_seconds=settings.SILENTBENCH_TEARDOWN_GRACE_SECONDS,
        report_cap_bytes=settings.SILENTBENCH_REPORT_CAP_BYTES,
        warm_start=settings.SILENTBENCH_WARM_START,
    )


def forged_alarms_note(count):
    return (f"{count} alarm record(s) without the detector probe's signature were refused: alarms come only from "
            "detectors, never from the reproducer.")


def refused(refusal, summary=None):
    """The outcome of a run refused before its program ran (``refusal``, a RunRefused): nothing ran."""
    return RunOutcome(succeeded=False, failure_reason=refusal.reason, failure_kind=refusal.kind, exit_code=None,
                      wall_seconds=0.0, stdout="", stderr="", output_truncated=False, detector_summary=summary or {})


def execute(run, devices=()):
    """Run ``run`` to completion in a fresh directory, on the GPUs ``devices`` it holds; always returns
    an outcome, never a half state.

    A detector that works from outside (TrainCheck) runs its own copy of the script and checks the run's
    trace afterwards, while the directory still exists; its offline time is measured apart. A submitted
    detector's code is never imported here: its probe is imported inside the run's sandbox and its offline
    check runs in a sandbox of its own (runners.detector_versions.submitted). A refusal before the program runs
    (a RunRefused: not approved, an environment this worker cannot serve, the detector's preparation) is the
    outcome, with what the detector noted so far.
    """
    summary = {}
    try:
        return _execute(run, devices, summary)
    except RunRefused as refusal:
        return refused(refusal, summary)


def _execute(run, devices, summary):
    version = run.reproducer_version
    if not version.is_approved:  # every caller comes through here: unapproved code never starts
        raise Unapproved(f"{version} is not approved by a maintainer; it cannot run.")
    plugin = plugin_for(run.detector)
    environment, python = run.python_environment, None
    if not is_default(environment):  # another torch release: its own interpreter, sealed the same way
        missing = missing_packages(plugin, environment)
        if missing:
            raise Unservable(environment_lacks_packages(plugin.name, environment.name, missing))
        python = environment_python(environment)
    base_limits = run_limits(version)
    limits = replace(base_limits, time_limit_seconds=base_limits.time_limit_seconds * plugin.time_limit_factor)
    settings.SILENTBENCH_RUN_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run.pk}-", dir=settings.SILENTBENCH_RUN_DIR))
    analysis_error, analysis_seconds, offline_alarms = "", None, []
    cached_files = compiled_files = 0
    cache_error = ""
    alarm_key = secrets.token_hex(16) if plugin.instruments else ""  # no probe, no alarm from inside
    try:
        (workdir / "tmp").mkdir()
        report_path = workdir / ".silentbench-report.jsonl"
        materialize(version.files, workdir)
        cached_files = compile_cache.seed(workdir, version)
        env = scrubbed_environment(workdir, report_path, plugin.name, run.detector.config, plugin.instruments,
                                   devices, alarm_key, python)
        env.update(compile_cache.environment(workdir))
        if isinstance(plugin, SubmittedPlugin) and plugin.instruments:  # imported by the probe, in the sandbox only
            env[DETECTOR_MODULE_ENV] = str(plugin.write_module(workdir))
        env.update(plugin.environment(run.detector.config))
        declared = declared_environment(version)
        env.update(declared)
        context = RunContext(workdir=workdir, entrypoint=version.entrypoint, config=run.detector.config, env=env,
                             limits=limits, fit_artifact=run.fit_artifact.content if run.fit_artifact else None,
                             summary=summary)
        argv = [str(python or sys.executable), version.entrypoint, "--variant", run.variant,
                "--seed", str(run.seed), "--steps", str(run.steps)]
        try:
            command = plugin.command(argv, context)
        except RuntimeError as error:  # the detector's own preparation (TrainCheck instruments the script)
            raise DetectorSetupFailed(error_text(error)) from error
        cold_reason = cold_start_reason(plugin, argv, command, declared, devices)
        if not cold_reason:
            env.pop("SILENTBENCH_ALARM_KEY", None)  # a warm probe gets it in memory
        preload = context.preload or plugin.preload
        result = run_sandboxed(command, context.cwd or workdir, env, limits, warm=not cold_reason,
                               preload=preload, report_path=report_path,
                               alarm_key="" if cold_reason else alarm_key,
                               probe=PROBE_START if plugin.instruments and not cold_reason else "",
                               devices=device_nodes(devices), python=python)
        members = set(plugin.members(run.detector.config))  # a bundle's: each alarm keeps the member that raised it
        report = parse_report(result.report_text, alarm_key=alarm_key or None,
                              caps=RecordCaps(max_alarms=MAX_ALARMS * max(1, len(members))))
        for alarm in report.alarms:
            alarm["detector"] = alarm["detector"] if alarm["detector"] in members else ""
        failure = program_failure(result, limits)
        if failure is None:
            started = time.monotonic()
            try:
                offline_alarms = plugin.analyze(context, report)
            except RuntimeError as error:
                analysis_error = offline_check_failed(error_text(error))
            analysis_seconds = time.monotonic() - started
            # Only runs of the repository's own detectors add to the cache: a submitted detector's install() and
            # analyze() could plant files there that later runs of other detectors would load (compile_cache).
            if result.sealed and result.exit_code == 0 and not result.ended_after_oracle and not analysis_error \
                    and report.oracle is not None and not report.over_cap and not isinstance(plugin, SubmittedPlugin):
                compiled_files, cache_error = compile_cache.keep(workdir, version)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    kind, reason = "", ""
    if failure is not None:
        kind, reason = failure.kind, failure.reason
    elif analysis_error:
        kind, reason = kind_of(offline_check_failed), analysis_error
    elif report.over_cap:
        kind, reason = kind_of(too_many_records), report.over_cap
    elif report.oracle is None:
        kind, reason = kind_of(no_oracle_report), no_oracle_report()
    if not cold_reason and not result.started_warm:
        cold_reason = "this worker cannot seal runs in namespaces, and warm starts need them"
    execution = {
        "start": "cold" if cold_reason else "warm",
        "cold_reason": cold_reason,
        "zygote": "" if cold_reason else preload.name,
        "layers": result.layers,
        "threads": limits.threads,
        "notes": result.notes + ([forged_alarms_note(report.refused_alarms)] if report.refused_alarms else [])
        + ([f"Some compiled files were not kept for the next runs: {cache_error}"] if cache_error else []),
        "refused_alarms": report.refused_alarms,
        "compile_cache": {"files_in": cached_files, "files_added": compiled_files},
    }
    if python:  # another environment: its name
        execution.update(python_environment=environment.name)
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
        execution=execution,
    )
