"""Several detectors watching one run together: the sensitivity track's way of scoring many drop-in observers within
its time budget (docs/performance.md).

Each member installs in the same process as it would alone, with a probe of its own (runners.detectors.base,
``Probe.companion``), in the order given; its alarms name it, and the worker stores that name with each alarm
(``Alarm.detector``). Only a detector that ``only_observes`` may be a member: one run then shows each member what a
run of its own would, which tests/test_bundle.py checks alarm for alarm, and ``manage.py evaluate_sensitivity
--apart`` measures on any slice.
"""
from .base import DROP_IN, PROBE_PRELOAD, DetectorPlugin, get_plugin, register


def bundling_refusal(plugin):
    """Why ``plugin`` cannot be a bundle's member, or "" when it can."""
    if plugin.name == Bundle.name:
        return "a bundle cannot hold a bundle"
    if not plugin.instruments or type(plugin).command is not DetectorPlugin.command \
            or type(plugin).analyze is not DetectorPlugin.analyze:
        return "it does not watch the program from inside the process (an outer command or an offline check)"
    if plugin.needs_fit:
        return "it fits before it runs"
    if type(plugin).environment is not DetectorPlugin.environment or plugin.preload != PROBE_PRELOAD \
            or plugin.time_limit_factor != 1:
        return "its runs are set up for it alone (an environment, a zygote or a time limit of its own)"
    if not plugin.only_observes:
        return "it changes what the program does, so the others would watch another program"
    if plugin.blind_beside_others:
        return "it leaves unchecked what other detectors' hooks touch, so beside them it would see less"
    return ""


def members_of(name, config):
    """The members a recorded detector (its name and config) watched with: a bundle's, else none."""
    return Bundle().members(config or {}) if name == Bundle.name else []


@register
class Bundle(DetectorPlugin):
    """Its members, installed side by side in one process; it raises nothing itself."""

    name = "bundle"
    version = "1"
    integration = DROP_IN
    description = ("Runs several drop-in detectors that only observe in one process, each with its own probe, so that "
                   "one run gives each of them the alarms a run of its own would. The sensitivity track scores its "
                   "observers this way; it is never ranked itself.")
    default_config = {"detectors": [], "code": {}}  # code: each member's code hash, as the run's record of it
    evaluated_by_default = False
    in_quickstart = False
    standalone = False

    def members(self, config):
        return list(config.get("detectors") or ())

    def install(self, probe):
        for name in self.members(probe.config):
            member = get_plugin(name)
            refusal = bundling_refusal(member)
            if refusal:
                raise RuntimeError(f"detector {name!r} cannot watch a run in a bundle: {refusal}")
            member.install(probe.companion(name, member.config()))
