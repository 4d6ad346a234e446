"""The benchmark's metric definitions, as pure functions over plain data.

* A buggy run is **detected** when it has an alarm at a step >= its trigger step.
  The alarm must have reached the worker while the program trained (``in_time``).
  Alarms before the trigger step are **false alarms**.
* **Latency**: first qualifying alarm step minus trigger step (steps), and its time minus the
  time at which the trigger step began (seconds).
* **False-positive rate**: clean runs with at least one alarm / clean runs, Wilson 95% interval.

Beyond these, for detectors that alarm on clean programs too (TrainCheck): a buggy run is
**detected beyond its fixed twin** when a qualifying alarm's rule did not also fire on the fixed
run of the same seed, i.e. the detector tells the buggy program from the fixed one.
"""
import math
import statistics
from dataclasses import dataclass

from core.enums import Variant


@dataclass(frozen=True)
class AlarmPoint:
    step: int
    time: float | None = None
    rule: str = ""
    arrival_step: int | None = None  # the step the program had completed when the worker received it (None: offline)


BACKDATING_STEPS = 1  # how far before the step completed on arrival an alarm may be dated (ranks run a step apart)


def in_time(alarm: AlarmPoint, last_step: int | None) -> bool:
    """Whether an alarm can count as a detection: the worker received it while the program trained, before the
    step record of the run's last step, and it is dated at most one step before the step the program had then
    completed. What it says of its own step is the detector's word; when it arrived is the worker's reading of the
    report, which detector code cannot change. An alarm of an offline check (made after the run) counts."""
    if alarm.arrival_step is None:
        return True
    if last_step is not None and alarm.arrival_step >= last_step:
        return False
    return alarm.step >= alarm.arrival_step - BACKDATING_STEPS


@dataclass(frozen=True)
class RunVerdict:
    detected: bool
    false_alarms: int  # alarms that cannot count as a detection: pre-trigger ones, or any on a clean run
    latency_steps: int | None = None
    latency_seconds: float | None = None
    first_rule: str = ""  # the rule of the first qualifying alarm

    @property
    def any_false_alarm(self):
        return self.false_alarms > 0


def judge_run(variant, trigger_step, trigger_time, alarms, last_step=None):
    """Verdict of one run. On a clean (``fixed``) run every alarm is false.

    A buggy run without a trigger step is judged as if the fault were active from step 0. Only alarms received in
    time (``in_time``: ``last_step`` is the run's last step) can count as its detection.
    """
    if variant != Variant.BUGGY:
        return RunVerdict(detected=False, false_alarms=len(alarms))
    trigger = trigger_step or 0
    qualifying = sorted((a for a in alarms if a.step >= trigger and in_time(a, last_step)),
                        key=lambda a: (a.step, a.time or 0))
    false_alarms = sum(1 for a in alarms if a.step < trigger)
    if not qualifying:
        return RunVerdict(detected=False, false_alarms=false_alarms)
    first = qualifying[0]
    seconds = None
    if first.time is not None and trigger_time is not None:
        seconds = max(0.0, first.time - trigger_time)
    return RunVerdict(detected=True, false_alarms=false_alarms,
                      latency_steps=first.step - trigger, latency_seconds=seconds, first_rule=first.rule)


def detected_beyond_clean(trigger_step, alarms, clean_rules, last_step=None):
    """Does a buggy run have a qualifying alarm (at or after its trigger step, in time) whose rule the fixed twin did
    not raise?"""
    trigger = trigger_step or 0
    return any(a.step >= trigger and a.rule not in clean_rules and in_time(a, last_step) for a in alarms)


def wilson_interval(successes, trials, z=1.959964):
    """Wilson score interval for a binomial proportion; (0, 1) when there are no trials."""
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


class Outcome:
    DETECTED = "detected"
    FALSE_ALARM = "false alarm"
    MISSED = "missed"
    NO_DATA = "no data"


def cell_outcome(buggy_runs, detected_runs, false_alarm_runs):
    """The matrix label for (bug, detector). ``false_alarm_runs`` counts buggy runs alarmed only
    before the trigger plus clean runs that alarmed."""
    if buggy_runs == 0:
        return Outcome.NO_DATA
    if detected_runs:
        return Outcome.DETECTED
    if false_alarm_runs:
        return Outcome.FALSE_ALARM
    return Outcome.MISSED
