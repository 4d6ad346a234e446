"""What a detector plugin is, and the probe that runs it inside a reproducer process."""
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

registered_plugins = {}


def register(cls):
    """Class decorator: add a detector plugin to the registry under ``cls.name``."""
    if cls.name in registered_plugins:
        raise ValueError(f"two detectors are named {cls.name!r}")
    registered_plugins[cls.name] = cls()
    return cls


class DetectorPlugin:
    """A detector. Subclasses set the metadata and implement ``install``.

    ``install(probe)`` runs once in every process of an instrumented reproducer (every rank),
    before the reproducer's own code. It observes the unmodified program through global hooks
    and reports problems with ``probe.alarm``. A detector with ``needs_fit`` also implements ``fit``
    (and, when it drives an outside tool, ``tool_version``).
    """

    name = ""
    version = "0"
    description = ""
    default_config = {}
    instruments = True  # False when nothing is injected into the process (plain, or an outer command)
    needs_fit = False  # True: ``fit`` must produce an artifact from clean reference pipelines first
    time_limit_factor = 1  # how much longer than the reproducer's own limit an instrumented run may take
    fit_family = ""  # detectors of one family share their fit artifacts (default: the plugin's own name)
    fit_config_keys = ()  # the config keys that change what ``fit`` learns

    def config(self, overrides=None):
        """The plugin's ``default_config`` with ``overrides`` (a detector record's config) applied."""
        return {**self.default_config, **(overrides or {})}

    def install(self, probe):
        raise NotImplementedError

    def run_allowance(self, time_limit_seconds):
        """The longest a run may legitimately stay 'running': its time limit under this detector, twice
        over when the detector may fit first. The reaper and the stall watchdog both go by it."""
        return time_limit_seconds * self.time_limit_factor * (2 if self.needs_fit else 1)

    def tool_version(self):
        """Version of the outside tool the detector drives, if any, as a string ("" when there is none).

        Part of a fit artifact's key (``runners.fitting.ensure_fit``): a new tool version fits anew."""
        return ""

    def fit(self, programs, workdir, env, limits, config):
        """Learn from clean reference programs; called by ``runners.fitting.ensure_fit`` when ``needs_fit``.

        ``programs`` is a list of ``(directory, entrypoint, args)``, one materialized clean program each
        (args: ``--variant fixed --seed N --steps N``); ``workdir`` a scratch directory removed afterwards;
        ``env`` the scrubbed environment and ``limits`` the sandbox limits to run them with; ``config`` the
        detector's config. Returns ``(content, summary)``: the artifact's text (given to each run as
        ``RunContext.fit_artifact``) and a JSON-serializable dict stored with it. A RuntimeError (or a
        subclass) fails the fit with its message.
        """
        raise NotImplementedError(f"detector {self.name!r} sets needs_fit but does not implement "
                                  f"fit(programs, workdir, env, limits, config)")

    def environment(self, config):
        """Extra environment variables for the run (an opt-in switch, never a secret)."""
        return {}

    def command(self, argv, context):
        """The command that runs the reproducer: an outer tool such as ``traincheck-collect`` wraps ``argv``."""
        return argv

    def analyze(self, context, report):
        """Alarms found after the run (offline checking): a list of alarm dicts as in the report protocol."""
        return []


class Probe:
    """The in-process side of a run: the step counter, alarm reporting and optimizer hooks.

    Step ``i`` is the ``i``-th training iteration, ending with the ``i``-th optimizer step
    (0-based), as the reproducer protocol defines.
    """

    max_alarms = 200

    def __init__(self, detector_name, config, report_path):
        self.detector_name = detector_name
        self.config = config
        self.report_path = report_path
        self.step = 0
        self.alarms_sent = 0
        self._step_counts = {}
        self._before_step = []
        self._after_step = []
        self._hooks_installed = False

    @property
    def rank(self):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return int(os.environ.get("RANK", "0"))

    def alarm(self, rule, message, evidence=None, step=None):
        """Report one alarm (capped per process so that a noisy detector cannot flood the report)."""
        if self.alarms_sent >= self.max_alarms:
            return
        self.alarms_sent += 1
        record = {
            "event": "alarm",
            "detector": self.detector_name,
            "step": self.step if step is None else step,
            "rank": self.rank,
            "rule": rule,
            "message": message,
            "evidence": evidence or {},
            "time": time.time(),
        }
        line = json.dumps(record, default=str) + "\n"
        if self.report_path:
            with open(self.report_path, "a", encoding="utf-8") as report:
                report.write(line)
        else:
            print(line, end="", flush=True)

    def on_optimizer_step(self, before=None, after=None):
        """Call ``before(optimizer)`` / ``after(optimizer)`` around every optimizer step of the process."""
        if before:
            self._before_step.append(before)
        if after:
            self._after_step.append(after)
        if not self._hooks_installed:
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            register_optimizer_step_pre_hook(self._pre_hook)
            register_optimizer_step_post_hook(self._post_hook)
            self._hooks_installed = True

    def _pre_hook(self, optimizer, args, kwargs):
        for callback in self._before_step:
            callback(optimizer)

    def _post_hook(self, optimizer, args, kwargs):
        for callback in self._after_step:
            callback(optimizer)
        count = self._step_counts.get(id(optimizer), 0) + 1
        self._step_counts[id(optimizer)] = count
        self.step = max(self.step, count)


def start_probe():
    """Entry point of the sandbox's ``sitecustomize``: install the detector named in the environment."""
    from . import get_plugin

    plugin = get_plugin(os.environ["SILENTBENCH_DETECTOR"])
    if not plugin.instruments:
        return None
    config = json.loads(os.environ.get("SILENTBENCH_DETECTOR_CONFIG") or "{}")
    probe = Probe(plugin.name, plugin.config(config), os.environ.get("SILENTBENCH_REPORT"))
    probe.on_optimizer_step()  # count steps even for detectors that never look at the optimizer
    plugin.install(probe)
    return probe


@dataclass
class RunContext:
    """What a detector's outer command and offline analysis may use; built by the runner for one run.

    ``fit_artifact`` is the text of the detector's fitted artifact (TrainCheck's invariants), when it
    needs one. ``summary`` is filled by the detector and stored with the run (rules deployed, check time).
    """

    workdir: Path
    entrypoint: str
    config: dict
    env: dict
    limits: object
    fit_artifact: str | None = None
    summary: dict = field(default_factory=dict)
