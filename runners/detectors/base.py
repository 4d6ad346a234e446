"""What a detector plugin is, the registry of plugins, and the probe that runs one inside a reproducer process."""
import hmac
import importlib
import importlib.util
import json
import os
import pkgutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..executor import Limits, Preload, warm_torch

registered_plugins: dict[str, "DetectorPlugin"] = {}
# What a detector needs from the program it watches (``DetectorPlugin.integration``), and what each label means.
DROP_IN = "drop-in"
OPT_IN = "opt-in"
INTEGRATIONS = {
    DROP_IN: ("observes the unmodified program, and computes any reference it compares with itself (a shadow "
              "recomputation): nothing in the reproducer is written for it"),
    OPT_IN: "needs the program to cooperate, such as computing a reference itself and reporting it (compare records)",
}
ALARM_KEY_ENV = "SILENTBENCH_ALARM_KEY"  # the run's alarm key (hex), for the probe of an instrumented run
# A submitted detector's module, written into the run directory from its stored source (runners.execution) and
# imported only there, inside the sandbox: the path is in this variable, the file has this name.
DETECTOR_MODULE_ENV = "SILENTBENCH_DETECTOR_MODULE"
DETECTOR_MODULE_FILE = ".silentbench-detector.py"
SUBMITTED_MODULE = "runners.detectors.submitted"  # the name it is imported under (relative imports work)
PLUGIN_PACKAGE = __name__.rpartition(".")[0]  # runners.detectors: every module of it but this one is a plugin
_importing_submitted = False  # while a submitted module is imported, ``register`` leaves the registry alone
_loaded = False
PluginClass = TypeVar("PluginClass", bound="type[DetectorPlugin]")


def alarm_mac(key: str, record: dict[str, Any]) -> str:
    """The signature of an alarm ``record`` (without its "mac"): HMAC-SHA256 under ``key`` (hex) of its
    canonical JSON, as hex."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str, allow_nan=True).encode()
    return hmac.new(bytes.fromhex(key), canonical, "sha256").hexdigest()


def register(cls: PluginClass) -> PluginClass:
    """Class decorator: add a detector plugin to the registry under ``cls.name``; its module must say whether it
    is drop-in or opt-in (``integration``)."""
    if _importing_submitted:  # a submitted module: load_submitted_plugin takes its class, the registry never holds it
        return cls
    if cls.name in registered_plugins:
        raise ValueError(f"two detectors are named {cls.name!r}")
    if cls.integration not in INTEGRATIONS:
        raise ValueError(f"detector {cls.name!r} sets integration = {cls.integration!r}; "
                         f"it must be one of {', '.join(map(repr, INTEGRATIONS))}")
    registered_plugins[cls.name] = cls()
    return cls


def all_plugins() -> dict[str, "DetectorPlugin"]:
    """Every registered plugin, by name: every module of the plugin package is imported the first time."""
    global _loaded
    if not _loaded:
        for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
            if module.name != "base":
                importlib.import_module(f"{PLUGIN_PACKAGE}.{module.name}")
        _loaded = True
    return dict(sorted(registered_plugins.items()))


def campaign_plugins() -> dict[str, "DetectorPlugin"]:
    """The registered plugins a campaign, an evaluation or a score may name (``standalone``), by name."""
    return {name: plugin for name, plugin in all_plugins().items() if plugin.standalone}


def get_plugin(name: str) -> "DetectorPlugin":
    plugins = all_plugins()
    if name not in plugins:
        raise KeyError(f"unknown detector {name!r}; registered: {', '.join(plugins)}")
    return plugins[name]


def owned_parameters(optimizer: Any) -> list[Any]:
    """Every parameter an optimizer owns, in the order of its groups."""
    return [param for group in optimizer.param_groups for param in group["params"]]


def preload_probe() -> None:
    """What the zygote of instrumented runs imports (``PROBE_PRELOAD``): torch, warm, and every plugin module, as the
    probe loads them."""
    warm_torch()
    all_plugins()


PROBE_PRELOAD = Preload("torch", f"{__name__}:preload_probe")
PROBE_START = f"{__name__}:start_probe"  # what a warm run calls first to install its detector (runners.executor)


class DetectorPlugin:
    """A detector. Subclasses set the metadata and implement ``install``.

    ``install(probe)`` runs once in every process of an instrumented reproducer (every rank),
    before the reproducer's own code. It observes the program through global hooks and reports
    problems with ``probe.alarm``. ``integration`` says whether the detector works on the
    unmodified program (drop-in) or needs the program to cooperate (opt-in: ``INTEGRATIONS``).
    A detector with ``needs_fit`` also implements ``fit`` (and, when it drives an outside tool,
    ``tool_version``).
    """

    name: str = ""
    version: str = "0"
    description: str = ""
    integration: str = ""  # DROP_IN or OPT_IN (INTEGRATIONS): each plugin's module says which
    default_config: dict[str, Any] = {}
    instruments: bool = True  # False when nothing is injected into the process (plain, or an outer command)
    needs_fit: bool = False  # True: ``fit`` must produce an artifact from clean reference pipelines first
    time_limit_factor: float = 1  # how much longer than the reproducer's own limit an instrumented run may take
    fit_family: str = ""  # detectors of one family share their fit artifacts (default: the plugin's own name)
    fit_config_keys: Sequence[str] = ()  # the config keys that change what ``fit`` learns
    preload: Preload = PROBE_PRELOAD  # what the zygote its runs fork from has imported (runners.executor.Preload)
    # Whether ``manage.py evaluate`` runs it unless told which (the published evaluation must stay within an hour on
    # two cores), and whether ``bin/quickstart`` does (its first matrix must come in minutes): docs/performance.md
    evaluated_by_default: bool = True
    in_quickstart: bool = True
    # Whether its hooks leave the program exactly as it runs without them, so that it can watch one run beside others
    # (a bundle: runners.detectors.bundle). False for a detector that changes what the program does, such as one that
    # swallows an error the program would raise.
    only_observes: bool = True
    # Whether its checks see the same beside other detectors: False for one that leaves alone what others' hooks
    # touch (shadow_eager does not recompute a module that global forward hooks watch)
    blind_beside_others: bool = False
    # Whether a campaign, an evaluation or a score may name it: False for the sensitivity track's bundle, which only
    # manage.py evaluate_sensitivity runs, with the members it names (runners.detectors.bundle)
    standalone: bool = True

    def members(self, config: dict[str, Any]) -> Sequence[str]:
        """The detectors whose alarms a run of this one carries, by name, when it watches for several (a bundle);
        empty for a detector that is only itself."""
        return ()

    def config(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The plugin's ``default_config`` with ``overrides`` (a detector record's config) applied."""
        return {**self.default_config, **(overrides or {})}

    def install(self, probe: "Probe") -> None:
        raise NotImplementedError

    def run_allowance(self, time_limit_seconds: float) -> float:
        """The longest a run may legitimately stay 'running': its time limit under this detector, twice
        over when the detector may fit first. The reaper and the stall watchdog both go by it."""
        return time_limit_seconds * self.time_limit_factor * (2 if self.needs_fit else 1)

    def tool_version(self) -> str:
        """Version of the outside tool the detector drives, if any, as a string ("" when there is none).

        Part of a fit artifact's key (``runners.detector_versions.fitting.ensure_fit``): a new tool version fits
        anew."""
        return ""

    def fit(self, programs: Sequence[tuple[Path, str, list[str]]], workdir: Path, env: dict[str, str], limits: Limits,
            config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Learn from clean reference programs; called by ``runners.detector_versions.fitting.ensure_fit`` when
        ``needs_fit``.

        ``programs`` is a list of ``(directory, entrypoint, args)``, one materialized clean program each
        (args: ``--variant fixed --seed N --steps N``); ``workdir`` a scratch directory removed afterwards;
        ``env`` the scrubbed environment and ``limits`` the sandbox limits to run them with; ``config`` the
        detector's config. Returns ``(content, summary)``: the artifact's text (given to each run as
        ``RunContext.fit_artifact``) and a JSON-serializable dict stored with it. A RuntimeError (or a
        subclass) fails the fit with its message.
        """
        raise NotImplementedError(f"detector {self.name!r} sets needs_fit but does not implement "
                                  f"fit(programs, workdir, env, limits, config)")

    def environment(self, config: dict[str, Any]) -> dict[str, str]:
        """Extra environment variables for the run (an opt-in switch, never a secret)."""
        return {}

    def command(self, argv: list[str], context: "RunContext") -> list[str]:
        """The command that runs the reproducer, ``argv`` itself or another ``[python, script, *args]`` (such
        as TrainCheck's instrumented copy of the script); either starts warm. A RuntimeError fails the run
        with its message."""
        return argv

    def analyze(self, context: "RunContext", report: Any) -> list[dict[str, Any]]:
        """Alarms found after the run (offline checking): a list of alarm dicts as in the report protocol."""
        return []


class Probe:
    """The in-process side of a run: the step counter, alarm reporting and optimizer hooks.

    Step ``i`` is the ``i``-th training iteration, ending with the ``i``-th optimizer step
    (0-based), as the reproducer protocol defines. Alarms are signed with the run's ``alarm_key``: the
    worker refuses alarm records without a valid signature (runners.report).
    """

    max_alarms = 200

    def __init__(self, detector_name: str, config: dict[str, Any], report_path: str | None,
                 alarm_key: str | None = None) -> None:
        self.detector_name = detector_name
        self.config = config
        self.report_path = report_path
        self._alarm_key = alarm_key
        self.step = 0
        self.alarms_sent = 0
        self._step_counts: dict[int, int] = {}
        self._before_step: list[Callable[[Any], object]] = []
        self._after_step: list[Callable[[Any], object]] = []
        self._hooks_installed = False

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return int(os.environ.get("RANK", "0"))

    def alarm(self, rule: str, message: str, evidence: dict[str, Any] | None = None, step: int | None = None) -> None:
        """Report one alarm (capped per process so that a noisy detector cannot flood the report)."""
        if self.alarms_sent >= self.max_alarms:
            return
        self.alarms_sent += 1
        record = json.loads(json.dumps({  # as the report file will hold it: what the worker checks
            "event": "alarm",
            "detector": self.detector_name,
            "step": self.step if step is None else step,
            "rank": self.rank,
            "rule": rule,
            "message": message,
            "evidence": evidence or {},
            "time": time.time(),
        }, default=str))
        if self._alarm_key:
            record["mac"] = alarm_mac(self._alarm_key, record)
        line = json.dumps(record) + "\n"
        if self.report_path:
            with open(self.report_path, "a", encoding="utf-8") as report:
                report.write(line)
        else:
            print(line, end="", flush=True)

    def companion(self, detector_name: str, config: dict[str, Any]) -> "Probe":
        """A probe for another detector watching the same process (a bundle's member): the same report and alarm
        key, its own name on its alarms, its own step count and alarm cap."""
        probe = Probe(detector_name, config, self.report_path, self._alarm_key)
        probe.on_optimizer_step()
        return probe

    def on_optimizer_step(self, before: Callable[[Any], object] | None = None,
                          after: Callable[[Any], object] | None = None) -> None:
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

    def _pre_hook(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for callback in self._before_step:
            callback(optimizer)

    def _post_hook(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for callback in self._after_step:
            callback(optimizer)
        count = self._step_counts.get(id(optimizer), 0) + 1
        self._step_counts[id(optimizer)] = count
        self.step = max(self.step, count)


def load_submitted_plugin(path: str) -> DetectorPlugin:
    """An instance of the one DetectorPlugin subclass that the module at ``path`` (a submitted detector's stored
    source) defines. Called only inside a run's sandbox: the probe of an instrumented run, and the sandboxed
    process of its offline analysis or fit (runners.detector_versions.host). Its ``@register`` does not touch the
    built-in registry, so a submitted version may share a name with what is registered."""
    global _importing_submitted
    spec = importlib.util.spec_from_file_location(SUBMITTED_MODULE, path)
    assert spec is not None and spec.loader is not None  # a file's path (a .py) always has a spec with a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[SUBMITTED_MODULE] = module
    _importing_submitted = True
    try:
        spec.loader.exec_module(module)
    finally:
        _importing_submitted = False
    classes = [value for value in vars(module).values() if isinstance(value, type)
               and issubclass(value, DetectorPlugin) and value.__module__ == SUBMITTED_MODULE]
    if len(classes) != 1:
        raise RuntimeError(f"the detector module defines {len(classes)} DetectorPlugin subclasses, not one")
    return classes[0]()


def start_probe(alarm_key: str | None = None) -> Probe | None:
    """Entry point of the sandbox's ``sitecustomize``: install the detector named in the environment.

    Its alarms are signed with ``alarm_key`` when the caller holds the run's key in memory (a warm-started
    process), else with SILENTBENCH_ALARM_KEY, which is taken out of ``os.environ``. The key goes back into
    the C environment only, for the processes this one starts: in a cold run, ranks launched with
    ``torch.multiprocessing.spawn`` are new interpreters that run this again (in a warm run they fork with
    the probe in place). What a reproducer can still do with it: docs/reproducer-protocol.md.
    """
    inherited = os.environ.pop(ALARM_KEY_ENV, None)
    alarm_key = alarm_key or inherited
    module = os.environ.get(DETECTOR_MODULE_ENV)
    plugin = load_submitted_plugin(module) if module else get_plugin(os.environ["SILENTBENCH_DETECTOR"])
    if not plugin.instruments:
        return None
    if alarm_key:
        os.putenv(ALARM_KEY_ENV, alarm_key)  # the C environment only: os.environ does not show it
    config = json.loads(os.environ.get("SILENTBENCH_DETECTOR_CONFIG") or "{}")
    probe = Probe(plugin.name, plugin.config(config), os.environ.get("SILENTBENCH_REPORT"), alarm_key)
    probe.on_optimizer_step()  # count steps even for detectors that never look at the optimizer
    plugin.install(probe)
    return probe


@dataclass
class RunContext:
    """What a detector's outer command and offline analysis may use; built by the runner for one run.

    ``fit_artifact`` is the text of the detector's fitted artifact (TrainCheck's invariants), when it
    needs one. ``summary`` is filled by the detector and stored with the run (rules deployed, check time).
    ``cwd``: where the command runs, a folder of ``workdir`` that ``command`` may choose (else ``workdir``).
    ``preload``: the zygote a warm run forks from, if ``command`` chooses one (else the plugin's ``preload``).
    """

    workdir: Path
    entrypoint: str
    config: dict[str, Any]
    env: dict[str, str]
    limits: Limits
    fit_artifact: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    cwd: Path | None = None
    preload: Preload | None = None
