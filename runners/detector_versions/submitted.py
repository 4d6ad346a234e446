"""A submitted detector in the worker: a stand-in that knows the plugin only from its stored ``interface`` (read
from the module's syntax tree at submission, runners.detector_versions.submissions) and never imports its code.

Where the code runs, each time inside a sandbox sealed like the run itself (runners.executor):
- the probe (``install``): in the reproducer's own process, imported from the run directory, where the executor
  writes the stored source (runners.execution, ``DETECTOR_MODULE_ENV``);
- ``analyze`` and ``fit``: in a sandboxed process of their own (runners/detector_versions/host.py), started cold with
  ``python -I``, which reads a JSON request and writes its answer as JSON; the worker checks that answer
  (``checked_alarms``) and never unpickles anything. ``analyze`` is not told the answer it is scored against:
  its report leaves out the oracle, the variant and the seed (``detector_report``), and the run directory no
  longer holds the report file. In the probe, nothing stops the code from reading ``sys.argv``: the
  maintainers' review does (docs/writing-a-detector.md, "Review").
"""
import dataclasses
import json
import math
import secrets
import shutil
import sys
from pathlib import Path

from core.untrusted import storage_problem

from ..detectors.base import ALARM_KEY_ENV, DETECTOR_MODULE_FILE, PROBE_PRELOAD, DetectorPlugin
from ..executor import run_sandboxed
from ..failures import program_failure
from ..report import json_safe

HOST_SCRIPT = Path(__file__).resolve().parent / "host.py"
HOOK_FOLDER_PREFIX = ".silentbench-hook-"
MAX_RESULT_BYTES = 16 * 1024 * 1024  # what a hook may answer (a fit artifact included)
MAX_OFFLINE_ALARMS = 500
MAX_EVIDENCE_BYTES = 64 * 1024
MAX_MESSAGE_CHARACTERS = 10_000
MAX_RULE_CHARACTERS = 200  # Alarm.rule's column
MAX_STORED_INTEGER = 2**31 - 1
MAX_SUMMARY_BYTES = 64 * 1024
# What a submitted ``analyze`` sees of the run's start record: never the variant or the seed, which name the answer.
START_FIELDS = ("time", "steps", "world_size")
PROBE_ENV = {ALARM_KEY_ENV, "PYTHONPATH"}  # what loads the probe and signs its alarms: not for the offline hooks


class SubmittedHookError(RuntimeError):
    """A submitted detector's sandboxed hook failed or answered something the worker does not accept."""


class SubmittedPlugin(DetectorPlugin):
    """The worker's view of one submitted DetectorVersion: metadata from its interface; hooks in a sandbox."""

    def __init__(self, detector_version):
        interface = detector_version.interface
        self.detector_version = detector_version
        self.name, self.version = detector_version.name, detector_version.version
        self.description = detector_version.description
        self.integration = interface["integration"]
        self.default_config = interface.get("default_config", {})
        self.instruments = interface.get("instruments", True)
        self.needs_fit = interface.get("needs_fit", False)
        self.time_limit_factor = interface.get("time_limit_factor", 1)
        self.fit_config_keys = tuple(interface.get("fit_config_keys", ()))
        self.has_analyze = interface.get("analyze", False)

    def install(self, probe):
        raise RuntimeError("a submitted detector's probe runs only inside its run's sandbox")

    def write_module(self, folder):
        """Write the stored source into ``folder`` (a run directory): the only way the code reaches a process."""
        path = Path(folder) / DETECTOR_MODULE_FILE
        path.write_text(self.detector_version.code, encoding="utf-8")
        return path

    def analyze(self, context, report):
        if not self.has_analyze:
            return []
        # The report file in the run directory holds the oracle's record: gone before the hook starts, like its path.
        Path(context.env["SILENTBENCH_REPORT"]).unlink(missing_ok=True)
        env = {name: value for name, value in context.env.items() if name != "SILENTBENCH_REPORT"}
        answer = self._run_hook("analyze", context.workdir, env, context.limits, {
            "context": {"workdir": str(context.workdir), "entrypoint": context.entrypoint, "config": context.config,
                        "fit_artifact": context.fit_artifact},
            "report": detector_report(report)})
        context.summary.update(checked_summary(answer.get("summary")))
        return checked_alarms(answer.get("alarms"))

    def fit(self, programs, workdir, env, limits, config):
        answer = self._run_hook("fit", workdir, env, limits, {
            "workdir": str(workdir), "config": config,
            "programs": [[str(directory), entrypoint, list(args)] for directory, entrypoint, args in programs]})
        content = answer.get("content")
        if not isinstance(content, str):
            raise SubmittedHookError("fit() must return (content, summary) with content a str")
        return content, checked_summary(answer.get("summary"))

    def _run_hook(self, hook, workdir, env, limits, request):
        """Run ``hook`` of the stored module in a sandboxed process in ``workdir`` and return its JSON answer. The
        module and the request go into a folder of a name nobody can guess, written afresh: whatever the run left
        in its directory cannot stand in for them."""
        folder = Path(workdir) / f"{HOOK_FOLDER_PREFIX}{secrets.token_hex(8)}"
        folder.mkdir()
        try:
            result_path = folder / "answer.json"
            hook_env = {name: value for name, value in env.items() if name not in PROBE_ENV
                        and not name.startswith("SILENTBENCH_DETECTOR")}  # no probe, no alarm key
            request = {**request, "hook": hook, "module": str(self.write_module(folder)), "answer": str(result_path),
                       "limits": dataclasses.asdict(limits), "env": hook_env}
            (folder / "request.json").write_text(json.dumps(request, default=str), encoding="utf-8")
            result = run_sandboxed([sys.executable, "-I", str(HOST_SCRIPT), str(folder / "request.json")],
                                   Path(workdir), hook_env, limits, warm=False, preload=PROBE_PRELOAD)
            failure = program_failure(result, limits)
            if failure is not None:
                where = "" if result.refused else f"{hook}() in its sandbox: "
                raise SubmittedHookError(where + failure.reason)
            try:
                with open(result_path, "rb") as answer_file:
                    data = answer_file.read(MAX_RESULT_BYTES + 1)
            except OSError as error:
                raise SubmittedHookError(f"{hook}() left no answer ({error.strerror})") from error
            if len(data) > MAX_RESULT_BYTES:
                raise SubmittedHookError(f"{hook}() answered more than {MAX_RESULT_BYTES} bytes")
            try:
                answer = json.loads(data)
            except (ValueError, RecursionError) as error:
                raise SubmittedHookError(f"{hook}() answered something that is not JSON ({error})") from error
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not isinstance(answer, dict):
            raise SubmittedHookError(f"{hook}() answered something that is not a JSON object")
        if "error" in answer:
            raise SubmittedHookError(f"{hook}() raised: {str(answer['error'])[-2000:]}")
        return answer


def detector_report(report):
    """What a submitted ``analyze`` gets of the run's ParsedReport: the program's step records (losses, metrics),
    its compare records and the probe's own alarms, and of its start record only ``START_FIELDS``. Never the
    oracle's verdict or trigger step, nor the variant or the seed: they are what the detector is scored against."""
    start = report.start or {}
    return {"start": {name: start[name] for name in START_FIELDS if name in start}, "steps": report.steps,
            "alarms": report.alarms, "comparisons": report.comparisons}


def _whole(value, low, high):
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def checked_summary(summary):
    summary = json_safe(summary if summary is not None else {})
    if not isinstance(summary, dict) or storage_problem(summary) or \
            len(json.dumps(summary).encode()) > MAX_SUMMARY_BYTES:
        raise SubmittedHookError(f"the detector's summary must be a JSON object of at most {MAX_SUMMARY_BYTES} bytes")
    return summary


def checked_alarms(alarms):
    """The alarms a sandboxed ``analyze`` answered, as Alarm rows take them, or SubmittedHookError saying which
    one is wrong: a list of at most ``MAX_OFFLINE_ALARMS`` dicts with a whole ``step`` (-1 for before training),
    ``rank``, a ``rule`` and a ``message``, JSON ``evidence`` and a Unix ``time``."""
    if not isinstance(alarms, list):
        raise SubmittedHookError("analyze() must return a list of alarm dicts")
    if len(alarms) > MAX_OFFLINE_ALARMS:
        raise SubmittedHookError(f"analyze() returned {len(alarms)} alarms, more than {MAX_OFFLINE_ALARMS}")
    checked = []
    for index, alarm in enumerate(alarms):
        where = f"analyze() alarm {index}"
        if not isinstance(alarm, dict):
            raise SubmittedHookError(f"{where} is not a dict")
        step, rank = alarm.get("step"), alarm.get("rank", 0)
        rule, message = alarm.get("rule"), alarm.get("message", "")
        evidence, time = json_safe(alarm.get("evidence") or {}), alarm.get("time")
        if not _whole(step, -1, MAX_STORED_INTEGER) or not _whole(rank, 0, MAX_STORED_INTEGER):
            raise SubmittedHookError(f"{where}: step and rank must be whole numbers (step -1 or more, rank 0 or more)")
        if not isinstance(rule, str) or not 0 < len(rule) <= MAX_RULE_CHARACTERS or storage_problem(rule):
            raise SubmittedHookError(f"{where}: rule must be text of 1 to {MAX_RULE_CHARACTERS} characters")
        if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARACTERS or storage_problem(message):
            raise SubmittedHookError(f"{where}: message must be text of at most {MAX_MESSAGE_CHARACTERS} characters")
        if not isinstance(evidence, dict) or storage_problem(evidence) or \
                len(json.dumps(evidence).encode()) > MAX_EVIDENCE_BYTES:
            raise SubmittedHookError(f"{where}: evidence must be a JSON object of at most {MAX_EVIDENCE_BYTES} bytes")
        if time is not None and (isinstance(time, bool) or not isinstance(time, (int, float))
                                 or not math.isfinite(time)):
            raise SubmittedHookError(f"{where}: time must be a Unix time or null")
        checked.append({"step": step, "rank": rank, "rule": rule, "message": message, "evidence": evidence,
                        "time": time})
    return checked
